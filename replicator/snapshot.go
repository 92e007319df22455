package replicator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// Snapshots and retention (checklist-vfs P).
//
// When the log since the latest snapshot exceeds snapshot_due_bytes = max(database size,
// Options.SnapshotMinBytes), a goroutine of the replica publishes a snapshot at X, reads it
// back and compares the bytes, then moves retention to the previous snapshot (never to X).
//
// The image is never read from the live database file (a checkpoint may be writing it).
// It comes from the stream itself: a shadow image file <db>-ursula-snap, built at the
// first due cycle of an attach from the latest snapshot plus the records after it (the
// same code as Restore) and continued by each cycle with only the records since the
// previous one. X is the shadow's tail, a record boundary by construction. The shadow is
// not reused across attaches: the first cycle of an attach rebuilds it.
//
// Commit only signals the goroutine (a non-blocking send); nothing here runs on the
// commit path or holds the replica's lock for longer than copying a few fields.

const (
	// shadowSuffix names the shadow image beside the database file.
	shadowSuffix = "-ursula-snap"

	snapshotContentType = "application/octet-stream"
	backoffFirst        = 100 * time.Millisecond
	backoffCapSize      = time.Hour
	backoffCapOther     = 5 * time.Minute
	sizeClassMin        = 1 << 20 // a failure is "size" only for bodies over 1 MiB (P137)
)

// defaultOutagePullForward: the first successful commit after an outage brings the next
// attempt forward to within this, whatever Retry-After the outage asked for: the commit
// shows the server is back (Options.outagePullForward lowers it in tests).
const defaultOutagePullForward = 30 * time.Second

// Failure kinds of a snapshot attempt (checklist P137-139).
const (
	FailSize   = "size"
	FailOutage = "outage"
	FailOther  = "other"
)

// errRefused aborts a cycle because writes are refused; it is not a failure (P144).
var errRefused = errors.New("writes are refused")

// errImageTooLarge: the database image is over maxSnapshotImage.
var errImageTooLarge = errors.New("database image is over the snapshot limit")

type snapshotter struct {
	r      *Replica
	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	// Owned by the goroutine.
	shadowPath   string
	f            *os.File
	img          *Image    // state of the shadow; nil: none yet (or discarded after an error)
	notBefore    time.Time // no attempt before this (backoff)
	lastKind     string    // kind of the last failure ("" after a success)
	failDBBytes  uint64    // database size at the last failure (P140)
	pulled       bool      // the outage pull-forward (P141) was used since the last failure
	maxKnownBody int       // largest body this owner published or installed (P137)
	verified     []uint64  // snapshot offsets this owner read back or decoded (the latest few)
	maxReqBytes  int64     // Ursula-Max-Request-Bytes of the last HEAD, -1: absent
	maxSnapBytes int64     // Ursula-Max-Snapshot-Bytes of the last HEAD, -1: absent (no parts)

	mu          sync.Mutex // guards the fields below; Status reads them
	snapOff     int64      // latest snapshot offset known, -1: none
	retained    uint64
	publishedAt time.Time // last publish by this owner; zero: none
	failures    int       // in a row
	lastError   string
	bodyBytes   int64 // compressed size of the latest body built, -1: none since attach
}

// snapView is what the goroutine needs from the replica, copied under its lock.
type snapView struct {
	tail    uint64
	dbBytes uint64
	refused bool
}

func (r *Replica) snapView() snapView {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapView{
		tail:    r.tail,
		dbBytes: r.dbBytes,
		// too_large fails one transaction alone and does not hold snapshots back (P145).
		refused: r.fenced || r.poisoned || r.lastErr != nil && r.lastErr.Kind != KindTooLarge,
	}
}

// startSnapshots starts the snapshot goroutine of a replica that just attached; img is
// what the attach rebuilt or resumed, info the HEAD it made. A new attach has no backoff.
func (r *Replica) startSnapshots(img *Image, info *client.StreamInfo) {
	r.dbBytes = uint64(img.DBPages) * uint64(img.PageSize)
	ctx, cancel := context.WithCancel(context.Background())
	s := &snapshotter{
		r: r, kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}),
		shadowPath: r.path + shadowSuffix, snapOff: -1, bodyBytes: -1, maxReqBytes: -1, maxSnapBytes: -1,
	}
	s.noteHead(info)
	if info != nil {
		if off, err := streamcore.ParseOffset(info.SnapshotOffset); err == nil && info.SnapshotOffset != "" {
			s.snapOff = int64(off)
		}
		s.retained, _ = streamcore.ParseOffset(info.RetainedOffset)
	}
	r.snap = s
	go s.run(ctx)
}

