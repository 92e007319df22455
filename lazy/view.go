package lazy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// View is the database as of one stream offset: what a read transaction sees. Commits
// indexed after it was taken do not change what it reads.
type View struct {
	s        *Source
	at       uint64
	base     atomic.Pointer[base] // moves to a newer snapshot at or below at (rebase)
	pageSize uint32
	dbPages  uint32
}

// View returns the database as of the latest indexed offset.
func (s *Source) View() *View {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v := &View{s: s, at: s.tail, pageSize: s.pageSize, dbPages: s.dbPagesLocked(s.tail)}
	v.base.Store(s.base)
	return v
}

// Offset is the stream offset the view reads at.
func (v *View) Offset() uint64 { return v.at }

// PageSize is the database page size (0 for a stream without any commit).
func (v *View) PageSize() uint32 { return v.pageSize }

// DBPages is the database size in pages.
func (v *View) DBPages() uint32 { return v.dbPages }

// ReadPage returns page no (1..DBPages) as of the view's offset. The slice is shared:
// do not modify it.
//
// When what the view reads is gone (the stream's owner replaced the snapshot, and
// retention trimmed the log below it), the source moves to the stream's latest snapshot
// and, if that is at or below the view's offset, the view reads from it: the pages as of
// the view's offset are the same from either snapshot and the commits after it.
func (v *View) ReadPage(ctx context.Context, no uint32) ([]byte, error) {
	if no == 0 || no > v.dbPages {
		return nil, fmt.Errorf("ursula: lazy: page %d is outside 1..%d", no, v.dbPages)
	}
	b := v.base.Load()
	p, err := v.readPage(ctx, b, no)
	if err == nil || !isGone(err) {
		return p, err
	}
	nb, rerr := v.s.rebase(ctx)
	if rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	if nb == nil || nb == b || nb.h.Offset > v.at {
		return nil, &replicator.Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix, Err: err,
			Message: fmt.Sprintf("offset %d is no longer readable: the stream's latest snapshot is past it and retention trimmed the log below it", v.at)}
	}
	v.base.CompareAndSwap(b, nb)
	return v.readPage(ctx, nb, no)
}

// isGone reports a read whose data the stream no longer holds: a replaced snapshot, or
// log records below the retained offset (410).
func isGone(err error) bool {
	var ce *client.Error
	return IsSuperseded(err) || errors.As(err, &ce) && ce.Status == http.StatusGone
}

func (v *View) readPage(ctx context.Context, vbase *base, no uint32) ([]byte, error) {
	s := v.s
	s.mu.RLock()
	if s.err == errClosed {
		s.mu.RUnlock()
		return nil, errClosed
	}
	// The latest commit at or before the view holding the page, unless the snapshot
	// folds it in already.
	offs := s.pages[no]
	i, _ := slices.BinarySearch(offs, v.at) // offs[i] >= at: the record at v.at is not in the view
	commit, fromLog := uint64(0), false
	if i > 0 && (vbase == nil || offs[i-1] >= vbase.h.Offset) {
		commit, fromLog = offs[i-1], true
	}
	end := s.commits[commit]
	// A commit that shrank the database below the page, after its source, zeroes it.
	src := commit
	if !fromLog && vbase != nil {
		src = vbase.h.Offset
	}
	zero := !fromLog && (vbase == nil || no > vbase.h.DBPages)
	for _, sh := range s.shrinks {
		if sh.off >= src && sh.off < v.at && sh.pages < no && (!fromLog || sh.off > commit) {
			zero = true
		}
	}
	s.mu.RUnlock()
	if zero {
		return make([]byte, v.pageSize), nil
	}
	if fromLog {
		return s.commitPage(ctx, commit, end, no)
	}
	return s.basePage(ctx, vbase, no)
}

