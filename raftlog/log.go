package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// FsyncMode says when appended log entries reach stable storage.
type FsyncMode int

const (
	// FsyncNever acknowledges an append once it is written to the file (page
	// cache): it survives a process crash, not a host crash.
	FsyncNever FsyncMode = iota
	// FsyncAlways acknowledges an append only after fsync.
	FsyncAlways
)

// ParseFsyncMode parses the config value of raft.wal.fsync.
func ParseFsyncMode(s string) (FsyncMode, error) {
	switch s {
	case "never":
		return FsyncNever, nil
	case "always":
		return FsyncAlways, nil
	}
	return 0, fmt.Errorf("raftlog: fsync mode %q: want never or always", s)
}

func (m FsyncMode) String() string {
	switch m {
	case FsyncNever:
		return "never"
	case FsyncAlways:
		return "always"
	}
	return "FsyncMode(" + strconv.Itoa(int(m)) + ")"
}

// DefaultSegmentBytes is the segment size when Options.SegmentBytes is 0.
const DefaultSegmentBytes = 64 << 20

const (
	minSegmentBytes = 4 << 10
	maxSegmentBytes = 1 << 30
)

// Options configure Open.
type Options struct {
	Fsync FsyncMode
	// SegmentBytes is the size at which the active segment is sealed and a
	// new one started; it is also the unit of disk reclaim. 0 means
	// DefaultSegmentBytes; valid range 4 KiB .. 1 GiB.
	SegmentBytes int64
	// Logf receives recovery reports (what was cut and why). nil means log.Printf.
	Logf func(format string, args ...any)
	// Guard learns of ENOSPC, and tells when space is back to restore the reserve. nil:
	// ENOSPC still leaves the journal usable, but nobody stops the writers.
	Guard *DiskGuard

	// noPrepare turns prepared segments off (tests that read segment 1's bytes).
	noPrepare bool
}

// ErrClosed is returned by every operation after Close.
var ErrClosed = errors.New("raftlog: closed")

// ErrCorrupt is wrapped by Open when the journal is damaged somewhere it
// cannot be safely cut (a sealed segment, or the middle of the last one).
var ErrCorrupt = errors.New("raftlog: corrupt journal")

// Stats is a point-in-time view of the journal, for metrics and tests.
type Stats struct {
	Segments      int    // segment files on disk
	Bytes         int64  // total bytes of all segments
	ActiveSegment uint64 // id of the segment being appended to
	Groups        int    // groups known (ever referenced)
	LiveEntries   int64  // entries currently indexed, all groups
	// OldestSegmentPinnedBy is a group holding an entry in the oldest
	// segment (the reason it is not yet purged); 0 with a single segment.
	OldestSegmentPinnedBy uint64

	Writes         uint64 // write(2) calls of batches since Open
	Fsyncs         uint64 // fsync calls since Open
	Records        uint64 // records appended since Open
	Requests       uint64 // store/delete/set calls served since Open
	PurgedSegments uint64 // segment files deleted since Open
	// CopiedEntries were rewritten into the active segment so that small
	// quiet groups stop pinning old segments (see copyForward).
	CopiedEntries uint64

	RecoveredSegments int
	RecoveredRecords  int64
	RecoveredEntries  int64 // live entries after replay
	RecoveryDuration  time.Duration
	// TailDamage is "" after a clean recovery, "torn" when the last segment
	// ended in an incomplete frame, "corrupt" when a complete frame there
	// failed verification. TruncatedBytes were cut away in either case.
	TailDamage     string
	TruncatedBytes int64
	// CleanShutdown says the previous process closed the journal with Close
	// (or the directory was new). false means it crashed or was killed: with
	// FsyncNever, recent acknowledged appends may be gone after a host crash.
	CleanShutdown bool
	// SideWrites are stable writes that went to the stable side file because the journal
	// could not take them (since Open).
	SideWrites uint64
	// StableSideApplied: recovery found stable values in the side file newer than (part
	// of) the journal's.
	StableSideApplied bool
}

// loc is where one encoded entry lives. 12 bytes per indexed entry.
type loc struct {
	seg uint32
	off uint32
	n   uint32
}

type segment struct {
	id   uint64
	f    *os.File
	size int64
	// flushedTo is where startWriteback last stopped (flusher only).
	flushedTo int64
	// base is the size right after the header and stable checkpoint: a
	// segment is only sealed once it holds more than that, so a checkpoint
	// bigger than SegmentBytes cannot make the journal roll forever.
	base int64
	// zeroTail: the file runs on in zeros after size (a prepared segment, prealloc.go).
	zeroTail bool
}

