package raftengine

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/internal/pagecache"
)

// snapshotStore is raft's file snapshot store (its directory layout, List and reaping)
// with snapshots written and read here:
//   - written with a CRC-32C (hardware-assisted, about 3x the speed of raft's CRC-64 here)
//     and, once written and synced, giving their page-cache pages back
//     (internal/pagecache): a group's snapshot holds all of its hot bytes (every byte of
//     its streams without a cold tier, as in a cluster by default), and the snapshots that
//     keep the journal under its budget rewrite them each time; a snapshot is read again
//     only to restore a replica or to send it to a follower;
//   - read once (Open), checking the checksum as it goes: CRC-32C, or raft's CRC-64 for a
//     snapshot an earlier build wrote. A build before CRC-32C cannot open the snapshots
//     written here (a downgrade starts from an older snapshot raft still keeps, or fails).
//   - a snapshot left half-written by a crash (its .tmp directory, which raft skips and
//     never removes: up to a whole group's bytes) is removed when the store opens.
type snapshotStore struct {
	*raft.FileSnapshotStore
	dir string // the store's base: snapshots live in dir/snapshots/{id}/state.bin
}

const tmpSnapshotSuffix = ".tmp" // raft's mark of a snapshot being written

func newSnapshotStore(dir string, retain int, logOutput io.Writer) (*snapshotStore, error) {
	s, err := raft.NewFileSnapshotStore(dir, retain, logOutput)
	if err != nil {
		return nil, err
	}
	// Nothing writes a snapshot before the store is open: any .tmp is a crash's leftover.
	tmps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*"+tmpSnapshotSuffix))
	for _, t := range tmps {
		if err := os.RemoveAll(t); err != nil {
			return nil, fmt.Errorf("raftengine: removing the unfinished snapshot %s: %w", t, err)
		}
	}
	return &snapshotStore{FileSnapshotStore: s, dir: dir}, nil
}