// Close stops the replica's background work (the snapshot goroutine, waiting for it to
// finish; an upload in flight is cancelled) and removes the shadow image. It does not
// touch the stream or the database file. Safe to call more than once.
func (r *Replica) Close() error {
	if s := r.snap; s != nil {
		s.once.Do(func() {
			s.cancel()
			<-s.done
		})
	}
	return nil
}

// poke tells the goroutine a commit succeeded. It never blocks.
func (s *snapshotter) poke() {
	if s == nil {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *snapshotter) run(ctx context.Context) {
	defer close(s.done)
	defer s.dropShadow()
	for {
		if d := time.Until(s.notBefore); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-s.kick:
				t.Stop()
				s.committedDuringBackoff()
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		if v := s.r.snapView(); !v.refused && s.due(v) {
			s.safeCycle(ctx)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
	}
}

// committedDuringBackoff applies the rules that bring a waiting attempt forward.
func (s *snapshotter) committedDuringBackoff() {
	v := s.r.snapView()
	switch {
	case s.failDBBytes > 0 && v.dbBytes < s.failDBBytes-s.failDBBytes/4:
		// The database shrank by more than a quarter since the failure (VACUUM): P140.
		s.notBefore = time.Time{}
	case s.lastKind == FailOutage && !s.pulled && time.Until(s.notBefore) > s.r.opts.outagePullForward:
		// The first successful commit after an outage: P141.
		s.notBefore = time.Now().Add(s.r.opts.outagePullForward)
		s.pulled = true
	}
}

// dueBytes is max(database size, SnapshotMinBytes).
func (r *Replica) dueBytes(dbBytes uint64) uint64 {
	return max(dbBytes, uint64(r.opts.SnapshotMinBytes))
}

func (s *snapshotter) due(v snapView) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return v.tail-uint64(max(s.snapOff, 0)) > s.r.dueBytes(v.dbBytes)
}

// safeCycle runs a cycle; a panic in it is logged and counted as a failed attempt, and
// the goroutine goes on (checklist P148).
func (s *snapshotter) safeCycle(ctx context.Context) {
	defer func() {
		if p := recover(); p != nil {
			s.r.logAt("error", "snapshot_thread_panicked", "message=%q", fmt.Sprint(p))
			s.dropShadow()
			s.fail(ctx, fmt.Errorf("snapshot thread panicked: %v", p), 0, 0)
		}
	}()
	s.cycle(ctx)
}

// cycle makes one attempt: build, publish, read back, then move retention.
func (s *snapshotter) cycle(ctx context.Context) {
	if s.r.opts.beforeCycle != nil {
		s.r.opts.beforeCycle()
	}
	start := time.Now()
	v := s.r.snapView()
	blob, x, err := s.build(ctx, v.tail)
	defer blob.remove()
	built := time.Now()
	if err == nil {
		s.mu.Lock()
		s.bodyBytes = blob.size
		s.mu.Unlock()
		err = s.publish(ctx, x, blob)
	}
	xm := int64(-1) // the offset a measurement reports
	if blob != nil {
		xm = int64(x)
	}
	bodyLen := blob.len()
	if errors.Is(err, errRefused) {
		s.r.recordSnapshot(start, xm, bodyLen, SnapshotAborted, "", nil)
		return // not counted; the next successful commit wakes us (P144)
	}
	if err != nil {
		s.fail(ctx, err, bodyLen, v.dbBytes)
		if ctx.Err() == nil {
			s.r.recordSnapshot(start, xm, bodyLen, SnapshotFailed, s.lastKind, err)
		}
		return
	}
	s.r.recordSnapshot(start, xm, bodyLen, SnapshotPublished, "", nil)
	s.mu.Lock()
	prev, retained := s.snapOff, s.retained
	s.snapOff, s.publishedAt = int64(x), time.Now()
	s.failures, s.lastError = 0, ""
	s.mu.Unlock()
	s.notBefore, s.lastKind, s.failDBBytes, s.pulled = time.Time{}, "", 0, false
	s.maxKnownBody = max(s.maxKnownBody, bodyLen)
	s.verify(x)
	s.r.logAt("info", "snapshot_published", "offset=%d bytes=%d image_bytes=%d epoch=%d build_ms=%d ms=%d",
		x, bodyLen, uint64(s.img.DBPages)*uint64(s.img.PageSize), s.img.Epoch, built.Sub(start).Milliseconds(), time.Since(start).Milliseconds())

	// Retention goes to the previous snapshot, never to the one just published, so a
	// reader that started from the previous one can still replay past it. A failure is
	// not a snapshot failure; the next snapshot's retention move covers it (P143).
	if prev < 0 || uint64(prev) <= retained {
		return
	}
	if !slices.Contains(s.verified, uint64(prev)) {
		// Published by an earlier owner that may have crashed before reading it back, and
		// not decoded by this one: retention never goes past an unverified snapshot (T6).
		// The next snapshot's move goes to the one just verified.
		s.r.logAt("warn", "retention_failed", "offset=%d err=%q", prev, "the previous snapshot was not verified by this owner")
		return
	}
	wr, err := s.r.opts.Client.Retain(ctx, s.r.url, streamcore.FormatOffset(uint64(prev)))
	if err != nil {
		if ctx.Err() == nil {
			s.r.logAt("warn", "retention_failed", "offset=%d err=%q", prev, err.Error())
		}
		return
	}
	ret := uint64(prev)
	if n, err := streamcore.ParseOffset(wr.RetainedOffset); err == nil && wr.RetainedOffset != "" {
		ret = n
	}
	s.mu.Lock()
	s.retained = max(s.retained, ret)
	s.mu.Unlock()
	s.r.logAt("info", "retention_moved", "offset=%d", ret)
}

// build brings the shadow up to target and returns the snapshot body of it (in its file)
// and its offset.
func (s *snapshotter) build(ctx context.Context, target uint64) (*snapBlob, uint64, error) {
	c, maxFrame := s.r.opts.Client, s.r.opts.MaxFrameBytes
	if s.img == nil {
		info, err := c.Head(ctx, s.r.url)
		if err != nil {
			return nil, 0, classifyRead(err, "HEAD of the stream")
		}
		s.noteHead(info)
		f, err := os.OpenFile(s.shadowPath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, 0, newError(KindLocalSetup, ActionFix, err, "creating the shadow image")
		}
		img := &Image{}
		installed, err := rebuild(ctx, c, s.r.url, f, img, info, target, maxFrame, nil)
		if retained, _ := streamcore.ParseOffset(info.RetainedOffset); errors.Is(err, errBadSnapshot) && retained == 0 {
			// The latest snapshot is not one this version can read (damaged, or another
			// writer's): the whole stream is still there, so build the shadow without it
			// instead of failing every attempt. Retention never moves to it (not verified).
			s.r.logAt("warn", "snapshot_unreadable", "offset=%s err=%q", info.SnapshotOffset, err.Error())
			noSnap := *info
			noSnap.SnapshotOffset = ""
			img = &Image{}
			if err = f.Truncate(0); err == nil {
				installed, err = rebuild(ctx, c, s.r.url, f, img, &noSnap, target, maxFrame, nil)
			}
		}
		s.f, s.img = f, img
		if err != nil {
			s.dropShadow()
			return nil, 0, err
		}
		s.maxKnownBody = max(s.maxKnownBody, installed)
		if installed > 0 {
			// The shadow starts from the latest snapshot, decoded whole (crc, geometry, the
			// offset in its header): retention may move to it.
			off, _ := streamcore.ParseOffset(info.SnapshotOffset)
			s.verify(off)
		}
	} else if err := catchUp(ctx, c, s.r.url, s.f, s.img, target, maxFrame); err != nil {
		s.dropShadow()
		return nil, 0, err
	}
	img := s.img
	if img.PageSize == 0 {
		return nil, 0, fmt.Errorf("the stream up to %d holds no commit", img.Tail)
	}
	size := uint64(img.DBPages) * uint64(img.PageSize)
	if size > maxSnapshotImage {
		return nil, 0, fmt.Errorf("%w: %d bytes, limit %d", errImageTooLarge, size, maxSnapshotImage)
	}
	blob, err := s.writeBlob(SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: img.Tail}, int64(size))
	if err != nil {
		s.dropShadow()
		return nil, 0, err
	}
	return blob, img.Tail, nil
}

