package coldtier

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// The flusher: every storage.cold.flush_interval, and whenever a write finds its group
// holding flush_size hot bytes (OverHotCap kicks it; not while it backs off from a failed
// store), it looks at each group; a group whose hot
// bytes reach storage.cold.flush_size gets its streams' oldest hot bytes uploaded as chunk
// objects of at most flush_size (full pieces first; partial tails only while the group
// stays over the threshold), at most flush_max_concurrency uploads at once. Each uploaded
// piece is then recorded with OpRecordChunk, in offset order per stream. Uploads read
// immutable slices of the hot buffer, so appends never wait for them. A failed upload
// backs the flusher off, doubling from flush_interval up to Options.BackoffMax.
//
// Not done yet (marked for later): packing the small tails of many streams into one
// object, flush_max_hot_age, compaction.

func (c *Tier) flushLoop() {
	interval := c.cfg.FlushInterval.D()
	backoff := time.Duration(0)
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		kick := c.kick
		if backoff > 0 {
			kick = nil // a failing store is retried on the backoff schedule only
		}
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-kick:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		err := c.flushOnce(false, "")
		next := interval
		if err != nil {
			if backoff == 0 {
				backoff = interval
			} else {
				backoff = min(2*backoff, c.opts.BackoffMax)
			}
			next = backoff
			c.opts.Logger.Warn("cold flush failed; backing off", "err", err, "retry_in", backoff)
		} else {
			backoff = 0
		}
		t.Reset(next)
	}
}

// flushPiece is one planned chunk.
type flushPiece struct {
	hs         engine.HotStream
	start, end uint64
	key        string
	err        error
}

// Flush runs one flush pass now. With all set, every hot byte of every group is flushed
// regardless of thresholds (tests, and the admin flush). It returns the first upload or
// record error.
func (c *Tier) Flush(all bool) error { return c.flushOnce(all, "") }

// flushOnce runs one pass; only != "" flushes every hot byte of that one stream.
func (c *Tier) flushOnce(all bool, only string) error {
	c.flush.Lock()
	defer c.flush.Unlock()
	defer c.endPass()
	size := uint64(c.cfg.FlushSize)
	var plan [][]*flushPiece // per stream, in offset order
	groups := c.eng.FlushGroups()
	if only != "" {
		groups, all = []uint64{c.eng.GroupOf(only)}, true
	}
	maxAge := c.cfg.MaxHotAge()
	now := time.Now()
	seen := map[string]bool{}
	for _, g := range groups {
		hot := c.eng.GroupHotBytes(g)
		if hot <= 0 {
			continue
		}
		if !all && hot < int64(size) {
			if maxAge > 0 {
				plan = append(plan, c.agedTails(g, size, maxAge, now, seen)...)
			}
			continue
		}
		streams := c.eng.HotStreams(g)
		if only != "" {
			var one []engine.HotStream
			for _, hs := range streams {
				if hs.Key == only {
					one = append(one, hs)
				}
			}
			streams = one
		}
		left := hot
		var rest []engine.HotStream
		for _, hs := range streams {
			var ps []*flushPiece
			from := hs.HotStart
			for from+size <= hs.Tail {
				ps = append(ps, &flushPiece{hs: hs, start: from, end: from + size})
				from += size
				left -= int64(size)
			}
			if from < hs.Tail {
				rest = append(rest, engine.HotStream{Key: hs.Key, Incarnation: hs.Incarnation, HotStart: from, Tail: hs.Tail})
			}
			if len(ps) > 0 {
				plan = append(plan, ps)
			}
		}
		for _, hs := range rest { // partial tails, biggest first, while still over
			if !all && left < int64(size/2) {
				break
			}
			p := &flushPiece{hs: hs, start: hs.HotStart, end: hs.Tail}
			left -= int64(p.end - p.start)
			attached := false
			for i, ps := range plan {
				if ps[0].hs.Key == hs.Key {
					plan[i] = append(ps, p)
					attached = true
				}
			}
			if !attached {
				plan = append(plan, []*flushPiece{p})
			}
		}
	}
	if only == "" && !all {
		for k := range c.hotMarks {
			if !seen[k] {
				delete(c.hotMarks, k)
			}
		}
	}
	if len(plan) == 0 {
		return nil
	}
	// Upload everything with bounded concurrency.
	sem := make(chan struct{}, max(1, c.cfg.FlushMaxConcurrency))
	var wg sync.WaitGroup
	for _, ps := range plan {
		for _, p := range ps {
			p.key = c.chunkKey(p.hs.Key, p.hs.Incarnation, p.start, p.end)
			c.Pin(p.key) // unreferenced until recorded: keep the collector away
			wg.Add(1)
			sem <- struct{}{}
			go func(p *flushPiece) {
				defer func() { <-sem; wg.Done() }()
				p.err = c.uploadPiece(p)
			}(p)
		}
	}
	wg.Wait()
	// Record in offset order; a stream stops at its first failed piece.
	var firstErr error
	for _, ps := range plan {
		failed := false
		for _, p := range ps {
			if !failed && p.err == nil {
				p.err = c.recordPiece(p)
			}
			if p.err != nil {
				failed = true
				if firstErr == nil && !errors.Is(p.err, errStreamMoved) {
					firstErr = p.err
				}
			}
			c.Unpin(p.key)
		}
	}
	return firstErr
}