// snapshotMeta is a snapshot's meta.json as raft's file store reads it (List): the
// metadata, with the checksum of state.bin: CRC32C (big-endian) in snapshots written
// here, CRC (CRC-64 ECMA) in those of raft's own sink.
type snapshotMeta struct {
	raft.SnapshotMeta
	CRC    []byte `json:",omitempty"`
	CRC32C []byte `json:",omitempty"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Create starts a snapshot as raft's file store does (same directory name, a .tmp
// directory renamed into place on Close), with CRC-32C. Peers (raft's pre-version-1
// membership encoding) stays empty: raft reads Configuration from version 1 on.
func (s *snapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	if version != 1 {
		return nil, fmt.Errorf("raftengine: unsupported snapshot version %d", version)
	}
	name := fmt.Sprintf("%d-%d-%d", term, index, time.Now().UnixMilli())
	parent := filepath.Join(s.dir, "snapshots")
	dir := filepath.Join(parent, name+tmpSnapshotSuffix)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, "state.bin"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &snapshotSink{store: s, dir: dir, parent: parent, f: f, w: bufio.NewWriterSize(f, 1<<20),
		crc: crc32.New(castagnoli), meta: snapshotMeta{SnapshotMeta: raft.SnapshotMeta{Version: version, ID: name,
			Index: index, Term: term, Configuration: configuration, ConfigurationIndex: configurationIndex}}}, nil
}

// snapshotSink writes one snapshot's state.bin, hashing it as it goes.
type snapshotSink struct {
	store       *snapshotStore
	dir, parent string // the .tmp directory, and snapshots/
	f           *os.File
	w           *bufio.Writer
	crc         hash.Hash32
	meta        snapshotMeta
	closed      bool
}

func (k *snapshotSink) ID() string { return k.meta.ID }

func (k *snapshotSink) Write(p []byte) (int, error) {
	k.crc.Write(p)
	return k.w.Write(p)
}

// Close syncs state.bin, writes and syncs meta.json, renames the directory into place,
// syncs its parent, reaps snapshots beyond the retained count and drops the snapshot's
// pages from the page cache. On failure nothing of it stays.
func (k *snapshotSink) Close() error {
	if k.closed {
		return nil
	}
	k.closed = true
	if err := k.finish(); err != nil {
		os.RemoveAll(k.dir)
		return err
	}
	final := strings.TrimSuffix(k.dir, tmpSnapshotSuffix)
	if err := os.Rename(k.dir, final); err != nil {
		os.RemoveAll(k.dir)
		return err
	}
	if err := syncDir(k.parent); err != nil {
		return err
	}
	pagecache.DropPath(filepath.Join(final, "state.bin"))
	return k.store.ReapSnapshots()
}

func (k *snapshotSink) finish() error {
	err := k.w.Flush()
	if err == nil {
		err = k.f.Sync()
	}
	var size int64
	if err == nil {
		var fi os.FileInfo
		if fi, err = k.f.Stat(); err == nil {
			size = fi.Size()
		}
	}
	if cerr := k.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	k.meta.Size = size
	k.meta.CRC32C = k.crc.Sum(nil)
	b, err := json.Marshal(&k.meta)
	if err != nil {
		return err
	}
	mf, err := os.Create(filepath.Join(k.dir, "meta.json"))
	if err != nil {
		return err
	}
	_, err = mf.Write(append(b, '\n'))
	if err == nil {
		err = mf.Sync()
	}
	if cerr := mf.Close(); err == nil {
		err = cerr
	}
	return err
}

// Cancel drops the snapshot.
func (k *snapshotSink) Cancel() error {
	if k.closed {
		return nil
	}
	k.closed = true
	k.f.Close()
	return os.RemoveAll(k.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Open reads a snapshot once. raft's file store reads the whole state file to check its
// CRC before handing out a reader that reads it all again; on a node whose snapshots
// carry gigabytes that second pass is a large part of a restart (the snapshot's pages
// were given back when it was written, so both come from the disk). The reader here
// checks the checksum as it goes and keeps the final chunk back until it matches, so
// neither a restore nor a follower fed from it can see every byte of a damaged snapshot.
func (s *snapshotStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	dir := filepath.Join(s.dir, "snapshots", id)
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, nil, err
	}
	var meta snapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, nil, fmt.Errorf("snapshot %s: meta.json: %w", id, err)
	}
	var h hash.Hash
	var want []byte
	switch {
	case len(meta.CRC32C) > 0:
		h, want = crc32.New(castagnoli), meta.CRC32C
	case len(meta.CRC) > 0:
		h, want = crc64.New(crc64.MakeTable(crc64.ECMA)), meta.CRC
	default:
		return nil, nil, fmt.Errorf("snapshot %s: meta.json has no checksum", id)
	}
	f, err := os.Open(filepath.Join(dir, "state.bin"))
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return &meta.SnapshotMeta, &verifiedReader{f: f, id: id, want: want, left: fi.Size(), sum: h}, nil
}

// verifiedReader reads a snapshot's state file, hashing what it reads; the read that
// reaches the file's end returns its bytes only if the CRC matches meta.json's.
type verifiedReader struct {
	f    *os.File
	id   string
	want []byte
	left int64 // bytes of the file not read yet
	sum  hash.Hash
	err  error // sticky: the CRC mismatch, once found
}

func (r *verifiedReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := io.ReadFull(r.f, p)
	r.sum.Write(p[:n])
	r.left -= int64(n)
	if err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			err = fmt.Errorf("snapshot %s: state.bin ended %d bytes early", r.id, r.left)
		}
		r.err = err
		return 0, err
	}
	if r.left == 0 {
		if got := r.sum.Sum(nil); !bytes.Equal(got, r.want) {
			r.err = fmt.Errorf("snapshot %s: checksum mismatch (state.bin %x, meta.json %x)", r.id, got, r.want)
			return 0, r.err
		}
	}
	return n, nil
}

func (r *verifiedReader) Close() error { return r.f.Close() }