// Log is the node-wide journal. Its methods and those of its GroupStores are
// safe for concurrent use.
type Log struct {
	dir    string
	opt    Options
	logf   func(string, ...any)
	lockF  *os.File
	segMax int64
	prep   *preparer // FsyncAlways: the next segment, zero-filled ahead (prealloc.go)
	// openSeg is the segment active when Open returned: under FsyncAlways the journal
	// leaves it for a prepared one as soon as that is ready (prealloc.go).
	openSeg uint64

	groupsMu sync.RWMutex
	groups   map[uint64]*groupState

	segMu sync.RWMutex // guards segs (readers pread under RLock)
	segs  map[uint64]*segment

	// Queue of requests for the flusher.
	qmu   sync.Mutex
	qcond *sync.Cond
	queue []*request
	// idleBatch is the slice a caller of submit that writes for itself reuses (only
	// one does at a time: it holds writing).
	idleBatch []*request
	// companyAt is when a write last had company (more than one request, or requests
	// queued during it): for busyWindow after it, a caller that finds the journal idle
	// yields before writing.
	companyAt time.Time
	writing   bool // a writer (the flusher, or a caller of submit) owns the fields below
	closing   bool
	failed    error // sticky: a write or fsync error ends the journal (not ENOSPC)
	done      chan struct{}

	reap   chan []*segment // purged segments for the reaper, oldest first
	reaped chan struct{}   // closed when the reaper has finished

	// Owned by the writer: whoever set writing (and by Open before the flusher starts).
	active    *segment
	batch     []byte
	pending   []pendingFrame
	needPurge bool
	unsynced  bool        // bytes were written to the active segment since its last fsync
	rolled    bool        // a segment was sealed in this batch: try copyForward
	compacted bool        // a prefix delete was applied in this batch: see activeMostlyDead
	wroteSome bool        // a part of the current batch reached the file (no retry then)
	reserved  bool        // the reserve file is in place
	side      *stableSide // the stable side file; nil when it could not be created
	sideSlot  *stableSlot // the side file's newest slot until recovery applied it
	reserveAt time.Time

	// fault, when set (tests), is asked before each segment write and fsync and
	// fails it with the error it returns ("write", "fsync").
	fault atomic.Pointer[func(op string) error]

	stats struct {
		writes, fsyncs, records, requests, purged, copied atomic.Uint64
		sideWrites                                        atomic.Uint64
		queuedPurge                                       atomic.Uint64 // segments handed to the reaper
	}
	recovery Stats
}

type pendingFrame struct {
	seg *segment
	off int64 // offset of the frame in its segment
	pos int   // offset of the frame in l.batch
	n   int
}

// request is one call submitted to the flusher: one or more unsealed frames.
type request struct {
	buf    []byte
	sync   bool
	stable bool // a Set: must not fail (see writeStableSide)
	err    error
	done   chan struct{}
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

// Open opens or creates the journal in dir and replays it.
func Open(dir string, opt Options) (*Log, error) {
	if opt.SegmentBytes == 0 {
		opt.SegmentBytes = DefaultSegmentBytes
	}
	if opt.SegmentBytes < minSegmentBytes || opt.SegmentBytes > maxSegmentBytes {
		return nil, fmt.Errorf("raftlog: segment size %d outside %d..%d", opt.SegmentBytes, minSegmentBytes, maxSegmentBytes)
	}
	if opt.Fsync != FsyncNever && opt.Fsync != FsyncAlways {
		return nil, fmt.Errorf("raftlog: invalid fsync mode %d", opt.Fsync)
	}
	l := &Log{
		dir:    dir,
		opt:    opt,
		logf:   opt.Logf,
		segMax: opt.SegmentBytes,
		groups: make(map[uint64]*groupState),
		segs:   make(map[uint64]*segment),
		done:   make(chan struct{}),
		reap:   make(chan []*segment, 64),
		reaped: make(chan struct{}),
	}
	if l.logf == nil {
		l.logf = log.Printf
	}
	l.qcond = sync.NewCond(&l.qmu)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	if err := lockDir(lf, dir); err != nil {
		lf.Close()
		return nil, err
	}
	l.lockF = lf
	start := time.Now()
	side, slot, err := openStableSide(dir, l.logf)
	if err != nil {
		l.closeFiles()
		return nil, err
	}
	l.side, l.sideSlot = side, slot
	os.Remove(filepath.Join(dir, preallocName)) // a preparation cut short by a stop or crash
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	if err := l.settleSide(slot); err != nil {
		l.closeFiles()
		return nil, err
	}
	l.recovery.RecoveryDuration = time.Since(start)
	go l.reaper()
	err = l.syncActive() // a killed predecessor may have left unsynced data
	if err == nil {
		err = l.purge()
	}
	if err != nil {
		close(l.reap)
		<-l.reaped
		l.closeFiles()
		return nil, err
	}
	l.reserved = makeReserve(dir)
	if opt.Fsync == FsyncAlways && !opt.noPrepare {
		l.prep = &preparer{size: l.segMax, dir: dir, logf: l.logf, guard: opt.Guard}
		l.openSeg = l.active.id
		l.prep.kick()
	}
	go l.flusher()
	return l, nil
}

// isNoSpace reports a full disk: the journal stays usable (nothing of the failed batch
// was applied), and writes are stopped upstream until space returns.
func isNoSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) }

func segName(id uint64) string { return fmt.Sprintf("%020d.seg", id) }

