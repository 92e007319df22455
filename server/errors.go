package server

import (
	"context"
	"errors"
	"net/http"
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
	return res, nil
}

// CodeNotLeader is the error code of leader redirects and of 503s while no leader is known.
const CodeNotLeader = "NOT_LEADER"

// leaderError maps a replicated engine's leadership errors to the answer: 307 to the
// same path and query on the leader (writeError completes Location with the request's
// path and query), or 503 + Retry-After: 1 while no leader is known.
// mark adds x-ursula-not-applied: NotLeader when the engine proposed nothing (nodes never
// add x-ursula-not-applied-checked: that is the gateway's vouch). nil: not such an error.
func leaderError(err error, mark bool) *streamcore.Error {
	var nl *engine.NotLeaderError
	var e *streamcore.Error
	proposed := false
	switch {
	case errors.Is(err, engine.ErrNoLeader):
		e = streamcore.Errorf(http.StatusServiceUnavailable, CodeNotLeader, "the stream's group has no leader yet").With(streamcore.HdrRetryAfter, "1")
	case errors.As(err, &nl):
		proposed = nl.Proposed
		if nl.LeaderURL == "" {
			e = streamcore.Errorf(http.StatusServiceUnavailable, CodeNotLeader, "the stream's group has no leader yet").With(streamcore.HdrRetryAfter, "1")
		} else {
			e = streamcore.Errorf(http.StatusTemporaryRedirect, CodeNotLeader, "this node does not lead the stream's group").
				With("Location", strings.TrimRight(nl.LeaderURL, "/"))
		}
	default:
		return nil
	}
	if mark && !proposed {
		e.With(streamcore.HdrNotApplied, "NotLeader")
	}
	return e
}

// verifyLeader confirms, on a replicated engine, that this node leads key's group and has
// applied everything committed (ReadIndex) before a tail-sensitive read: consistency=leader,
// HEAD, bootstrap, live-read registration. It answers the refusal itself and returns false
// when the read must not be served here.
func (s *Server) verifyLeader(w http.ResponseWriter, r *http.Request, key string) bool {
	lv, ok := s.engine.(engine.LeaderVerifier)
	if !ok {
		return true
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	err := lv.VerifyLeader(ctx, key)
	if err == nil {
		return true
	}
	e := leaderError(err, false)
	if e == nil {
		e = streamcore.Errorf(http.StatusServiceUnavailable, CodeNotLeader, "could not confirm leadership of the stream's group").With(streamcore.HdrRetryAfter, "1")
	}
	drainBody(r)
	s.writeError(w, r, e)
	return false
}