// commitPage returns page no of the commit record [off, end), fetching the record again
// when the cache no longer holds its pages.
func (s *Source) commitPage(ctx context.Context, off, end uint64, no uint32) ([]byte, error) {
	key := cacheKey{kind: fromCommit, off: off, n: no}
	if p, ok := s.cache.get(key); ok {
		return p, nil
	}
	v, err := s.once(ctx, cacheKey{kind: fromCommit, off: off}, func() (any, error) {
		var buf []byte
		for pos := off; pos < end; {
			s.requests.Add(1)
			rr, err := s.c.Read(ctx, s.url, client.ReadOptions{Offset: streamcore.FormatOffset(pos), MaxBytes: int(end - pos), IfIncarnation: s.inc})
			if err != nil {
				return nil, replicator.ClassifyRead(err, fmt.Sprintf("read of the commit at %d", off))
			}
			if len(rr.Data) == 0 {
				return nil, &replicator.Error{Kind: replicator.KindUnavailable, Action: replicator.ActionRetry,
					Message: fmt.Sprintf("stream read at %d returned nothing before %d", pos, end)}
			}
			s.bytes.Add(int64(len(rr.Data)))
			buf = append(buf, rr.Data...)
			pos += uint64(len(rr.Data))
		}
		recs, _, err := replicator.DecodeRecords(buf[:min(uint64(len(buf)), end-off)], off, s.opts.MaxFrame)
		if err != nil || len(recs) != 1 || recs[0].End != end || recs[0].Commit == nil {
			return nil, &replicator.Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop, Err: err,
				Message: fmt.Sprintf("the commit at %d does not read back as the one indexed", off)}
		}
		pages := make(map[uint32][]byte, len(recs[0].Commit.Pages))
		for _, p := range recs[0].Commit.Pages {
			s.cache.put(cacheKey{kind: fromCommit, off: off, n: p.No}, p.Data)
			pages[p.No] = p.Data
		}
		return pages, nil
	})
	if err != nil {
		return nil, err
	}
	// From the fetch itself: a record larger than the cache evicts its own pages.
	if p, ok := v.(map[uint32][]byte)[no]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("ursula: lazy: the commit at %d does not hold page %d", off, no)
}

// basePage returns page no of the snapshot b.
func (s *Source) basePage(ctx context.Context, b *base, no uint32) ([]byte, error) {
	ps := int64(b.h.PageSize)
	if b.file != nil {
		p := make([]byte, ps)
		if _, err := b.file.ReadAt(p, int64(no-1)*ps); err != nil {
			return nil, err
		}
		return p, nil
	}
	fi := b.x.FrameOf(no)
	key := cacheKey{kind: fromFrame, off: b.h.Offset, n: uint32(fi)}
	first, _ := b.x.FramePages(fi)
	slice := func(img []byte) []byte {
		lo := int64(no-first) * ps
		return img[lo : lo+ps : lo+ps]
	}
	if img, ok := s.cache.get(key); ok {
		s.keepAhead(b, fi)
		return slice(img), nil
	}
	var v any
	var err error
	if r, ok := s.fetchedAhead(fi); ok {
		// A frame of a run fetched ahead, still in flight (or just landed): wait for
		// that fetch (keyed by the run's first frame) and keep the runs ahead topped up.
		s.keepAhead(b, fi)
		v, err = s.once(ctx, cacheKey{kind: fromFrame, off: b.h.Offset, n: uint32(r.start)}, func() (any, error) {
			return s.fetchFrames(ctx, b, fi, r.end-fi)
		})
	} else {
		n, runs := s.plan(b, fi)
		// The runs ahead go in flight with this fetch, in parallel: from a store with a
		// long first-byte time (an S3 cold tier) a scan waits for one of them at most.
		for _, r := range runs {
			s.launch(cacheKey{kind: fromFrame, off: b.h.Offset, n: uint32(r.start)}, func() (any, error) {
				return s.fetchFrames(context.Background(), b, r.start, r.end-r.start)
			})
		}
		v, err = s.once(ctx, key, func() (any, error) { return s.fetchFrames(ctx, b, fi, n) })
	}
	if err != nil {
		return nil, err
	}
	// From the fetch itself (a run of frames larger than the cache evicts its first
	// ones), else from the cache (a fetch that found it cached), else alone.
	if img, ok := v.(map[int][]byte)[fi]; ok {
		return slice(img), nil
	}
	if img, ok := s.cache.peek(key); ok {
		return slice(img), nil
	}
	got, err := s.fetchFrames(ctx, b, fi, 1)
	if err != nil {
		return nil, err
	}
	if img, ok := got[fi]; ok {
		return slice(img), nil
	}
	return nil, fmt.Errorf("ursula: lazy: frame %d of the snapshot at %d fell out of the cache", fi, b.h.Offset)
}