func (l *Log) listSegments() ([]uint64, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	var ids []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(name, 10, 64)
		if err != nil || segName(id) != e.Name() || id == 0 {
			return nil, fmt.Errorf("raftlog: unexpected file %s in %s", e.Name(), l.dir)
		}
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

// recover replays every segment in order and leaves the last one open for
// appending (or creates segment 1 in an empty directory).
func (l *Log) recover() error {
	ids, err := l.listSegments()
	if err != nil {
		return err
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] != ids[i-1]+1 {
			return fmt.Errorf("%w: segment %s is missing (have %s and %s)", ErrCorrupt, segName(ids[i-1]+1), segName(ids[i-1]), segName(ids[i]))
		}
	}
	if len(ids) > 0 && ids[len(ids)-1] > 1<<32-1 {
		return fmt.Errorf("raftlog: segment id %d exceeds 2^32-1", ids[len(ids)-1])
	}
	var rb replayBuf
	for i, id := range ids {
		last := i == len(ids)-1
		flag := os.O_RDONLY
		if last {
			flag = os.O_RDWR
		}
		f, err := os.OpenFile(filepath.Join(l.dir, segName(id)), flag, 0)
		if err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
		seg := &segment{id: id, f: f}
		l.segs[id] = seg
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
		size := fi.Size()
		if size > 1<<32-1 {
			return fmt.Errorf("%w: segment %s is %d bytes", ErrCorrupt, segName(id), size)
		}
		end, derr := l.replaySegment(seg, f, size, &rb)
		seg.size, seg.base = end, segHeaderSize
		l.recovery.RecoveredSegments++
		if derr == nil {
			continue
		}
		var verr *VersionError
		if errors.As(derr, &verr) {
			return fmt.Errorf("%s: %w", segName(id), derr)
		}
		var rerr *readError
		if errors.As(derr, &rerr) {
			return derr
		}
		if !last {
			return fmt.Errorf("%w: sealed segment %s at offset %d: %v", ErrCorrupt, segName(id), end, derr)
		}
		rest := make([]byte, size-end)
		if _, err := f.ReadAt(rest, end); err != nil {
			return fmt.Errorf("raftlog: read %s: %w", segName(id), err)
		}
		if allZero(rest) {
			// Zeros after the last frame: a prepared segment's room (prealloc.go), or
			// blocks a crash allocated before their data reached them. Nothing was
			// written there; appends continue at end.
			seg.zeroTail = true
			continue
		}
		if err := l.cutTail(seg, rest, end, derr); err != nil {
			return err
		}
		l.recovery.CleanShutdown = false
	}
	for _, g := range l.groups {
		l.recovery.RecoveredEntries += int64(len(g.locs))
	}
	if len(ids) == 0 {
		l.recovery.CleanShutdown = true
		return l.startSegment(1)
	}
	l.active = l.segs[ids[len(ids)-1]]
	if l.active.size == 0 {
		// The header itself was torn: rewrite the segment from scratch.
		return l.initSegment(l.active, false)
	}
	return nil
}

// writebackBytes is how much unsynced data the active segment may gather
// before the flusher starts its write-back (see startWriteback).
const writebackBytes = 4 << 20

// replayWindow is the read size of recovery: segments are streamed through
// one reused buffer (grown only for a frame larger than it), which keeps
// recovery memory small and cache-friendly.
const replayWindow = 4 << 20

// replayBuf is the window recovery reads through; reused across segments.
type replayBuf struct {
	b      []byte
	window int // read size; 0 means replayWindow
}

type readError struct{ err error }

