package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/streamcore"
)

// Snapshot upload in parts (checklist-protocol 22, spec "Upload in Parts"). Parts are
// staged as objects of the cold store under {cluster}/__parts/, keyed by the stream
// incarnation they were staged for; nothing about them is replicated, so a part staged on
// one leader is visible to the next through the shared store. A commit lists the
// incarnation's parts, copies the named ones in order into one snapshot object while it
// computes the digest (reading a few pieces ahead), then proposes an ordinary publish that
// carries only the object's key, exactly like a large single-request publish.
//
// The leader counts each stream's staged bytes and parts in memory to bound them; it
// lists the stream's parts at its first part, after every commit and discard, and at a
// refused part when its last listing is over a minute old. The counts are approximate
// around concurrent uploads (a part finishing during a listing may count twice until the
// next listing), which errs on the side of refusing.

// Bounds of the parts protocol (spec section 10 and the "Upload in Parts" notes).
const (
	DefaultMaxSnapshotBytes = 1 << 30 // Ursula-Max-Snapshot-Bytes
	DefaultMaxStagedParts   = 8192    // Ursula-Max-Staged-Parts
	DefaultMaxStagedBytes   = 2 << 30 // Ursula-Max-Staged-Bytes

	partsDirName      = "__parts/"
	commitsPerNode    = 2           // commits copying at once on one node
	partsRelistAge    = time.Minute // a refused part relists when the last listing is older
	oldPartsMargin    = time.Minute // parts of earlier incarnations younger than this stay
	maxPartID         = 64
	maxCommitListSize = streamcore.MaxSnapshotParts * (maxPartID + 1)
	assemblePiece     = 8 << 20 // bytes per ranged read while assembling
	assembleAhead     = 4       // ranged reads in flight while assembling
	commitTimeout     = 30 * time.Minute
)

// partsLedger is the node's bookkeeping of staged parts and running commits.
type partsLedger struct {
	mu        sync.Mutex
	streams   map[string]*stagedParts // by stream key
	commits   int                     // commits copying now (node-wide)
	committed atomic.Uint64           // snapshots published from parts
	staged    atomic.Uint64           // parts staged
}

// stagedParts counts one stream's staged, unused parts (every incarnation).
type stagedParts struct {
	count         int
	bytes         int64
	inflight      int
	inflightBytes int64
	listed        time.Time       // last listing; zero: never listed here
	busy          map[uint64]bool // incarnations with a commit or discard running
}

func (p *partsLedger) get(key string) *stagedParts {
	if p.streams == nil {
		p.streams = map[string]*stagedParts{}
	}
	sp := p.streams[key]
	if sp == nil {
		sp = &stagedParts{busy: map[uint64]bool{}}
		p.streams[key] = sp
	}
	return sp
}

// forget drops an idle entry (no parts known, nothing running).
func (p *partsLedger) forget(key string) {
	if sp := p.streams[key]; sp != nil && sp.count == 0 && sp.inflight == 0 && len(sp.busy) == 0 {
		delete(p.streams, key)
	}
}

// stagedBytes sums the staged bytes the ledger knows of (metrics).
func (p *partsLedger) stagedBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, sp := range p.streams {
		n += sp.bytes
	}
	return n
}

// relistAll makes every stream list its parts again at its next part (after the
// collector reclaimed some).
func (p *partsLedger) relistAll() {
	p.mu.Lock()
	for _, sp := range p.streams {
		sp.listed = time.Time{}
	}
	p.mu.Unlock()
}

// begin marks a commit or discard of (key, inc) as running; false when one already is.
func (p *partsLedger) begin(key string, inc uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := p.get(key)
	if sp.busy[inc] {
		return false
	}
	sp.busy[inc] = true
	return true
}

func (p *partsLedger) end(key string, inc uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.get(key).busy, inc)
	p.forget(key)
}

func (p *partsLedger) takeCommit() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.commits >= commitsPerNode {
		return false
	}
	p.commits++
	return true
}

func (p *partsLedger) releaseCommit() {
	p.mu.Lock()
	p.commits--
	p.mu.Unlock()
}

func (c *coldTier) partsPrefix(key string) string { return c.root + partsDirName + streamPath(key) }

func (c *coldTier) partsDir(key string, inc uint64) string {
	return c.partsPrefix(key) + strconv.FormatUint(inc, 10) + "/"
}

func (c *coldTier) isPart(objectKey string) bool {
	return strings.HasPrefix(objectKey, c.root+partsDirName)
}