// frameRun is the frames [start, end) of one ranged fetch.
type frameRun struct{ start, end int }

// frameBytes is the decoded size of one frame of b.
func frameBytes(b *base) int64 { return int64(b.x.PagesPerFrame) * int64(b.h.PageSize) }

// maxRun is the most frames one fetch in a run takes: ReadAhead, fewer when a run would
// take more than a quarter of the cache.
func (s *Source) maxRun(b *base) int {
	return int(max(1, min(int64(s.opts.ReadAhead), s.opts.CacheBytes/4/frameBytes(b))))
}

// runsAhead is how many runs of frames are fetched ahead of a reader going in order:
// Options.Parallel, fewer when they and the run being read would not fit in half the
// cache.
func (s *Source) runsAhead(b *base, run int) int {
	fit := s.opts.CacheBytes / 2 / max(1, int64(run)*frameBytes(b))
	return int(max(1, min(int64(s.opts.Parallel), fit-1)))
}

// plan decides how many frames from fi a fetch takes, and which runs to fetch ahead in
// the background: one frame for a lone read; frames read in order start a run of 2
// frames, each run fetched ahead doubling up to maxRun, with up to runsAhead runs
// fetched ahead of the reader.
func (s *Source) plan(b *base, fi int) (n int, ahead []frameRun) {
	frames := len(b.x.Frames)
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	if fi == s.lastSeq+1 || fi == s.lastSeq {
		s.run = min(max(2*s.run, 2), s.maxRun(b))
	} else {
		s.run = 1
	}
	s.ahead = s.ahead[:0]
	n = min(s.run, frames-fi)
	s.lastSeq = fi + n - 1
	if s.run > 1 {
		ahead = s.scheduleLocked(b, 0)
	}
	return n, ahead
}

// scheduleLocked adds runs after lastSeq to the runs fetched ahead until unreached (the
// runs the reader has not reached yet) is runsAhead, each run twice the last up to
// maxRun, and returns them.
func (s *Source) scheduleLocked(b *base, unreached int) []frameRun {
	var out []frameRun
	for {
		run := min(2*s.run, s.maxRun(b))
		start := s.lastSeq + 1
		n := min(run, len(b.x.Frames)-start)
		if n <= 0 || unreached >= s.runsAhead(b, run) {
			return out
		}
		r := frameRun{start, start + n}
		s.run = run
		s.ahead = append(s.ahead, r)
		s.lastSeq = r.end - 1
		unreached++
		out = append(out, r)
	}
}

// fetchedAhead reports the run fetched ahead that holds frame fi.
func (s *Source) fetchedAhead(fi int) (frameRun, bool) {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	for _, r := range s.ahead {
		if fi >= r.start && fi < r.end {
			return r, true
		}
	}
	return frameRun{}, false
}

// keepAhead keeps runsAhead runs of frames in flight ahead of a reader going in order:
// when it reaches the first frame of a run fetched ahead (cached, or arriving), the runs
// it has passed are dropped and as many new ones go in flight, so a scan rarely waits.
func (s *Source) keepAhead(b *base, fi int) {
	s.seqMu.Lock()
	if len(s.ahead) == 0 || fi < s.ahead[0].start || s.run < 2 {
		s.seqMu.Unlock()
		return
	}
	if fi >= s.ahead[len(s.ahead)-1].end {
		// Past every run (a jump to a cached frame): the reader left them.
		s.ahead = s.ahead[:0]
		s.seqMu.Unlock()
		return
	}
	reached := 0
	for reached < len(s.ahead) && s.ahead[reached].start <= fi {
		reached++
	}
	// The run being read stays listed (its frames may still be arriving).
	s.ahead = append(s.ahead[:0], s.ahead[reached-1:]...)
	runs := s.scheduleLocked(b, len(s.ahead)-1)
	s.seqMu.Unlock()
	for _, r := range runs {
		s.launch(cacheKey{kind: fromFrame, off: b.h.Offset, n: uint32(r.start)}, func() (any, error) {
			return s.fetchFrames(context.Background(), b, r.start, r.end-r.start)
		})
	}
}