// fail counts a failed attempt, classifies it and schedules the next one.
func (s *snapshotter) fail(ctx context.Context, err error, bodyLen int, dbBytes uint64) {
	if ctx.Err() != nil {
		return // closing: not a failure
	}
	kind, retryAfter := s.classify(ctx, err, bodyLen)
	s.mu.Lock()
	s.failures++
	n := s.failures
	s.lastError = err.Error()
	s.mu.Unlock()
	d := max(jitter(backoff(n, kind)), retryAfter)
	s.notBefore, s.lastKind, s.failDBBytes, s.pulled = time.Now().Add(d), kind, dbBytes, false
	reason := ""
	if errors.Is(err, errSnapshotTooLarge) || errors.Is(err, errImageTooLarge) {
		reason = " reason=" + reasonTooLarge
	}
	s.r.logAt("warn", "snapshot_failed", "failures=%d retry_ms=%d kind=%s%s err=%q", n, d.Milliseconds(), kind, reason, err.Error())
}

// classify names a failure size, outage or other (checklist P137-139) and returns the
// Retry-After to honour.
func (s *snapshotter) classify(ctx context.Context, err error, bodyLen int) (string, time.Duration) {
	if errors.Is(err, errImageTooLarge) || errors.Is(err, errSnapshotTooLarge) {
		return FailSize, 0
	}
	var ce *client.Error
	errors.As(err, &ce)
	if ce != nil && ce.Status == http.StatusServiceUnavailable && (ce.RetryAfter > 0 || ce.NotApplied != "") {
		return FailOutage, ce.RetryAfter
	}
	if bodyLen > sizeClassMin && bodyLen > s.maxKnownBody {
		// A body larger than any this owner published or installed fails while the stream
		// still answers: the body is what is refused (a 413, or a reset by a front layer).
		if ce != nil && ce.Status != 0 {
			return FailSize, 0
		}
		if ce != nil {
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, herr := s.r.opts.Client.Head(hctx, s.r.url)
			cancel()
			if herr == nil {
				return FailSize, 0
			}
		}
	}
	if ce != nil && ce.Status == 0 {
		return FailOutage, 0
	}
	return FailOther, 0
}