func (c *coldTier) maxSnapshotBytes() int64 {
	if c.opts.MaxSnapshotBytes > 0 {
		return c.opts.MaxSnapshotBytes
	}
	return DefaultMaxSnapshotBytes
}

func (c *coldTier) maxStaged() (int, int64) {
	n, b := DefaultMaxStagedParts, int64(DefaultMaxStagedBytes)
	if c.opts.MaxStagedParts > 0 {
		n = c.opts.MaxStagedParts
	}
	if c.opts.MaxStagedBytes > 0 {
		b = c.opts.MaxStagedBytes
	}
	return n, b
}

// stagedPart is one listed part object.
type stagedPart struct {
	inc  uint64
	id   string
	info coldstore.ObjectInfo
}

// listParts lists the staged parts of every incarnation of a stream.
func (c *coldTier) listParts(ctx context.Context, key string) ([]stagedPart, error) {
	pre := c.partsPrefix(key)
	var out []stagedPart
	err := c.store.List(ctx, pre, func(o coldstore.ObjectInfo) bool {
		incText, id, ok := strings.Cut(strings.TrimPrefix(o.Key, pre), "/")
		inc, err := strconv.ParseUint(incText, 10, 64)
		if ok && err == nil && id != "" && !strings.Contains(id, "/") {
			out = append(out, stagedPart{inc: inc, id: id, info: o})
		}
		return true
	})
	return out, err
}

// relist counts a stream's parts anew. With dropOld it first deletes the parts of
// earlier incarnations staged more than oldPartsMargin before now (a part's or a
// discard's listing; a commit's listing only counts).
func (c *coldTier) relist(ctx context.Context, key string, cur uint64, now time.Time, dropOld bool) ([]stagedPart, error) {
	parts, err := c.listParts(ctx, key)
	if err != nil {
		return nil, err
	}
	kept := parts[:0]
	for _, p := range parts {
		if dropOld && p.inc < cur && p.info.ModTime.Before(now.Add(-oldPartsMargin)) && !c.pinned(p.info.Key) &&
			c.store.Delete(ctx, p.info.Key) == nil {
			continue
		}
		kept = append(kept, p)
	}
	c.setCounts(key, kept, now)
	return kept, nil
}

func (c *coldTier) setCounts(key string, parts []stagedPart, now time.Time) {
	var n int64
	for _, p := range parts {
		n += p.info.Size
	}
	c.parts.mu.Lock()
	sp := c.parts.get(key)
	sp.count, sp.bytes, sp.listed = len(parts), n, now
	c.parts.forget(key)
	c.parts.mu.Unlock()
}

// admitPart reserves room for one part of reserve bytes, or answers the 429 of the bound
// it would cross (decided from the request's head, before the body is read).
func (c *coldTier) admitPart(ctx context.Context, key string, inc uint64, reserve int64) *streamcore.Error {
	maxParts, maxBytes := c.maxStaged()
	over := func(sp *stagedParts) (string, int64) {
		if sp.count+sp.inflight+1 > maxParts {
			return streamcore.HdrMaxStagedParts, int64(maxParts)
		}
		if sp.bytes+sp.inflightBytes+reserve > maxBytes {
			return streamcore.HdrMaxStagedBytes, maxBytes
		}
		return "", 0
	}
	listedNow := false
	for {
		c.parts.mu.Lock()
		sp := c.parts.get(key)
		hdr, bound := over(sp)
		// The first part here, or a refusal on a count over a minute old: list, decide again.
		if !listedNow && (sp.listed.IsZero() || hdr != "" && time.Since(sp.listed) > partsRelistAge) {
			c.parts.mu.Unlock()
			c.relist(ctx, key, inc, time.Now(), true)
			listedNow = true
			continue
		}
		defer c.parts.mu.Unlock()
		if hdr != "" {
			return streamcore.Errorf(http.StatusTooManyRequests, streamcore.CodeStagedPartsLimit,
				"the stream holds %d staged parts (%d bytes) that no commit used; commit or discard them (DELETE .../snapshot/parts) before staging more", sp.count, sp.bytes).
				With(hdr, strconv.FormatInt(bound, 10)).With(streamcore.HdrIncarnation, u64(inc))
		}
		sp.inflight++
		sp.inflightBytes += reserve
		return nil
	}
}