// fetchFrames fetches frames [fi, fi+n) of b with one ranged GET, caches them and
// returns their images by frame; frames cached already are skipped at the ends of the
// range.
func (s *Source) fetchFrames(ctx context.Context, b *base, fi, n int) (map[int][]byte, error) {
	cached := func(i int) bool {
		_, ok := s.cache.peek(cacheKey{kind: fromFrame, off: b.h.Offset, n: uint32(i)})
		return ok
	}
	lo, hi := fi, min(fi+n, len(b.x.Frames))
	for lo < hi && cached(lo) {
		lo++
	}
	for hi > lo && cached(hi-1) {
		hi--
	}
	imgs := map[int][]byte{}
	if lo >= hi {
		return imgs, nil
	}
	start, last := b.x.Frames[lo], b.x.Frames[hi-1]
	end := last.Offset + uint64(last.Length)
	sr, err := s.getSnapshot(ctx, b.off, int64(start.Offset), int64(end))
	if err != nil {
		return nil, err
	}
	if sr.Digest != b.digest {
		return nil, superseded(b.off)
	}
	if uint64(len(sr.Data)) != end-start.Offset {
		return nil, damaged(fmt.Errorf("frames %d..%d: %d bytes, the index says %d", lo, hi-1, len(sr.Data), end-start.Offset), b.off)
	}
	for i := lo; i < hi; i++ {
		f := b.x.Frames[i]
		img, err := s.installFrame(b, i, sr.Data[f.Offset-start.Offset:f.Offset-start.Offset+uint64(f.Length)])
		if err != nil {
			return nil, err
		}
		imgs[i] = img
	}
	return imgs, nil
}

func (s *Source) installFrame(b *base, i int, data []byte) ([]byte, error) {
	img, err := b.x.DecodeFrame(i, data)
	if err != nil {
		return nil, damaged(err, b.off)
	}
	s.cache.putOwned(cacheKey{kind: fromFrame, off: b.h.Offset, n: uint32(i)}, img)
	return img, nil
}

// flight is one fetch in progress; others wanting the same key wait for it.
type flight struct {
	done chan struct{}
	val  any
	err  error
}

// once runs fetch unless a fetch of key is in flight, in which case it waits for that
// one, and returns the fetch's value.
func (s *Source) once(ctx context.Context, key cacheKey, fetch func() (any, error)) (any, error) {
	s.flightMu.Lock()
	if f, ok := s.inflight[key]; ok {
		s.flightMu.Unlock()
		select {
		case <-f.done:
			return f.val, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	s.inflight[key] = f
	s.flightMu.Unlock()
	s.land(key, f, fetch)
	return f.val, f.err
}

// launch runs fetch in the background as the flight of key, registered before it
// returns (so a reader arriving at once waits for it), unless one is in flight already.
func (s *Source) launch(key cacheKey, fetch func() (any, error)) {
	s.flightMu.Lock()
	if _, ok := s.inflight[key]; ok {
		s.flightMu.Unlock()
		return
	}
	f := &flight{done: make(chan struct{})}
	s.inflight[key] = f
	s.flightMu.Unlock()
	go s.land(key, f, fetch)
}

// land runs the fetch of flight f and wakes its waiters.
func (s *Source) land(key cacheKey, f *flight, fetch func() (any, error)) {
	f.val, f.err = fetch()
	s.flightMu.Lock()
	delete(s.inflight, key)
	s.flightMu.Unlock()
	close(f.done)
}

// IsSuperseded reports a read that failed because the snapshot it needed was replaced.
func IsSuperseded(err error) bool { return errors.Is(err, ErrSuperseded) }