func (e *readError) Error() string { return "raftlog: " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// replaySegment verifies and applies the frames of one segment of the given
// size. It returns the end of the verified prefix and, if it stopped before
// size, why.
func (l *Log) replaySegment(seg *segment, r io.ReaderAt, size int64, rb *replayBuf) (int64, error) {
	window := rb.window
	if window == 0 {
		window = replayWindow
	}
	if cap(rb.b) < window {
		rb.b = make([]byte, 0, window)
	}
	w := rb.b[:0] // file bytes [base, base+len(w))
	base := int64(0)
	pos := 0 // next frame within w
	// fill makes at least need bytes available at w[pos:], or all the rest
	// of the file if fewer remain.
	fill := func(need int) error {
		if len(w)-pos >= need || base+int64(len(w)) >= size {
			return nil
		}
		n := copy(w[:cap(w)], w[pos:])
		base += int64(pos)
		pos = 0
		if need > cap(w) {
			nw := make([]byte, n, need)
			copy(nw, w[:n])
			w = nw
		}
		want := min(int64(cap(w)), size-base)
		if _, err := r.ReadAt(w[n:want], base+int64(n)); err != nil && err != io.EOF {
			return &readError{err}
		}
		w = w[:want]
		return nil
	}
	defer func() {
		if cap(w) <= 4*window {
			rb.b = w[:0]
		}
	}()
	if err := fill(segHeaderSize); err != nil {
		return 0, err
	}
	if err := checkSegHeader(w, seg.id); err != nil {
		return 0, err
	}
	pos = segHeaderSize
	for base+int64(pos) < size {
		off := base + int64(pos)
		if err := fill(frameHeaderSize); err != nil {
			return off, err
		}
		f, n, err := decodeFrame(w[pos:], seg.id, off)
		if errors.Is(err, errTorn) && len(w)-pos >= frameHeaderSize {
			// The header verified; fetch the rest of the payload.
			if err := fill(frameHeaderSize + int(leUint32(w[pos+8:]))); err != nil {
				return off, err
			}
			f, n, err = decodeFrame(w[pos:], seg.id, off)
		}
		if err != nil {
			return off, err
		}
		if l.sideSlot != nil && !l.sideSlot.before(seg.id, off) {
			l.applySlot() // the slot was written before this frame
		}
		l.applyFrame(seg, off, f)
		l.recovery.RecoveredRecords++
		l.recovery.CleanShutdown = f.typ == recShutdown
		pos += n
	}
	return base + int64(pos), nil
}

// cutTail handles damage in the last segment at offset end; rest holds the
// file from end to EOF. If a frame flagged flagAfterSync verifies after the
// damage, everything before that frame had been fsynced when it was written:
// the damage hit synced (acknowledged) data, a disk fault, and Open refuses
// in either mode. Otherwise everything from end on was written after the
// last fsync (a torn write, possibly with later unsynced frames that a host
// crash let reach the disk out of order) and is cut.
func (l *Log) cutTail(seg *segment, rest []byte, end int64, cause error) error {
	kind := "corrupt"
	if errors.Is(cause, errTorn) {
		kind = "torn"
	}
	synced, unsynced := scanAfterDamage(rest, seg.id, end)
	if synced >= 0 {
		return fmt.Errorf("%w: %s damaged at offset %d (%v), but the frame at %d was written after an fsync covering it; refusing to cut synced data",
			ErrCorrupt, segName(seg.id), end, cause, synced)
	}
	if unsynced > 0 {
		l.logf("raftlog: %s damaged at offset %d (%v); %d valid but never synced frames follow and are cut too",
			segName(seg.id), end, cause, unsynced)
	}
	cut := int64(len(rest))
	l.logf("raftlog: cutting %d bytes of %s tail of %s at offset %d: %v", cut, kind, segName(seg.id), end, cause)
	if err := seg.f.Truncate(end); err != nil {
		return fmt.Errorf("raftlog: truncate %s: %w", segName(seg.id), err)
	}
	if err := seg.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: sync %s: %w", segName(seg.id), err)
	}
	l.recovery.TailDamage = kind
	l.recovery.TruncatedBytes = cut
	return nil
}

// scanAfterDamage looks in rest (the file from offset base on) for frames
// after base that verify at their position. It returns the offset of the
// first one flagged flagAfterSync (-1 if none) and how many unflagged ones
// it saw before.
func scanAfterDamage(rest []byte, segID uint64, base int64) (synced int64, unsynced int) {
	for i := 1; i+frameHeaderSize <= len(rest); i++ {
		off := base + int64(i)
		if off < segHeaderSize || rest[i+4] != frameMagic0 || rest[i+5] != frameMagic1 {
			continue
		}
		f, n, err := decodeFrame(rest[i:], segID, off)
		if err != nil {
			continue
		}
		if f.flags&flagAfterSync != 0 {
			return off, unsynced
		}
		unsynced++
		i += n - 1
	}
	return -1, unsynced
}

// startSegment creates segment id and makes it active.
func (l *Log) startSegment(id uint64) error {
	if id > 1<<32-1 {
		return fmt.Errorf("raftlog: segment id %d exceeds 2^32-1", id)
	}
	f := l.prep.take() // a prepared file (prealloc.go), renamed into place by initSegment
	prepared := f != nil
	if !prepared {
		var err error
		f, err = os.OpenFile(filepath.Join(l.dir, segName(id)), os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
	}
	seg := &segment{id: id, f: f, zeroTail: prepared}
	l.segMu.Lock()
	l.segs[id] = seg
	l.segMu.Unlock()
	l.active = seg
	return l.initSegment(seg, prepared)
}

// initSegment writes a segment header followed by a checkpoint of every
// group's stable values, then syncs file and directory. The checkpoint is why
// purging older segments never loses votes or terms. A prepared file (prealloc.go) is
// renamed to its segment name between the two syncs, so a crash never leaves a named
// segment without a valid header.
func (l *Log) initSegment(seg *segment, prepared bool) error {
	b := make([]byte, segHeaderSize, 4096)
	encodeSegHeader(b, seg.id)
	l.groupsMu.RLock()
	for id, g := range l.groups {
		g.mu.RLock()
		if len(g.stable) > 0 {
			b = appendFrame(b, recStable, id, func(p []byte) []byte {
				p = appendUint32(p, uint32(len(g.stable)))
				for k, v := range g.stable {
					p = appendStablePair(p, []byte(k), v)
				}
				return p
			})
		}
		g.mu.RUnlock()
	}
	l.groupsMu.RUnlock()
	off := int64(segHeaderSize)
	for off < int64(len(b)) {
		sealFrame(b[off:], seg.id, off)
		off += int64(frameHeaderSize) + int64(leUint32(b[off+8:]))
	}
	if !seg.zeroTail {
		if err := seg.f.Truncate(0); err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
	}
	if _, err := seg.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("raftlog: write %s: %w", segName(seg.id), err)
	}
	if err := seg.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: sync %s: %w", segName(seg.id), err)
	}
	l.stats.fsyncs.Add(1)
	l.segMu.Lock()
	seg.size = int64(len(b))
	seg.base = seg.size
	l.segMu.Unlock()
	if prepared {
		// Header and checkpoint are synced: only now may the file take its name.
		if err := os.Rename(filepath.Join(l.dir, preallocName), filepath.Join(l.dir, segName(seg.id))); err != nil {
			return fmt.Errorf("raftlog: %w", err)
		}
	}
	return syncDir(l.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("raftlog: sync dir: %w", err)
	}
	return nil
}

