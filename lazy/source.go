// Package lazy serves the pages of a replicated database on demand, as of a stream
// offset, without a local copy: from the frames of the stream's latest snapshot (fetched
// by byte range) and the commit records after it, through a bounded page cache with
// read-ahead, optionally following the stream live. It knows nothing of SQLite; the VFS
// adapters (package vfs, ursula sql) read pages through a View.
package lazy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// Options configure Open.
type Options struct {
	Client *client.Client // nil: a default client
	// At is the stream offset (a record boundary) to read the database at; 0: the tail
	// when Open runs.
	At uint64
	// Follow keeps reading the stream's new commits (long-poll) after Open, so a new View
	// sees the latest state. It cannot be combined with At.
	Follow bool
	// CacheBytes bounds the page cache; 0: 64 MiB.
	CacheBytes int64
	// ReadAhead is how many snapshot frames one fetch takes at most when pages are read in
	// order; 0: 32.
	ReadAhead int
	// Parallel is how many runs of frames are fetched ahead of a reader going in order,
	// each with its own ranged GET, all in flight at once (fewer when they would not fit
	// in half the cache); 0: 3.
	Parallel int
	// MaxFrame bounds one stream record, header included; 0: the server's request cap.
	MaxFrame int
}

// DefaultCacheBytes is the page cache bound when Options.CacheBytes is 0.
const DefaultCacheBytes = 64 << 20

const (
	defaultReadAhead = 32
	defaultParallel  = 3
	// prefixGuess is how much of a snapshot the first ranged GET asks for: the header and
	// index of a database up to about 2 GiB (frames of 64 KiB), then its first frames.
	prefixGuess = 512 << 10
	followPoll  = 30 * time.Second
	maxBackoff  = 5 * time.Second
)

// Stats counts what a Source did since Open.
type Stats struct {
	BytesFetched int64 // response bytes of snapshot frames and stream reads
	Requests     int64 // HTTP requests made for them
	CacheHits    int64
	CacheMisses  int64
	CachedBytes  int64
}

// Source is a lazily read replicated database. Views read it; it is safe for concurrent use.
type Source struct {
	url   string
	c     *client.Client
	opts  Options
	cache *pageCache

	mu       sync.RWMutex
	base     *base               // the snapshot pages not in a commit come from; nil: none
	pageSize uint32              // 0 until there is a snapshot or a commit
	pages    map[uint32][]uint64 // page -> offsets of the commits holding it, ascending
	commits  map[uint64]uint64   // commit offset -> offset just past it
	sizes    []sizeAt            // database size after each commit, by offset ascending
	shrinks  []sizeAt            // the commits that made the database smaller
	tail     uint64              // the stream is indexed up to here
	inc      string              // the stream's incarnation
	err      error               // why following stopped; nil while it goes on

	rebaseMu sync.Mutex // one rebase at a time
	old      []*base    // bases replaced by rebase (their files close with the source)

	flightMu sync.Mutex
	inflight map[cacheKey]*flight
	seqMu    sync.Mutex
	lastSeq  int        // last frame fetched or fetched ahead (read-ahead detects runs)
	run      int        // frames one fetch in a run takes
	ahead    []frameRun // the runs fetched ahead of the reader (and the one it is in), in order

	bytes, requests atomic.Int64

	cancel context.CancelFunc
	done   chan struct{}
	close  sync.Once
}

type sizeAt struct {
	off   uint64
	pages uint32
}

// base is a snapshot: version 2 frames fetched by range, or a version 1 image in a file.
type base struct {
	h      replicator.SnapshotHeader
	off    string // the snapshot's offset as the protocol writes it
	digest string
	x      *replicator.SnapshotIndex // version 2
	file   *os.File                  // version 1: the whole image
}