// partDone releases a reservation; size >= 0 counts a part that was stored.
func (c *coldTier) partDone(key string, reserve, size int64) {
	c.parts.mu.Lock()
	defer c.parts.mu.Unlock()
	sp := c.parts.get(key)
	sp.inflight--
	sp.inflightBytes -= reserve
	if size >= 0 {
		sp.count++
		sp.bytes += size
	}
	c.parts.forget(key)
}

// partsRequest checks what a part or a discard needs before anything else: a well-formed
// Stream-Incarnation, a cold store, the stream's leader here, the stream and the
// precondition. It returns the stream's incarnation.
func (s *Server) partsRequest(r *http.Request, key string) (uint64, *streamcore.Error) {
	ifInc, e := parseIncarnation(r)
	if e != nil {
		return 0, e
	}
	if s.cold == nil {
		return 0, noColdStore()
	}
	if e := s.leaderFor(key); e != nil {
		return 0, e
	}
	return s.partsTarget(key, ifInc)
}

// partsTarget checks that the stream exists and matches the Stream-Incarnation
// precondition, and returns its incarnation.
func (s *Server) partsTarget(key string, ifInc uint64) (uint64, *streamcore.Error) {
	var inc uint64
	var e *streamcore.Error
	s.engine.View(key, s.now(), func(st *streamcore.State, str *streamcore.Stream) {
		switch {
		case str == nil || str.SoftDeleted:
			e = st.NotFound(key)
		case ifInc != 0 && ifInc != str.Incarnation:
			e = incarnationMismatch(str.Incarnation)
		default:
			inc = str.Incarnation
		}
	})
	return inc, e
}

func incarnationMismatch(inc uint64) *streamcore.Error {
	return streamcore.Errorf(http.StatusPreconditionFailed, streamcore.CodeIncarnationMismatch, "Stream-Incarnation does not match the stream's current incarnation").
		With(streamcore.HdrIncarnation, u64(inc))
}

// leaderFor refuses a parts request on a node that does not lead the stream's group.
func (s *Server) leaderFor(key string) *streamcore.Error {
	if lv, ok := s.engine.(LeaderVerifier); ok {
		return leaderError(lv.LeaderHint(key), false)
	}
	return nil
}

func partsBusy(code, format string, args ...any) *streamcore.Error {
	return streamcore.Errorf(http.StatusServiceUnavailable, code, format, args...).With(streamcore.HdrRetryAfter, "1")
}

// handleStagePart serves POST {stream}/snapshot/{offset}/parts.
func (s *Server) handleStagePart(w http.ResponseWriter, r *http.Request, t *target, offText string) {
	if _, err := streamcore.ParseOffset(offText); err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidOffset, "%s", err.Error()))
		return
	}
	inc, e := s.partsRequest(r, t.key)
	if e == nil && r.ContentLength > streamcore.MaxRequestBytes {
		e = tooLarge(true)
	}
	reserve := r.ContentLength
	if reserve < 0 {
		reserve = streamcore.MaxRequestBytes // no Content-Length: counts the most a part may be
	}
	c := s.cold
	if e == nil {
		e = c.admitPart(r.Context(), t.key, inc, reserve)
	}
	if e != nil {
		drainBody(r)
		s.writeError(w, r, e)
		return
	}
	stored := int64(-1)
	defer func() { c.partDone(t.key, reserve, stored) }()
	body, e := readBody(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	var rnd [16]byte
	rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	if err := c.store.Put(ctx, c.partsDir(t.key, inc)+id, bytes.NewReader(body), int64(len(body))); err != nil {
		s.writeError(w, r, coldStoreFailed(err))
		return
	}
	stored = int64(len(body))
	c.parts.staged.Add(1)
	w.Header().Set(streamcore.HdrSnapshotPart, id)
	w.Header().Set(streamcore.HdrIncarnation, u64(inc))
	w.WriteHeader(http.StatusCreated)
}