// submit hands a request to the flusher and waits for its outcome.
func (l *Log) submit(r *request) error {
	l.qmu.Lock()
	if l.closing {
		l.qmu.Unlock()
		return ErrClosed
	}
	if l.failed != nil && !r.stable {
		err := l.failed
		l.qmu.Unlock()
		return err
	}
	if !l.writing && len(l.queue) == 0 {
		// Nobody is writing and nothing waits: write this request here instead of
		// waking the flusher and waiting to be woken by it (two goroutine switches per
		// append on an idle node). Requests that arrive during the write queue for the
		// flusher, which takes them all in one batch as soon as this write is done.
		//
		// When a write of the last busyWindow had company (it took more than one
		// request, or some queued meanwhile), first yield the processor once: the
		// goroutines already runnable (other groups' Raft loops with entries of their
		// own) run and queue behind this write, and it takes them along. On a busy node
		// with few cores this turned one write(2) per request into one per several
		// (0.59 to 0.15 per append at 64 writers on 2 cores, 1.09-1.2x the
		// throughput). A lone writer does not yield: on a node busy with something
		// else (a fan-out to a thousand readers) the yield would only put its append
		// behind that work.
		l.writing = true
		batch := append(l.idleBatch[:0], r)
		if time.Since(l.companyAt) < busyWindow {
			l.qmu.Unlock()
			runtime.Gosched()
			l.qmu.Lock()
			batch = append(batch, l.queue...)
			clear(l.queue)
			l.queue = l.queue[:0]
		}
		l.qmu.Unlock()
		l.writeRequests(batch)
		l.qmu.Lock()
		if len(batch) > 1 || len(l.queue) > 0 {
			l.companyAt = time.Now()
		}
		clear(batch)
		l.idleBatch = batch[:0]
		l.writing = false
		if len(l.queue) > 0 || l.closing {
			l.qcond.Signal()
		}
		l.qmu.Unlock()
		<-r.done
		return r.err
	}
	l.queue = append(l.queue, r)
	if len(l.queue) == 1 {
		l.qcond.Signal()
	}
	l.qmu.Unlock()
	<-r.done
	return r.err
}

// busyWindow is how long after a write with company the journal counts as busy: long
// enough to span the gaps between writes of a loaded node (with a window of 1 ms,
// 0.27-0.42 writes per append instead of 0.15 at 64 writers), far shorter than the gap
// between the appends of a lone writer.
var busyWindow = 10 * time.Millisecond

// flusher is the single writer: it takes every queued request, writes them
// with one write(2), fsyncs once if any of them needs it, applies them to the
// in-memory indexes in file order, then wakes the callers (group commit).
func (l *Log) flusher() {
	defer close(l.done)
	var reqs []*request
	for {
		l.qmu.Lock()
		for l.writing || len(l.queue) == 0 && !l.closing {
			l.qcond.Wait()
		}
		if len(l.queue) == 0 && l.closing {
			l.qmu.Unlock()
			return
		}
		reqs, l.queue = l.queue, reqs[:0]
		l.writing = true
		l.qmu.Unlock()

		l.writeRequests(reqs)

		l.qmu.Lock()
		if len(reqs) > 1 || len(l.queue) > 0 {
			l.companyAt = time.Now()
		}
		l.writing = false
		l.qmu.Unlock()
		clear(reqs)
	}
}

// writeRequests writes a batch of requests and wakes their callers. The caller owns the
// write state (writing is set).
func (l *Log) writeRequests(reqs []*request) {
	err := l.writeBatch(reqs)
	if isNoSpace(err) {
		l.opt.Guard.NoSpace()
		if !l.wroteSome && l.reserved && dropReserve(l.dir) {
			// The reserve's room lets this batch (a vote, a term, a leader's
			// entries) through; the guard keeps client writes out meanwhile.
			l.reserved = false
			l.logf("raftlog: disk full, released the %d byte reserve", reserveBytes)
			err = l.writeBatch(reqs)
		}
	}
	if err == nil && !l.reserved && time.Since(l.reserveAt) > time.Second {
		l.reserveAt = time.Now()
		if tok, _ := l.opt.Guard.WriteRefusal(); tok == "" {
			l.reserved = makeReserve(l.dir)
		}
	}
	if err != nil && !isNoSpace(err) {
		l.qmu.Lock()
		if l.failed == nil {
			l.failed = err
			l.logf("raftlog: journal failed, refusing further writes: %v", err)
		}
		l.qmu.Unlock()
	}
	var serr error
	if err != nil {
		// A stable write (a term, a vote) must not fail: raft panics when it cannot save
		// its term. What the journal could not take goes to the side file.
		var stable []*request
		for _, r := range reqs {
			if r.stable {
				stable = append(stable, r)
			}
		}
		if len(stable) > 0 {
			serr = l.writeStableSide(stable, err)
		}
	}
	for _, r := range reqs {
		r.err = err
		if r.stable {
			r.err = serr
		}
		r.done <- struct{}{}
	}
}