// Open indexes the stream at url as of opts.At (or its tail): it fetches the header and
// index of the latest snapshot at or below that offset, and reads the records after it,
// keeping only which commit holds which page (and, within the cache bound, the pages).
func Open(ctx context.Context, url string, opts Options) (*Source, error) {
	if opts.Follow && opts.At != 0 {
		return nil, errors.New("ursula: lazy: Follow reads the tail; it cannot be combined with At")
	}
	c := opts.Client
	if c == nil {
		var err error
		if c, err = client.New(""); err != nil {
			return nil, err
		}
	}
	opts.CacheBytes = cmp.Or(opts.CacheBytes, DefaultCacheBytes)
	opts.ReadAhead = max(1, cmp.Or(opts.ReadAhead, defaultReadAhead))
	opts.Parallel = max(1, cmp.Or(opts.Parallel, defaultParallel))
	opts.MaxFrame = cmp.Or(opts.MaxFrame, streamcore.MaxRequestBytes)
	s := &Source{url: url, c: c, opts: opts, cache: newPageCache(opts.CacheBytes),
		pages: map[uint32][]uint64{}, commits: map[uint64]uint64{}, inflight: map[cacheKey]*flight{}, lastSeq: -2, done: make(chan struct{})}
	info, err := c.Head(ctx, url)
	if err != nil {
		return nil, replicator.ClassifyRead(err, "HEAD of the stream")
	}
	s.inc = info.Incarnation
	tail, _ := streamcore.ParseOffset(info.NextOffset)
	target := tail
	if opts.At != 0 {
		if opts.At > tail {
			return nil, &replicator.Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix,
				Message: fmt.Sprintf("offset %d is beyond the stream tail %d", opts.At, tail)}
		}
		target = opts.At
	}
	from := uint64(0)
	if info.SnapshotOffset != "" {
		if snapOff, _ := streamcore.ParseOffset(info.SnapshotOffset); snapOff <= target {
			b, err := s.loadBase(ctx, info.SnapshotOffset)
			if err != nil {
				return nil, err
			}
			s.base, s.pageSize, from = b, b.h.PageSize, b.h.Offset
		}
	}
	if retained, _ := streamcore.ParseOffset(info.RetainedOffset); from < retained {
		s.Close()
		return nil, &replicator.Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix,
			Message: fmt.Sprintf("offset %d is no longer readable: retention is at %d and the latest snapshot is past it", target, retained)}
	}
	s.tail = from
	if err := s.indexLog(ctx, target); err != nil {
		s.Close()
		return nil, err
	}
	if opts.Follow {
		fctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		go s.follow(fctx)
	} else {
		close(s.done)
	}
	return s, nil
}

// Close stops following and releases the cache and any local file. Views read after
// Close fail.
func (s *Source) Close() error {
	s.close.Do(func() {
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
		s.mu.Lock()
		for _, b := range append(s.old, s.base) {
			if b != nil && b.file != nil {
				b.file.Close()
			}
		}
		s.err = errClosed
		s.mu.Unlock()
		s.cache.clear()
	})
	return nil
}

var errClosed = errors.New("ursula: lazy: the source is closed")

// Stats reports what the source fetched and how the cache served.
func (s *Source) Stats() Stats {
	hits, misses, cached := s.cache.stats()
	return Stats{BytesFetched: s.bytes.Load(), Requests: s.requests.Load(), CacheHits: hits, CacheMisses: misses, CachedBytes: cached}
}

// Err reports why following stopped (nil while it goes on, or without Follow).
func (s *Source) Err() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.err == errClosed {
		return nil
	}
	return s.err
}

