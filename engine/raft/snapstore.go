package raftengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/internal/pagecache"
)

// snapshotStore is raft's file snapshot store whose snapshots, once written and synced,
// give their page-cache pages back (internal/pagecache): a group's snapshot holds all of
// its hot bytes (every byte of its streams without a cold tier, as in a cluster by
// default), and the snapshots that keep the journal under its budget rewrite them each
// time. A snapshot is read again only to restore a replica or to send it to a follower.
type snapshotStore struct {
	*raft.FileSnapshotStore
	dir string // the store's base: snapshots live in dir/snapshots/{id}/state.bin
}

func newSnapshotStore(dir string, retain int, logOutput io.Writer) (*snapshotStore, error) {
	s, err := raft.NewFileSnapshotStore(dir, retain, logOutput)
	if err != nil {
		return nil, err
	}
	return &snapshotStore{FileSnapshotStore: s, dir: dir}, nil
}

func (s *snapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.FileSnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		return nil, err
	}
	return &snapshotSink{SnapshotSink: sink, dir: s.dir}, nil
}

type snapshotSink struct {
	raft.SnapshotSink
	dir string
}

// Close finishes the snapshot (raft's sink syncs it) and drops its pages.
func (k *snapshotSink) Close() error {
	if err := k.SnapshotSink.Close(); err != nil {
		return err
	}
	pagecache.DropPath(filepath.Join(k.dir, "snapshots", k.ID(), "state.bin"))
	return nil
}

// snapshotMeta is what raft's file store writes to a snapshot's meta.json: the metadata
// and the CRC-64 (ECMA) of state.bin.
type snapshotMeta struct {
	raft.SnapshotMeta
	CRC []byte
}

// Open reads a snapshot once. raft's file store reads the whole state file to check its
// CRC before handing out a reader that reads it all again; on a node whose snapshots
// carry gigabytes that second pass is a large part of a restart (the snapshot's pages
// were given back when it was written, so both come from the disk). The reader here
// checks the CRC as it goes and keeps the final chunk back until it matches, so neither
// a restore nor a follower fed from it can see every byte of a damaged snapshot.
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
	f, err := os.Open(filepath.Join(dir, "state.bin"))
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return &meta.SnapshotMeta, &verifiedReader{f: f, id: id, want: meta.CRC, left: fi.Size(),
		crc: crc64.New(crc64.MakeTable(crc64.ECMA))}, nil
}

// verifiedReader reads a snapshot's state file, hashing what it reads; the read that
// reaches the file's end returns its bytes only if the CRC matches meta.json's.
type verifiedReader struct {
	f    *os.File
	id   string
	want []byte
	left int64 // bytes of the file not read yet
	crc  hash.Hash64
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
	r.crc.Write(p[:n])
	r.left -= int64(n)
	if err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			err = fmt.Errorf("snapshot %s: state.bin ended %d bytes early", r.id, r.left)
		}
		r.err = err
		return 0, err
	}
	if r.left == 0 {
		if got := r.crc.Sum(nil); !bytes.Equal(got, r.want) {
			r.err = fmt.Errorf("snapshot %s: CRC mismatch (state.bin %x, meta.json %x)", r.id, got, r.want)
			return 0, r.err
		}
	}
	return n, nil
}

func (r *verifiedReader) Close() error { return r.f.Close() }