// backoff is the wait after the n-th failure in a row: 100 ms, doubling, capped.
func backoff(n int, kind string) time.Duration {
	limit := backoffCapOther
	if kind == FailSize {
		limit = backoffCapSize
	}
	d := backoffFirst
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// verify remembers a snapshot offset this owner read back or decoded.
func (s *snapshotter) verify(off uint64) {
	s.verified = append(s.verified, off)
	if len(s.verified) > 4 {
		s.verified = s.verified[1:]
	}
}

// dropShadow closes and removes the shadow image; the next cycle rebuilds it.
func (s *snapshotter) dropShadow() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	s.img = nil
	os.Remove(s.shadowPath)
}

// fill adds the snapshot fields to a status; r.mu is held.
func (s *snapshotter) fill(st *Status, tail, due uint64) {
	st.Snapshot, st.Retained, st.SnapshotDueBytes = "-1", streamcore.FormatOffset(0), due
	st.LogBytes = tail
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapOff >= 0 {
		st.Snapshot = streamcore.FormatOffset(uint64(s.snapOff))
		st.LogBytes = tail - min(tail, uint64(s.snapOff))
	}
	st.Retained = streamcore.FormatOffset(s.retained)
	if !s.publishedAt.IsZero() {
		ms := time.Since(s.publishedAt).Milliseconds()
		st.SnapshotAgeMs = &ms
	}
	st.SnapshotFailures = s.failures
	st.SnapshotError = s.lastError
	if s.bodyBytes >= 0 {
		b := s.bodyBytes
		st.SnapshotBytes = &b
	}
}

// snapshotStatus fills the snapshot fields of st; r.mu is held.
func (r *Replica) snapshotStatus(st *Status) {
	r.snap.fill(st, r.tail, r.dueBytes(r.dbBytes))
}

// logAt writes one logfmt event line at a level.
func (r *Replica) logAt(level, event, format string, args ...any) {
	fmt.Fprintf(r.opts.Log, "sqlite-ursula-vfs level=%s event=%s url=%q %s\n", level, event, r.url, fmt.Sprintf(format, args...))
}