// loadBase fetches the header and index of the snapshot at off with one ranged GET (two
// when the index is larger than the first guess); a version 1 snapshot is read whole
// into a temporary file.
func (s *Source) loadBase(ctx context.Context, off string) (*base, error) {
	sr, err := s.getSnapshot(ctx, off, 0, prefixGuess)
	if err != nil {
		return nil, err
	}
	ver, n, err := replicator.SnapshotPrefixLen(sr.Data)
	if err == nil && ver == 2 && int64(len(sr.Data)) < n {
		more, gerr := s.getSnapshot(ctx, off, int64(len(sr.Data)), n)
		if gerr != nil {
			return nil, gerr
		}
		if more.Digest != sr.Digest {
			return nil, superseded(off)
		}
		sr.Data = append(sr.Data, more.Data...)
		ver, n, err = replicator.SnapshotPrefixLen(sr.Data)
	}
	if err != nil {
		return nil, damaged(err, off)
	}
	if ver == 1 {
		return s.loadV1(ctx, off)
	}
	x, err := replicator.ParseSnapshotIndex(sr.Data[:n], -1)
	if err != nil {
		return nil, damaged(err, off)
	}
	if want, _ := streamcore.ParseOffset(off); x.Offset != want {
		return nil, damaged(fmt.Errorf("it says it folds the stream up to %d", x.Offset), off)
	}
	b := &base{h: x.SnapshotHeader, off: off, digest: sr.Digest, x: x}
	// The frames that came with the prefix guess are the first pages: keep them.
	for i, f := range x.Frames {
		if f.Offset+uint64(f.Length) > uint64(len(sr.Data)) {
			break
		}
		if _, err := s.installFrame(b, i, sr.Data[f.Offset:f.Offset+uint64(f.Length)]); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (s *Source) loadV1(ctx context.Context, off string) (*base, error) {
	f, err := os.CreateTemp("", "ursula-lazy-*.db")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name()) // only this process needs it, and only while it is open
	h, err := replicator.FetchSnapshot(ctx, s.c, s.url, off, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &base{h: h, off: off, file: f}, nil
}

// getSnapshot reads bytes [lo, hi) of the snapshot at off (fewer when it is shorter).
func (s *Source) getSnapshot(ctx context.Context, off string, lo, hi int64) (*client.SnapshotResult, error) {
	s.requests.Add(1)
	sr, err := s.c.ReadSnapshot(ctx, s.url, off, client.SnapshotReadOptions{Range: fmt.Sprintf("bytes=%d-%d", lo, hi-1), IfIncarnation: s.inc})
	if err != nil {
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status == http.StatusNotFound && ce.Code == streamcore.CodeSnapshotNotFound {
			return nil, superseded(off)
		}
		return nil, replicator.ClassifyRead(err, "snapshot read")
	}
	s.bytes.Add(int64(len(sr.Data)))
	if sr.Status != http.StatusPartialContent {
		// No range support: the whole body came back; keep the part asked for.
		sr.Data = sr.Data[min(lo, int64(len(sr.Data))):min(hi, int64(len(sr.Data)))]
	}
	return sr, nil
}

// ErrSuperseded is wrapped by the error of a read whose snapshot the stream's owner
// replaced by a newer one (only the latest is readable): begin a new read transaction.
var ErrSuperseded = errors.New("ursula: lazy: the snapshot was replaced by a newer one")

func superseded(off string) error {
	return &replicator.Error{Kind: replicator.KindNotFound, Action: replicator.ActionRetry, Err: ErrSuperseded,
		Message: fmt.Sprintf("snapshot at %s is no longer readable", off)}
}

func damaged(err error, off string) error {
	return &replicator.Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop, Err: err,
		Message: fmt.Sprintf("snapshot at %s", off)}
}

// indexLog reads the records in [s.tail, to) and indexes them.
func (s *Source) indexLog(ctx context.Context, to uint64) error {
	var pending []byte
	pos := s.tail
	for read := s.tail; read < to; {
		s.requests.Add(1)
		rr, err := s.c.Read(ctx, s.url, client.ReadOptions{Offset: streamcore.FormatOffset(read),
			MaxBytes: int(min(to-read, streamcore.MaxReadBytes)), IfIncarnation: s.inc})
		if err != nil {
			return replicator.ClassifyRead(err, "stream read")
		}
		if len(rr.Data) == 0 {
			return &replicator.Error{Kind: replicator.KindUnavailable, Action: replicator.ActionRetry,
				Message: fmt.Sprintf("stream read at %d returned nothing before %d", read, to)}
		}
		s.bytes.Add(int64(len(rr.Data)))
		data := rr.Data[:min(uint64(len(rr.Data)), to-read)]
		read += uint64(len(data))
		pending = append(pending, data...)
		used, err := s.indexRecords(pending, pos)
		if err != nil {
			return err
		}
		pending = append(pending[:0], pending[used:]...)
		pos += uint64(used)
	}
	if pos != to {
		return &replicator.Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix,
			Message: fmt.Sprintf("offset %d is inside a record, not at a commit boundary", to)}
	}
	return nil
}

// errRebased: the tail moved to a newer snapshot while records were read (rebase).
var errRebased = errors.New("ursula: lazy: the source moved to a newer snapshot")

// indexRecords decodes the whole records at the start of b (stream bytes from pos on),
// adds their commits to the index and their pages to the cache, and moves the tail past
// them. It returns how many bytes it consumed.
func (s *Source) indexRecords(b []byte, pos uint64) (int, error) {
	recs, used, derr := replicator.DecodeRecords(b, pos, s.opts.MaxFrame)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tail != pos {
		return 0, errRebased
	}
	for _, r := range recs {
		if r.Kind == replicator.KindCommit {
			cm := r.Commit
			if s.pageSize != 0 && cm.PageSize != s.pageSize {
				return 0, &replicator.Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop,
					Message: fmt.Sprintf("record at %d changes the page size from %d to %d", r.Offset, s.pageSize, cm.PageSize)}
			}
			s.pageSize = cm.PageSize
			if prev := s.dbPagesLocked(r.Offset); cm.DBPages < prev {
				s.shrinks = append(s.shrinks, sizeAt{r.Offset, cm.DBPages})
			}
			s.sizes = append(s.sizes, sizeAt{r.Offset, cm.DBPages})
			s.commits[r.Offset] = r.End
			for _, p := range cm.Pages {
				s.pages[p.No] = append(s.pages[p.No], r.Offset)
				s.cache.put(cacheKey{kind: fromCommit, off: r.Offset, n: p.No}, p.Data)
			}
		}
		s.tail = r.End
	}
	if derr != nil {
		return used, &replicator.Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop, Err: derr, Message: "stream record"}
	}
	return used, nil
}