// handleDiscardParts serves DELETE {stream}/snapshot/parts: every part of the current
// incarnation goes, and those of earlier incarnations staged over a minute ago.
func (s *Server) handleDiscardParts(w http.ResponseWriter, r *http.Request, t *target) {
	drainBody(r)
	inc, e := s.partsRequest(r, t.key)
	c := s.cold
	if e == nil && !c.parts.begin(t.key, inc) {
		e = partsBusy(streamcore.CodeCommitInProgress, "a commit or discard of this stream's parts is running; retry when it ends")
	}
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	defer c.parts.end(t.key, inc)
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Minute)
	defer cancel()
	now := time.Now()
	parts, err := c.listParts(ctx, t.key)
	if err != nil {
		s.writeError(w, r, coldStoreFailed(err))
		return
	}
	var failed error
	kept := parts[:0]
	for _, p := range parts {
		drop := p.inc == inc || p.inc < inc && p.info.ModTime.Before(now.Add(-oldPartsMargin))
		if !drop || c.pinned(p.info.Key) {
			kept = append(kept, p)
			continue
		}
		if err := c.store.Delete(ctx, p.info.Key); err != nil {
			failed = err
			kept = append(kept, p)
		}
	}
	c.setCounts(t.key, kept, now)
	if failed != nil {
		s.writeError(w, r, coldStoreFailed(failed))
		return
	}
	w.Header().Set(streamcore.HdrIncarnation, u64(inc))
	w.WriteHeader(http.StatusNoContent)
}

// handleCommitParts serves PUT {stream}/snapshot/{offset} with Stream-Snapshot-Parts.
func (s *Server) handleCommitParts(w http.ResponseWriter, r *http.Request, t *target, off, ifInc uint64, ct string) {
	e := func() *streamcore.Error {
		if s.cold == nil {
			return noColdStore()
		}
		nText := r.Header.Get(streamcore.HdrSnapshotParts)
		n, err := strconv.Atoi(nText)
		if err != nil || n < 1 || n > streamcore.MaxSnapshotParts || strconv.Itoa(n) != nText {
			return invalidCommit("Stream-Snapshot-Parts must be a decimal from 1 to %d without sign or leading zero", streamcore.MaxSnapshotParts)
		}
		return nil
	}()
	if e != nil {
		drainBody(r)
		s.writeError(w, r, e)
		return
	}
	digest := r.Header.Get(streamcore.HdrSnapshotDigest)
	n, _ := strconv.Atoi(r.Header.Get(streamcore.HdrSnapshotParts))
	list, err := io.ReadAll(io.LimitReader(r.Body, maxCommitListSize+1))
	drainBody(r)
	switch {
	case err != nil:
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeBodyUnreadable, "request body could not be read"))
		return
	case len(list) > maxCommitListSize:
		s.writeError(w, r, invalidCommit("the body is longer than any list of %d part ids", streamcore.MaxSnapshotParts))
		return
	case digest == "":
		s.writeError(w, r, invalidCommit("a commit needs Stream-Snapshot-Digest, the digest of the assembled snapshot"))
		return
	}
	if e := s.leaderFor(t.key); e != nil {
		s.writeError(w, r, e)
		return
	}
	// The commit's key first: a repeat succeeds and a superseded or conflicting commit
	// answers 409 even when its parts are gone, and before the retention check.
	var inc uint64
	var latest *streamcore.Snapshot
	s.engine.View(t.key, s.now(), func(st *streamcore.State, str *streamcore.Stream) {
		switch {
		case str == nil || str.SoftDeleted:
			e = st.NotFound(t.key)
		default:
			inc = str.Incarnation
			if sn := str.Snapshot; sn != nil {
				latest = &streamcore.Snapshot{Offset: sn.Offset, Digest: sn.Digest}
			}
		}
	})
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if sn := latest; sn != nil && (off < sn.Offset || off == sn.Offset && digest != sn.Digest) {
		s.writeError(w, r, streamcore.Errorf(http.StatusConflict, streamcore.CodeSnapshotConflict, "a different snapshot is the latest").
			With(streamcore.HdrSnapshotOffset, streamcore.FormatOffset(sn.Offset)).With(streamcore.HdrSnapshotDigest, sn.Digest))
		return
	}
	if latest != nil && off == latest.Offset {
		// A repeat of the published snapshot: the publish answers it from the key.
		res, e := s.propose(r.Context(), &streamcore.Command{Op: streamcore.OpPublishSnapshot, Key: t.key, Now: s.now(), IfIncarnation: ifInc,
			Offset: off, SnapshotType: ct, SnapshotDigest: digest, BoundaryChecked: s.coldBoundary(t.key, off)})
		if e != nil {
			s.writeError(w, r, e)
			return
		}
		s.writeResult(w, r, t, res)
		return
	}
	if ifInc != 0 && ifInc != inc {
		s.writeError(w, r, incarnationMismatch(inc))
		return
	}
	ids, e := parsePartList(list, n)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	c := s.cold
	if !c.parts.begin(t.key, inc) {
		s.writeError(w, r, partsBusy(streamcore.CodeCommitInProgress, "a commit or discard of this stream's parts is running; retry when it ends"))
		return
	}
	if !c.parts.takeCommit() {
		c.parts.end(t.key, inc)
		s.writeError(w, r, partsBusy(streamcore.CodeCommitsBusy, "this node is assembling %d snapshots already; retry shortly", commitsPerNode))
		return
	}
	// The node owns the commit from here: a client that goes away cancels nothing, and a
	// repeat answers 503 while it runs and from the key after.
	type answer struct {
		res streamcore.Result
		e   *streamcore.Error
	}
	done := make(chan answer, 1)
	go func() {
		defer c.parts.end(t.key, inc)
		defer c.parts.releaseCommit()
		res, e := s.commitParts(t.key, inc, ifInc, off, ct, digest, ids)
		done <- answer{res, e}
	}()
	select {
	case a := <-done:
		if a.e != nil {
			s.writeError(w, r, a.e)
			return
		}
		s.writeResult(w, r, t, a.res)
	case <-r.Context().Done():
	}
}