// errStreamMoved: the stream changed under the flush (deleted, recreated, retained past
// the piece); the uploaded object is left to the collector.
var errStreamMoved = errors.New("stream changed during the flush")

func (c *Tier) uploadPiece(p *flushPiece) error {
	var data [][]byte
	var pin any
	ok := false
	c.eng.View(p.hs.Key, clockMs(), func(_ *streamcore.State, str *streamcore.Stream) {
		if str == nil || str.Incarnation != p.hs.Incarnation || str.Data.Base() > p.start || str.Tail() < p.end {
			return
		}
		data, pin, ok = str.Data.Slices(p.start, p.end), str.Data.Pin(), true
	})
	if !ok {
		return errStreamMoved
	}
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	err := c.store.Put(ctx, p.key, newSlicesReader(data), int64(p.end-p.start))
	runtime.KeepAlive(pin) // the blocks behind data stay mapped until the upload is done
	if err != nil {
		c.flushErrors.Add(1)
		return err
	}
	return nil
}

func (c *Tier) recordPiece(p *flushPiece) error {
	res, err := c.eng.Propose(context.Background(), &streamcore.Command{Op: streamcore.OpRecordChunk, Key: p.hs.Key, Now: clockMs(),
		IfIncarnation: p.hs.Incarnation, ChunkKey: p.key, Offset: p.start, ChunkEnd: p.end})
	if err != nil {
		return err
	}
	if res.Err != nil {
		return errStreamMoved
	}
	c.flushedBytes.Add(p.end - p.start)
	c.flushedObjects.Add(1)
	return nil
}

// slicesReader reads a list of byte slices as one body; it can seek (the S3 signer hashes
// the payload before sending it).
type slicesReader struct {
	parts [][]byte
	size  int64
	off   int64
}

func newSlicesReader(parts [][]byte) *slicesReader {
	r := &slicesReader{parts: parts}
	for _, p := range parts {
		r.size += int64(len(p))
	}
	return r
}

func (r *slicesReader) Read(b []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	n := 0
	pos := int64(0)
	for _, p := range r.parts {
		pl := int64(len(p))
		if r.off < pos+pl && n < len(b) {
			k := copy(b[n:], p[r.off-pos:])
			n += k
			r.off += int64(k)
		}
		pos += pl
		if n == len(b) {
			break
		}
	}
	return n, nil
}

// WriteTo writes the unread bytes to w piece by piece, without copying them (the fs
// store writes a chunk's blocks straight to its file).
func (r *slicesReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	pos := int64(0)
	for _, p := range r.parts {
		pl := int64(len(p))
		if r.off < pos+pl {
			n, err := w.Write(p[r.off-pos:])
			total += int64(n)
			r.off += int64(n)
			if err != nil {
				return total, err
			}
		}
		pos += pl
	}
	return total, nil
}

func (r *slicesReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.size
	}
	if offset < 0 {
		return 0, errors.New("slicesReader: negative position")
	}
	r.off = offset
	return offset, nil
}

// hotMark remembers since when a stream's hot start has not moved.
type hotMark struct {
	inc, start uint64
	since      time.Time
}

// agedTails plans whole-tail flushes of the streams of a group below the threshold whose
// hot start has not moved for maxAge (storage.cold.flush_max_hot_age). The caller holds
// c.flush.
func (c *Tier) agedTails(g uint64, size uint64, maxAge time.Duration, now time.Time, seen map[string]bool) [][]*flushPiece {
	if c.hotMarks == nil {
		c.hotMarks = map[string]hotMark{}
	}
	var plan [][]*flushPiece
	for _, hs := range c.eng.HotStreams(g) {
		seen[hs.Key] = true
		m, ok := c.hotMarks[hs.Key]
		if !ok || m.inc != hs.Incarnation || m.start != hs.HotStart {
			c.hotMarks[hs.Key] = hotMark{inc: hs.Incarnation, start: hs.HotStart, since: now}
			continue
		}
		if now.Sub(m.since) < maxAge {
			continue
		}
		var ps []*flushPiece
		for from := hs.HotStart; from < hs.Tail; from += size {
			ps = append(ps, &flushPiece{hs: hs, start: from, end: min(from+size, hs.Tail)})
		}
		plan = append(plan, ps)
	}
	return plan
}

// now is the command clock of the tier's proposals (unix milliseconds).
func clockMs() int64 { return time.Now().UnixMilli() }