// dbPagesLocked is the database size as of offset at (just before the record there).
func (s *Source) dbPagesLocked(at uint64) uint32 {
	i, _ := slices.BinarySearchFunc(s.sizes, at, func(e sizeAt, t uint64) int { return cmp.Compare(e.off, t) })
	// The newer of the last commit before at and the snapshot (a commit before the
	// snapshot's offset ends at or before it).
	if s.base != nil && s.base.h.Offset <= at && (i == 0 || s.sizes[i-1].off < s.base.h.Offset) {
		return s.base.h.DBPages
	}
	if i > 0 {
		return s.sizes[i-1].pages
	}
	return 0
}

// follow long-polls the stream from its tail and indexes each new record, until Close
// or until the stream cannot be followed (Err says why).
func (s *Source) follow(ctx context.Context) {
	defer close(s.done)
	var (
		pending []byte
		wait    time.Duration
	)
	for ctx.Err() == nil {
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		s.mu.RLock()
		pos := s.tail
		s.mu.RUnlock()
		next := pos + uint64(len(pending))
		s.requests.Add(1)
		rr, err := s.c.Read(ctx, s.url, client.ReadOptions{Offset: streamcore.FormatOffset(next), LongPoll: true,
			Timeout: followPoll, IfIncarnation: s.inc})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var ce *client.Error
			if errors.As(err, &ce) && ce.Status == http.StatusGone {
				// Retention trimmed the log below the follower (it fell behind): go on
				// from the latest snapshot, which is past the trimmed records.
				if b, rerr := s.rebase(ctx); rerr == nil && b != nil && b.h.Offset > pos {
					pending, wait = pending[:0], 0
					continue
				}
			}
			if errors.As(err, &ce) && ce.Status >= 400 && ce.Status < 500 && ce.Status != http.StatusTooManyRequests {
				// Gone, recreated or refused: the views keep what is indexed.
				s.stop(replicator.ClassifyRead(err, "stream read"))
				return
			}
			wait = min(max(2*wait, 50*time.Millisecond), maxBackoff)
			continue
		}
		wait = 0
		s.bytes.Add(int64(len(rr.Data)))
		pending = append(pending, rr.Data...)
		used, err := s.indexRecords(pending, pos)
		if err == errRebased {
			pending = pending[:0]
			continue
		}
		if err != nil {
			s.stop(err)
			return
		}
		pending = append(pending[:0], pending[used:]...)
		if rr.Closed && rr.UpToDate && len(rr.Data) == 0 {
			return
		}
	}
}

func (s *Source) stop(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// rebase moves the source to the stream's latest snapshot when it is newer than the one
// in use (the owner replaced it, and retention may have trimmed the log below it), and
// returns the base in use afterwards. Views taken from then on read from it; a view
// already taken switches to it when it is at or below the view's offset (View.ReadPage).
// A following source whose tail is below the new snapshot goes on from the snapshot.
func (s *Source) rebase(ctx context.Context) (*base, error) {
	s.rebaseMu.Lock()
	defer s.rebaseMu.Unlock()
	s.mu.RLock()
	cur, tail := s.base, s.tail
	s.mu.RUnlock()
	s.requests.Add(1)
	info, err := s.c.Head(ctx, s.url, client.CallOptions{IfIncarnation: s.inc})
	if err != nil {
		return cur, replicator.ClassifyRead(err, "HEAD of the stream")
	}
	off, _ := streamcore.ParseOffset(info.SnapshotOffset)
	if info.SnapshotOffset == "" || cur != nil && off <= cur.h.Offset || off > tail && !s.opts.Follow {
		return cur, nil
	}
	b, err := s.loadBase(ctx, info.SnapshotOffset)
	if err != nil {
		return cur, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pageSize != 0 && b.h.PageSize != s.pageSize {
		return cur, &replicator.Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop,
			Message: fmt.Sprintf("snapshot at %d changes the page size from %d to %d", b.h.Offset, s.pageSize, b.h.PageSize)}
	}
	s.pageSize = b.h.PageSize
	if cur != nil {
		s.old = append(s.old, cur)
	}
	s.base = b
	if b.h.Offset > s.tail {
		// A follower below the snapshot: the records in between are folded into it.
		s.tail = b.h.Offset
	}
	return b, nil
}