func invalidCommit(format string, args ...any) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidPartsCommit, format, args...)
}

// parsePartList checks a commit body: exactly n distinct ids of 1 to 64 visible ASCII
// characters, each followed by one LF and nothing else.
func parsePartList(body []byte, n int) ([]string, *streamcore.Error) {
	if len(body) == 0 || body[len(body)-1] != '\n' {
		return nil, invalidCommit("the body must list the part ids, each followed by one LF")
	}
	lines := strings.Split(string(body[:len(body)-1]), "\n")
	if len(lines) != n {
		return nil, invalidCommit("the body lists %d part ids; Stream-Snapshot-Parts says %d", len(lines), n)
	}
	seen := make(map[string]bool, n)
	for i, id := range lines {
		if len(id) == 0 || len(id) > maxPartID {
			return nil, invalidCommit("part id %d must be 1 to %d characters", i+1, maxPartID)
		}
		for j := 0; j < len(id); j++ {
			if id[j] < 0x21 || id[j] > 0x7e {
				return nil, invalidCommit("part id %d has a character that is not visible ASCII", i+1)
			}
		}
		if seen[id] {
			return nil, invalidCommit("part id %q is listed twice", id)
		}
		seen[id] = true
	}
	return lines, nil
}

// commitParts resolves, assembles and publishes; it runs on the node's context, not the
// request's. Parts are deleted once the answer is final for the key, and after a digest
// mismatch (its copy used them up); a refusal that copied nothing keeps them.
func (s *Server) commitParts(key string, inc, ifInc, off uint64, ct, digest string, ids []string) (streamcore.Result, *streamcore.Error) {
	c := s.cold
	ctx, cancel := context.WithTimeout(c.ctx, commitTimeout)
	defer cancel()
	listed, err := c.listParts(ctx, key)
	if err != nil {
		return streamcore.Result{}, coldStoreFailed(err)
	}
	byID := map[string]coldstore.ObjectInfo{}
	for _, p := range listed {
		if p.inc == inc {
			byID[p.id] = p.info
		}
	}
	c.setCounts(key, listed, time.Now())
	parts := make([]coldstore.ObjectInfo, len(ids))
	var total int64
	for i, id := range ids {
		o, ok := byID[id]
		if !ok {
			return streamcore.Result{}, unknownPart(id)
		}
		parts[i] = o
		total += o.Size
	}
	if limit := c.maxSnapshotBytes(); total > limit {
		return streamcore.Result{}, streamcore.Errorf(http.StatusRequestEntityTooLarge, streamcore.CodeSnapshotTooLarge,
			"the assembled snapshot would be %d bytes, more than %d", total, limit).With(streamcore.HdrMaxSnapshotBytes, strconv.FormatInt(limit, 10))
	}
	keys := make([]string, len(parts))
	for i, p := range parts {
		keys[i] = p.Key
	}
	c.pin(keys...)
	defer c.unpin(keys...)
	dst := c.snapshotKey(key, inc, off)
	c.pin(dst)
	got, err := c.assemble(ctx, dst, parts, total, ct)
	if err != nil {
		c.store.Delete(ctx, dst)
		c.unpin(dst)
		return streamcore.Result{}, coldStoreFailed(err)
	}
	dropParts := func() {
		for _, k := range keys {
			c.store.Delete(ctx, k)
		}
		c.relist(ctx, key, inc, time.Now(), false)
	}
	if got != digest {
		c.store.Delete(ctx, dst)
		c.unpin(dst)
		dropParts()
		return streamcore.Result{}, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeSnapshotDigest,
			"the assembled snapshot's digest is %s, not the Stream-Snapshot-Digest %s; its parts are discarded", got, digest)
	}
	// Always conditional on the incarnation whose parts were copied: a stream recreated
	// meanwhile is not published to.
	res, e := s.propose(ctx, &streamcore.Command{Op: streamcore.OpPublishSnapshot, Key: key, Now: s.now(), IfIncarnation: inc,
		Offset: off, SnapshotType: ct, SnapshotDigest: digest, SnapshotColdKey: dst, SnapshotSize: uint64(total),
		BoundaryChecked: s.coldBoundary(key, off)})
	s.unstageSnapshot(dst, res, e)
	final := e == nil || e.Status == http.StatusBadRequest || e.Status == http.StatusNotFound || e.Status == http.StatusConflict ||
		e.Status == http.StatusGone || e.Status == http.StatusPreconditionFailed
	if final {
		dropParts()
	}
	if e == nil && res.Err != nil && res.Err.Status == http.StatusPreconditionFailed && ifInc == 0 {
		return streamcore.Result{}, unknownPart(ids[0]) // the stream was recreated during the copy
	}
	if e == nil && res.Err == nil {
		c.parts.committed.Add(1)
	}
	return res, e
}