func (l *Log) writeBatch(reqs []*request) error {
	l.qmu.Lock()
	err := l.failed
	l.qmu.Unlock()
	if err != nil {
		return err
	}
	l.batch = l.batch[:0]
	l.pending = l.pending[:0]
	l.wroteSome = false
	sync := false
	for _, r := range reqs {
		sync = sync || r.sync
		for pos := 0; pos < len(r.buf); {
			n := frameHeaderSize + int(leUint32(r.buf[pos+8:]))
			if err := l.stage(r.buf[pos : pos+n]); err != nil {
				return err
			}
			pos += n
		}
	}
	l.stats.requests.Add(uint64(len(reqs)))
	if err := l.flushPending(); err != nil {
		return err
	}
	if sync {
		if err := l.syncActive(); err != nil {
			return err
		}
	}
	if l.rolled {
		l.rolled = false
		if err := l.copyForward(); err != nil {
			return err
		}
	}
	if l.compacted {
		l.compacted = false
		if l.activeMostlyDead() {
			// Compaction left the active segment mostly dead: seal it and copy what
			// is still live forward, so the segment can go now rather than when it
			// fills up.
			if err := l.roll(); err != nil {
				return err
			}
			l.rolled = false
			if err := l.copyForward(); err != nil {
				return err
			}
		} else if err := l.copyForward(); err != nil {
			// An older segment may now be pinned only by a few live entries (say a roll
			// or a copy that met a full disk left them there): move them so it can go.
			return err
		}
	}
	if l.needPurge && l.unsynced {
		// Reclaim promptly, in either mode: this only happens when a group's
		// oldest entry moved to a later segment (compaction), not per append.
		if err := l.syncActive(); err != nil {
			return err
		}
	}
	if l.needPurge {
		l.needPurge = false
		return l.purge()
	}
	return nil
}

// activeMostlyDead reports whether every live entry is in the active segment, they
// take at most a quarter of it and fit copyForward's budget, and the segment holds at
// least compactRollBytes: rolling then frees nearly all of it.
func (l *Log) activeMostlyDead() bool {
	used := l.active.size - l.active.base
	if used < compactRollBytes {
		return false
	}
	live := int64(0)
	l.groupsMu.RLock()
	defer l.groupsMu.RUnlock()
	for _, g := range l.groups {
		g.mu.RLock()
		n := int64(0)
		older := false
		for _, lc := range g.locs {
			if uint64(lc.seg) != l.active.id {
				older = true
				break
			}
			n += int64(lc.n)
		}
		g.mu.RUnlock()
		if older || n > l.segMax/16 {
			return false
		}
		live += n
	}
	return live <= used/4 && live <= l.segMax/4
}

// compactRollBytes is the least a mostly dead active segment must hold before
// compaction rolls it early.
const compactRollBytes = 1 << 20

// injected is the fault a test planted for op, nil normally.
func (l *Log) injected(op string) error {
	if f := l.fault.Load(); f != nil {
		return (*f)(op)
	}
	return nil
}

func (l *Log) syncActive() error {
	if err := l.injected("fsync"); err != nil {
		return fmt.Errorf("raftlog: fsync %s: %w", segName(l.active.id), err)
	}
	if err := l.active.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: fsync %s: %w", segName(l.active.id), err)
	}
	l.stats.fsyncs.Add(1)
	l.unsynced = false
	return nil
}

// stage adds one unsealed frame to the batch at the next offset, sealing
// the active segment first when the frame would take it past SegmentBytes.
func (l *Log) stage(fr []byte) error {
	n := int64(len(fr))
	off := l.active.size + int64(len(l.batch))
	if off+n > l.segMax && off > l.active.base || l.leaveForPrepared(off) {
		if err := l.flushPending(); err != nil {
			return err
		}
		if err := l.roll(); err != nil {
			return err
		}
		off = l.active.size
	}
	start := len(l.batch)
	l.batch = append(l.batch, fr...)
	if start == 0 && !l.unsynced {
		l.batch[7] |= flagAfterSync
	}
	sealFrame(l.batch[start:], l.active.id, off)
	l.pending = append(l.pending, pendingFrame{seg: l.active, off: off, pos: start, n: len(fr)})
	return nil
}

