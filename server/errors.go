package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// writeError writes a refusal: status, its headers and the JSON error body (no body on HEAD).
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *streamcore.Error) {
	h := w.Header()
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	if e.Status == http.StatusTemporaryRedirect && e.Code == CodeNotLeader {
		h.Set("Location", e.Headers["Location"]+r.URL.RequestURI()) // the same request on the leader
	}
	h.Set("Content-Type", "application/json")
	if r.Method == http.MethodHead {
		w.WriteHeader(e.Status)
		return
	}
	b := e.Body()
	h.Set("Content-Length", itoa(len(b)))
	w.WriteHeader(e.Status)
	w.Write(b)
}

func (s *Server) propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, *streamcore.Error) {
	res, err := s.engine.Propose(ctx, c)
	if err != nil {
		if e, ok := err.(*streamcore.Error); ok {
			return res, e
		}
		// Only appends, closes and creates carry the not-applied marker when refused before
		// proposal; deletes, snapshots and retention stay unmarked.
		if e := leaderError(err, c.Op == streamcore.OpAppend || c.Op == streamcore.OpCreate); e != nil {
			return res, e
		}
		return res, streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeOutcomeUnknown, "the write was proposed but its outcome is unknown").
			With(streamcore.HdrRetryAfter, "1")
	}
	if res.Err == nil && res.Changed && len(c.Body) > 0 && (c.Op == streamcore.OpAppend || c.Op == streamcore.OpCreate) {
		s.usage.wrote(streamcore.BucketOf(c.Key), len(c.Body))
	}
	return res, nil
}

// CodeNotLeader is the error code in the body of a leader redirect (307). While no leader
// is known the answer is 503 with streamcore.CodeNoLeader.
const CodeNotLeader = "NOT_LEADER"

// Headers of routing answers: a redirect names the leader, its group and its term, so a
// router can cache the leader per group and discard a hint of an older term; a 503 names
// the group.
const (
	hdrRaftLeaderID = "x-ursula-raft-leader-id"
	hdrRaftGroup    = "x-ursula-raft-group"
	hdrRaftTerm     = "x-ursula-raft-term"
)

// leaderError maps a replicated engine's leadership errors to the answer: 307 to the
// same path and query on the leader (writeError completes Location with the request's
// path and query), or 503 NO_LEADER + Retry-After: 1 while no leader is known. A node
// configured without peers answers 500 + Retry-After: 1 instead: no other node can take
// the request. A write that may have been proposed answers 503 OUTCOME_UNKNOWN, never a
// redirect, since it may have applied.
// mark adds x-ursula-not-applied: NotLeader when the engine proposed nothing (nodes never
// add x-ursula-not-applied-checked: that is the gateway's vouch). nil: not such an error.
func leaderError(err error, mark bool) *streamcore.Error {
	var nl *engine.NotLeaderError
	if !errors.As(err, &nl) {
		if errors.Is(err, engine.ErrNoLeader) {
			nl = &engine.NotLeaderError{}
		} else {
			return nil
		}
	}
	group := strconv.FormatUint(nl.Group, 10)
	var e *streamcore.Error
	switch {
	case nl.Proposed:
		return streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeOutcomeUnknown, "the node lost the group's leadership after proposing the write; its outcome is unknown").
			With(streamcore.HdrRetryAfter, "1")
	case nl.NoPeers:
		e = streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "this node has no peers and does not lead the stream's group yet").
			With(streamcore.HdrRetryAfter, "1")
	case nl.LeaderURL == "":
		e = streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeNoLeader, "the stream's group has no leader yet").
			With(streamcore.HdrRetryAfter, "1").With(hdrRaftGroup, group)
	default:
		e = streamcore.Errorf(http.StatusTemporaryRedirect, CodeNotLeader, "this node does not lead the stream's group").
			With("Location", strings.TrimRight(nl.LeaderURL, "/")).
			With(hdrRaftLeaderID, strconv.FormatUint(nl.LeaderID, 10)).
			With(hdrRaftGroup, group).
			With(hdrRaftTerm, strconv.FormatUint(nl.Term, 10))
	}
	if mark {
		e.With(streamcore.HdrNotApplied, "NotLeader")
	}
	return e
}

// verifyLeader confirms, on a replicated engine, that this node leads key's group and has
// applied everything committed (ReadIndex) before a tail-sensitive read: consistency=leader,
// HEAD, bootstrap, live-read registration. It answers the refusal itself and returns false
// when the read must not be served here.
func (s *Server) verifyLeader(w http.ResponseWriter, r *http.Request, key string) bool {
	if e := s.confirmLeader(r.Context(), key); e != nil {
		drainBody(r)
		s.writeError(w, r, e)
		return false
	}
	return true
}

// confirmLeader is verifyLeader's check without the answer: nil when this node leads
// key's group and has applied everything committed (or the engine is not replicated),
// else the redirect or the no-leader 503. A request that checks the stream's state before
// it proposes needs it: a node elected a moment ago may not have applied its
// predecessors' entries yet, so its state could miss a stream that exists.
func (s *Server) confirmLeader(ctx context.Context, key string) *streamcore.Error {
	lv, ok := s.engine.(engine.LeaderVerifier)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := lv.VerifyLeader(ctx, key)
	if err == nil {
		return nil
	}
	if e := leaderError(err, false); e != nil {
		return e
	}
	return streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeNoLeader, "could not confirm leadership of the stream's group").With(streamcore.HdrRetryAfter, "1")
}
