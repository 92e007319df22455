package server

import (
	"context"
	"encoding/hex"
	"net/http"
	"strconv"

	"github.com/ursula-go/ursula/internal/blake3seq"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request, t *target) {
	body, e := s.readBody(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	c, e := s.createCommand(r, t, body)
	if e == nil {
		c.BodyFrame = bodyFrameOf(w) // used only if stored is the body as read
		e = s.admitStream(t.key)
	}
	if e == nil {
		e = s.coldAdmit(r.Context(), t.key, len(c.Body))
	}
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	res, e := s.propose(r.Context(), c)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	s.writeResult(w, r, t, res)
}

func (s *Server) createCommand(r *http.Request, t *target, body []byte) (*streamcore.Command, *streamcore.Error) {
	if r.Header.Get(streamcore.HdrProducerID) != "" || r.Header.Get(streamcore.HdrProducerEpoch) != "" || r.Header.Get(streamcore.HdrProducerSeq) != "" {
		return nil, badProducer("producer headers are not allowed on create")
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		return nil, e
	}
	ttl, e := parseTTL(r)
	if e != nil {
		return nil, e
	}
	expText, expMs, e := parseExpiresAt(r)
	if e != nil {
		return nil, e
	}
	if ttl >= 0 && expText != "" {
		return nil, badHeader("Stream-TTL and Stream-Expires-At cannot both be given")
	}
	seq, e := parseStreamSeq(r)
	if e != nil {
		return nil, e
	}
	fork, e := parseFork(r, t.compat)
	if e != nil {
		return nil, e
	}
	ct, stored, msgs, fault, e := contentOf(r, body, true)
	if e != nil {
		return nil, e
	}
	return &streamcore.Command{
		Op: streamcore.OpCreate, Key: t.key, Now: s.now(), IfIncarnation: inc,
		ContentType: ct, TTL: ttl, ExpiresAt: expText, ExpiresAtMs: expMs,
		NewIncarnation: NewIncarnation(), Fork: fork,
		Body: stored, Messages: msgs, Close: closedFlag(r), StreamSeq: seq, BodyFault: fault,
	}, nil
}

// parseFork reads Stream-Forked-From, Stream-Fork-Offset and Stream-Fork-Sub-Offset.
func parseFork(r *http.Request, compat bool) (*streamcore.ForkSpec, *streamcore.Error) {
	from, hasFrom, e := single(r, streamcore.HdrForkedFrom)
	if e != nil {
		return nil, e
	}
	offText, hasOff, e := single(r, streamcore.HdrForkOffset)
	if e != nil {
		return nil, e
	}
	subText, hasSub, e := single(r, streamcore.HdrForkSubOffset)
	if e != nil {
		return nil, e
	}
	if !hasFrom {
		if hasOff || hasSub {
			return nil, badHeader("Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
		}
		return nil, nil
	}
	key, e := keyForPath(from)
	if e != nil {
		return nil, e
	}
	f := &streamcore.ForkSpec{Source: key}
	if hasOff {
		ro, err := parseReadOffset(offText, compat)
		if err != nil || ro.Start || ro.Now {
			return nil, badHeader("Stream-Fork-Offset must be an offset token")
		}
		f.Offset, f.HasOffset = ro.Pos, true
	}
	if hasSub {
		n, ok := parseSafeInt(subText)
		if !ok {
			return nil, badHeader("Stream-Fork-Sub-Offset must be a non-negative integer")
		}
		if n > 0 && !hasOff {
			return nil, badHeader("Stream-Fork-Sub-Offset needs Stream-Fork-Offset")
		}
		f.SubOffset = n
	}
	return f, nil
}

func (s *Server) handleAppend(w http.ResponseWriter, r *http.Request, t *target) {
	if r.Header.Get(streamcore.HdrRecordMatch) != "" {
		s.writeError(w, r, badHeader("Stream-Record-Match was removed"))
		return
	}
	ph, e := parseProducer(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	seq, e := parseStreamSeq(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if ph == nil && r.Header.Get(streamcore.HdrProducerDigest) != "" {
		if _, _, e := single(r, streamcore.HdrProducerDigest); e != nil {
			s.writeError(w, r, e)
			return
		}
		if !isLowerHex(r.Header.Get(streamcore.HdrProducerDigest), 64) {
			s.writeError(w, r, badHeader("Producer-Digest must be 64 lowercase hex digits (BLAKE3-256 of the body)"))
			return
		}
	}
	if !s.writeHere(w, r, t.key) {
		return
	}
	shortHandler(r)
	// The engine copies the body before Propose returns (into the stream's buffer, or the
	// log entry), and nothing below keeps it: it may be a pooled buffer.
	body, e := s.readScratchBody(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	closing := closedFlag(r)
	var ct string
	var stored []byte
	var msgs int
	var fault *streamcore.Error
	if len(body) > 0 || !closing {
		ct, stored, msgs, fault, e = contentOf(r, body, false)
		if e != nil {
			s.writeError(w, r, e)
			return
		}
	}
	c := &streamcore.Command{
		Op: streamcore.OpAppend, Key: t.key, Now: s.now(), IfIncarnation: inc, WithIncHdr: inc != 0,
		ContentType: ct, Body: stored, Messages: msgs, Close: closing, StreamSeq: seq,
		BodyFault: fault, Producer: ph,
	}
	c.BodyFrame = bodyFrameOf(w) // used only if stored is the body as read
	if ph != nil && ph.Digest != "" {
		sum := blake3seq.Sum256(body)
		c.DigestBad = hex.EncodeToString(sum[:]) != ph.Digest
	}
	if e := s.coldAdmit(r.Context(), t.key, len(stored)); e != nil {
		s.writeError(w, r, e)
		return
	}
	res, e := s.propose(r.Context(), c)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if res.Err == nil && res.Changed {
		s.metrics.appendBytes.Add(uint64(len(stored)))
	}
	s.writeResult(w, r, t, res)
}

// writeHere checks, before an append's body is read, that this node leads the stream's
// group on a replicated engine; otherwise it answers 307 to the leader (503 while none is
// known), marked x-ursula-not-applied: NotLeader since nothing was proposed, without
// reading a body the leader would have to receive again.
func (s *Server) writeHere(w http.ResponseWriter, r *http.Request, key string) bool {
	lv, ok := s.engine.(engine.LeaderVerifier)
	if !ok {
		return true
	}
	err := lv.LeaderHint(key)
	if err == nil {
		return true
	}
	if e := leaderError(err, true); e != nil {
		s.writeError(w, r, e)
		return false
	}
	return true
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request, t *target) {
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if _, e := s.readBody(w, r); e != nil {
		s.writeError(w, r, e) // a body without Content-Length is refused once it crosses the limit
		return
	}
	res, e := s.propose(r.Context(), &streamcore.Command{Op: streamcore.OpDelete, Key: t.key, Now: s.now(), IfIncarnation: inc})
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	s.writeResult(w, r, t, res)
	if res.Err == nil {
		// The incarnation the apply removed, not one read here before proposing: a
		// leader elected a moment ago may not have applied its predecessors' entries.
		s.cold.StreamDeleted(t.key, res.Deleted)
	}
}

func (s *Server) handleRetain(w http.ResponseWriter, r *http.Request, t *target, offText string) {
	off, err := streamcore.ParseOffset(offText)
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidOffset, "%s", err.Error()))
		return
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if _, e := s.readBody(w, r); e != nil {
		s.writeError(w, r, e) // a body without Content-Length is refused once it crosses the limit
		return
	}
	c := &streamcore.Command{Op: streamcore.OpRetain, Key: t.key, Now: s.now(), IfIncarnation: inc, Offset: off}
	s.cold.CheckBoundary(t.key, c)
	res, e := s.propose(r.Context(), c)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	s.writeResult(w, r, t, res)
}

func (s *Server) handleRead(w http.ResponseWriter, r *http.Request, t *target) {
	rq, e := parseReadQuery(r.URL.Query(), t.compat)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if (rq.leader || rq.live != "") && !s.verifyLeader(w, r, t.key) {
		return
	}
	switch rq.live {
	case "long-poll":
		s.longPoll(w, r, t, rq, inc)
		return
	case "sse":
		s.serveSSE(w, r, t, rq, inc)
		return
	}
	v, e := s.lookShort(t, rq.off, rq.maxBytes, inc)
	defer s.done(v)
	if (rq.off.Now || e != nil && (e.Status == http.StatusNotFound || e.Status == http.StatusRequestedRangeNotSatisfiable)) && !s.tailHere(w, r, t.key) {
		return // a follower: offset=now, and a missing stream or offset, come from the leader
	}
	if e != nil {
		if e.Status == http.StatusPreconditionFailed {
			s.renew(r.Context(), t, v)
		}
		s.writeError(w, r, e)
		return
	}
	s.renew(r.Context(), t, v)
	s.writeData(w, r, v, rq.off.Now, "")
}

// tailHere reports whether this node may resolve offset=now, or refuse a catch-up read with
// 404 or 416, for key's stream. A follower's replica can trail the leader by a commit
// round, so on a replicated engine a follower sends such a read to the leader (307; 503
// while none is known) rather than answer from its stale prefix. Other catch-up reads are
// served from the local replica; their Stream-Up-To-Date is the tail this node knows.
func (s *Server) tailHere(w http.ResponseWriter, r *http.Request, key string) bool {
	lv, ok := s.engine.(engine.LeaderVerifier)
	if !ok {
		return true
	}
	err := lv.LeaderHint(key)
	if err == nil {
		return true
	}
	e := leaderError(err, false)
	if e == nil {
		return true
	}
	s.writeError(w, r, e)
	return false
}

func (s *Server) handleHead(w http.ResponseWriter, r *http.Request, t *target) {
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	v, e := s.look(t, streamcore.ReadOffset{Now: true}, 0, inc)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	h := w.Header()
	h.Set("Content-Type", v.ct)
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.tail))
	h.Set(streamcore.HdrRetainedOffset, streamcore.FormatOffset(v.retained))
	s.cold.HeadHeaders(h, max(v.hotStart, v.retained))
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if v.prevInc != 0 {
		h.Set(streamcore.HdrPreviousIncarnation, u64(v.prevInc))
		h.Set(streamcore.HdrInheritedOffset, streamcore.FormatOffset(v.inherited))
	}
	h.Set(streamcore.HdrMaxRequestBytes, strconv.Itoa(streamcore.MaxRequestBytes))
	if v.closed {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	if v.ttl >= 0 {
		h.Set(streamcore.HdrStreamTTL, strconv.FormatInt(v.ttl, 10))
	}
	if v.expiresAt != "" {
		h.Set(streamcore.HdrStreamExpiresAt, v.expiresAt)
	}
	if v.snap != nil {
		h.Set(streamcore.HdrSnapshotOffset, streamcore.FormatOffset(v.snap.Offset))
		h.Set(streamcore.HdrSnapshotDigest, v.snap.Digest)
	}
	w.WriteHeader(http.StatusOK)
}

// renew renews a sliding TTL a read made due (the engine asks the leader when this node
// follows the stream's group).
func (s *Server) renew(ctx context.Context, t *target, v *view) {
	if v == nil || !v.renew {
		return
	}
	s.engine.RenewRead(ctx, t.key, s.now())
}

// coldAdmit holds a write with a body while the stream's group holds more hot bytes than
// storage.cold.max_hot_size_per_group, up to storage.cold.backpressure_wait for the
// flusher to catch up, and refuses it if the group is still over then, before anything is
// proposed. A replicated engine's follower holds the same hot bytes as the leader: it
// answers the redirect (or no-leader 503) at once, as it would without the cold tier.
func (s *Server) coldAdmit(ctx context.Context, key string, bodyLen int) *streamcore.Error {
	if !s.cold.OverHotCap(key, bodyLen) {
		return nil
	}
	if lv, ok := s.engine.(engine.LeaderVerifier); ok {
		if e := leaderError(lv.LeaderHint(key), true); e != nil {
			return e
		}
	}
	if s.cold.WaitUnderHotCap(ctx, key, bodyLen) {
		return nil
	}
	return s.cold.Backpressure()
}