// copyForward rewrites the live entries of small groups that alone keep the
// oldest segment alive into the active segment, so a quiet group (one that
// rarely reaches raft's snapshot threshold) does not pin disk forever. It
// only acts when every group pinning the oldest segment is small, and moves
// at most a quarter segment per roll. The copies are fsynced (whatever the
// mode) before the purge deletes the originals, which were durable.
func (l *Log) copyForward() error {
	oldest := l.active.id
	l.segMu.RLock()
	for id := range l.segs {
		oldest = min(oldest, id)
	}
	l.segMu.RUnlock()
	if oldest == l.active.id {
		return nil
	}
	groupLimit, budget := l.segMax/16, l.segMax/4
	var movers []*groupState
	total := int64(0)
	l.groupsMu.RLock()
	for _, g := range l.groups {
		g.mu.RLock()
		if len(g.locs) > 0 && uint64(g.locs[0].seg) == oldest {
			n := int64(0)
			for _, lc := range g.locs {
				n += int64(lc.n)
				if n > groupLimit {
					break
				}
			}
			if n > groupLimit {
				movers, total = nil, budget+1 // a big group pins it anyway
			} else {
				movers = append(movers, g)
				total += n
			}
		}
		g.mu.RUnlock()
		if total > budget {
			break
		}
	}
	l.groupsMu.RUnlock()
	if len(movers) == 0 || total > budget {
		return nil
	}
	// The flusher is the only writer, so each group's locs cannot change
	// until the copies are applied; they are copied because applying the
	// first record (at a roll inside stage) reuses the slice.
	moved := 0
	for _, g := range movers {
		g.mu.RLock()
		locs := append([]loc(nil), g.locs...)
		g.mu.RUnlock()
		var fr []byte
		for i := 0; i < len(locs); {
			fr = append(fr[:0], make([]byte, frameHeaderSize+4)...)
			count := 0
			for ; i < len(locs) && (count == 0 || len(fr)+int(locs[i].n) <= recordSplitBytes); i++ {
				lc := locs[i]
				start := len(fr)
				fr = append(fr, make([]byte, lc.n)...)
				l.segMu.RLock()
				src := l.segs[uint64(lc.seg)]
				err := errors.New("segment is gone")
				if src != nil {
					_, err = src.f.ReadAt(fr[start:], int64(lc.off))
				}
				l.segMu.RUnlock()
				if err != nil {
					return fmt.Errorf("raftlog: copy forward group %d: %w", g.id, err)
				}
				count++
			}
			binary.LittleEndian.PutUint32(fr[frameHeaderSize:], uint32(count))
			putFrameHeader(fr[:frameHeaderSize], recEntries, g.id, fr[frameHeaderSize:])
			if err := l.stage(fr); err != nil {
				return err
			}
			moved += count
			// Write as it goes: the batch buffer (kept for every later batch) stays
			// about a record's size instead of growing to the whole copy (up to a
			// quarter segment). The locs were copied above, so applying is safe here.
			if len(l.batch) >= recordSplitBytes {
				if err := l.flushPending(); err != nil {
					return err
				}
			}
		}
	}
	if err := l.flushPending(); err != nil {
		return err
	}
	if err := l.syncActive(); err != nil {
		return err
	}
	l.stats.copied.Add(uint64(moved))
	l.needPurge = true
	return nil
}

// flushPending writes the batch to the active segment and applies its frames.
func (l *Log) flushPending() error {
	if len(l.batch) == 0 {
		return nil
	}
	seg := l.active
	if err := l.injected("write"); err != nil {
		l.batch = l.batch[:0]
		l.pending = l.pending[:0]
		return fmt.Errorf("raftlog: write %s: %w", segName(seg.id), err)
	}
	if _, err := seg.f.WriteAt(l.batch, seg.size); err != nil {
		// Cut what part of the batch got written, so the segment ends at its last
		// whole frame and a later batch continues there; nothing of it was applied.
		seg.f.Truncate(seg.size)
		seg.zeroTail = false
		l.batch = l.batch[:0]
		l.pending = l.pending[:0]
		return fmt.Errorf("raftlog: write %s: %w", segName(seg.id), err)
	}
	l.wroteSome = true
	l.unsynced = true
	l.stats.writes.Add(1)
	l.stats.records.Add(uint64(len(l.pending)))
	l.segMu.Lock()
	seg.size += int64(len(l.batch))
	l.segMu.Unlock()
	if seg.size-seg.flushedTo >= writebackBytes {
		startWriteback(seg.f, seg.flushedTo, seg.size-seg.flushedTo)
		seg.flushedTo = seg.size
	}
	for _, p := range l.pending {
		b := l.batch[p.pos : p.pos+p.n]
		f := frame{typ: b[6], group: leUint64(b[12:]), payload: b[frameHeaderSize:]}
		if l.applyFrame(p.seg, p.off, f) {
			l.needPurge = true
		}
		if f.typ == recDeleteRange {
			l.compacted = true
		}
	}
	l.batch = l.batch[:0]
	l.pending = l.pending[:0]
	return nil
}

// roll seals the active segment (fsync, so a sealed segment is never torn)
// and starts the next one.
func (l *Log) roll() error {
	old := l.active
	if old.zeroTail {
		// A sealed segment ends at its last frame (recovery reads sealed segments to EOF).
		if err := old.f.Truncate(old.size); err != nil {
			return fmt.Errorf("raftlog: truncate %s: %w", segName(old.id), err)
		}
		old.zeroTail = false
	}
	if err := old.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: fsync %s: %w", segName(old.id), err)
	}
	l.stats.fsyncs.Add(1)
	if err := l.startSegment(old.id + 1); err != nil {
		if isNoSpace(err) {
			// Stay on the sealed segment (appending to it is safe, it was only synced)
			// rather than on a half-written new one.
			l.dropSegment(old.id + 1)
			l.active = old
		}
		return err
	}
	// Everything written so far is synced: the old segment is sealed and
	// the new one holds only its synced header and checkpoint. So this is
	// the moment to purge, whatever the mode.
	l.unsynced = false
	l.rolled = true
	l.needPurge = false
	l.prep.kick()
	return l.purge()
}