func unknownPart(id string) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeUnknownPart,
		"part %q is not staged for this stream's current incarnation (unknown, discarded, or staged for another stream)", id)
}

// errAssembleStopped ends the reader of an assembly whose write stopped early.
var errAssembleStopped = errors.New("the snapshot object write stopped")

// assemble writes the parts, in order, as the object dst and returns the digest of the
// whole. The store reads a pipe fed by ranged reads of the parts, assembleAhead pieces in
// flight, so memory stays bounded whatever the snapshot's size.
func (c *coldTier) assemble(ctx context.Context, dst string, parts []coldstore.ObjectInfo, total int64, ct string) (string, error) {
	h := streamcore.NewSnapshotDigest(ct)
	pr, pw := io.Pipe()
	readErr := make(chan error, 1)
	go func() {
		err := c.readParts(ctx, parts, io.MultiWriter(h, pw))
		pw.CloseWithError(err)
		readErr <- err
	}()
	err := c.store.Put(ctx, dst, pr, total)
	pr.CloseWithError(errAssembleStopped)
	if rerr := <-readErr; err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readParts copies the parts to w in order, reading ahead.
func (c *coldTier) readParts(ctx context.Context, parts []coldstore.ObjectInfo, w io.Writer) error {
	type piece struct {
		key    string
		off, n int64
	}
	var pieces []piece
	for _, p := range parts {
		for off := int64(0); off < p.Size; off += assemblePiece {
			pieces = append(pieces, piece{p.Key, off, min(assemblePiece, p.Size-off)})
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		b   []byte
		err error
	}
	results := make([]chan fetched, len(pieces))
	for i := range results {
		results[i] = make(chan fetched, 1)
	}
	slots := make(chan struct{}, assembleAhead)
	go func() {
		for i, p := range pieces {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				b, err := coldstore.ReadAll(ctx, c.store, p.key, p.off, p.n)
				if err == nil && int64(len(b)) != p.n {
					err = fmt.Errorf("part %s is shorter than listed", p.key)
				}
				results[i] <- fetched{b, err}
			}()
		}
	}()
	for i := range pieces {
		var f fetched
		select {
		case f = <-results[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		<-slots
		if f.err != nil {
			return f.err
		}
		if _, err := w.Write(f.b); err != nil {
			return err
		}
	}
	return nil
}

// dropStreamParts runs after a delete of the stream: the parts of the incarnations up to
// the deleted one go at any age, later ones staged over a minute before the delete.
func (c *coldTier) dropStreamParts(key string, inc uint64, at time.Time) {
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Minute)
	defer cancel()
	parts, err := c.listParts(ctx, key)
	if err != nil {
		return
	}
	kept := parts[:0]
	for _, p := range parts {
		drop := p.inc <= inc || p.info.ModTime.Before(at.Add(-oldPartsMargin))
		if drop && !c.pinned(p.info.Key) && c.store.Delete(ctx, p.info.Key) == nil {
			continue
		}
		kept = append(kept, p)
	}
	c.setCounts(key, kept, time.Now())
}