// dropSegment removes a segment that failed to start.
func (l *Log) dropSegment(id uint64) {
	l.segMu.Lock()
	seg := l.segs[id]
	delete(l.segs, id)
	l.segMu.Unlock()
	if seg != nil {
		seg.f.Close()
	}
	os.Remove(filepath.Join(l.dir, segName(id)))
}

// purge deletes the oldest segments that no group needs any more. Only a
// prefix of the sequence is ever deleted, so replay always sees, for every
// group, a contiguous suffix of its history. Callers make sure everything
// written is synced first: the records that made these segments dead
// (prefix deletes, copies) must be durable before the files go, or a host
// crash could leave a state no sequence of acknowledged operations produced.
func (l *Log) purge() error {
	minNeeded := l.active.id
	l.groupsMu.RLock()
	for _, g := range l.groups {
		g.mu.RLock()
		if len(g.locs) > 0 && uint64(g.locs[0].seg) < minNeeded {
			minNeeded = uint64(g.locs[0].seg)
		}
		g.mu.RUnlock()
	}
	l.groupsMu.RUnlock()
	var victims []*segment
	l.segMu.Lock()
	for id := minNeeded - 1; id > 0; id-- {
		s, ok := l.segs[id]
		if !ok {
			break
		}
		delete(l.segs, id)
		victims = append(victims, s)
	}
	l.segMu.Unlock()
	if len(victims) == 0 {
		return nil
	}
	// Oldest first: a crash in the middle leaves a contiguous sequence.
	slices.Reverse(victims)
	l.stats.queuedPurge.Add(uint64(len(victims)))
	l.reap <- victims
	return nil
}

// reaper deletes purged segment files, in order, off the flusher's path:
// unlinking a big file and syncing the directory can take tens of
// milliseconds, which every writer would otherwise wait for.
func (l *Log) reaper() {
	defer close(l.reaped)
	for victims := range l.reap {
		for _, s := range victims {
			s.f.Close()
			if err := os.Remove(filepath.Join(l.dir, segName(s.id))); err != nil {
				l.logf("raftlog: purge %s: %v", segName(s.id), err)
				continue
			}
			l.stats.purged.Add(1)
		}
		if err := syncDir(l.dir); err != nil {
			l.logf("raftlog: purge: %v", err)
		}
	}
}

// Close drains queued writes, syncs the active segment and closes the files.
// Close after a clean shutdown means a host crash loses nothing even with
// FsyncNever.
func (l *Log) Close() error {
	l.qmu.Lock()
	if l.closing {
		l.qmu.Unlock()
		return ErrClosed
	}
	l.closing = true
	l.qcond.Signal()
	l.qmu.Unlock()
	<-l.done
	l.prep.stop()
	err := l.failed // a failed journal reports why on Close too
	if err == nil {
		// The shutdown record tells the next Open that nothing was lost.
		l.batch = appendFrame(l.batch[:0], recShutdown, 0, func(p []byte) []byte { return p })
		sealFrame(l.batch, l.active.id, l.active.size)
		if _, werr := l.active.f.WriteAt(l.batch, l.active.size); werr != nil {
			err = fmt.Errorf("raftlog: write on close: %w", werr)
		} else if serr := l.active.f.Sync(); serr != nil {
			err = fmt.Errorf("raftlog: fsync on close: %w", serr)
		} else if l.needPurge {
			err = l.purge()
		}
	}
	close(l.reap)
	<-l.reaped
	if cerr := l.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

func (l *Log) closeFiles() error {
	var first error
	l.segMu.Lock()
	for _, s := range l.segs {
		if err := s.f.Close(); err != nil && first == nil {
			first = err
		}
	}
	l.segs = nil // readers now see ErrClosed
	l.segMu.Unlock()
	if l.side != nil {
		l.side.f.Close()
	}
	if l.lockF != nil {
		l.lockF.Close() // releases the flock
	}
	return first
}

// Stats returns counters and recovery facts.
func (l *Log) Stats() Stats {
	s := l.recovery
	s.Writes = l.stats.writes.Load()
	s.Fsyncs = l.stats.fsyncs.Load()
	s.Records = l.stats.records.Load()
	s.Requests = l.stats.requests.Load()
	s.PurgedSegments = l.stats.purged.Load()
	s.CopiedEntries = l.stats.copied.Load()
	s.SideWrites = l.stats.sideWrites.Load()
	l.segMu.RLock()
	s.Segments = len(l.segs)
	oldest := uint64(0)
	for id, seg := range l.segs {
		s.Bytes += seg.size
		if oldest == 0 || id < oldest {
			oldest = id
		}
		if id > s.ActiveSegment {
			s.ActiveSegment = id
		}
	}
	l.segMu.RUnlock()
	l.groupsMu.RLock()
	s.Groups = len(l.groups)
	for id, g := range l.groups {
		g.mu.RLock()
		s.LiveEntries += int64(len(g.locs))
		if len(g.locs) > 0 && uint64(g.locs[0].seg) == oldest && oldest != s.ActiveSegment {
			s.OldestSegmentPinnedBy = id
		}
		g.mu.RUnlock()
	}
	l.groupsMu.RUnlock()
	return s
}
