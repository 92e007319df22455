package server

// Lifecycle pieces of the admin plane: the process incarnation that admin mutations may
// pin (x-ursula-process-incarnation), a stream group's refusal while it cannot serve
// (a raft group stopped by an apply failure), and the restart of such a group.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"

	"github.com/ursula-go/ursula/streamcore"
)

// HdrProcessIncarnation pins an admin mutation to one run of the server process: the
// value is metrics' process_incarnation, and a mutation carrying another value (the
// process restarted since the operator looked) is refused with 412 and changes nothing.
// Every mutation of the admin plane needs it: one without it is refused with 428.
const HdrProcessIncarnation = "X-Ursula-Process-Incarnation"

// CodeProcessIncarnationMismatch refuses an admin mutation pinned to another run.
const CodeProcessIncarnationMismatch = "PROCESS_INCARNATION_MISMATCH"

// CodeProcessIncarnationRequired refuses an admin mutation pinned to no run.
const CodeProcessIncarnationRequired = "PROCESS_INCARNATION_REQUIRED"

// processIncarnation identifies this run of the process (random, 128 bits).
var processIncarnation = func() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// ProcessIncarnation is this run's incarnation (metrics process_incarnation).
func ProcessIncarnation() string { return processIncarnation }

// checkIncarnation refuses an admin mutation that pins no incarnation (428) or another
// run's (412), before any handler runs. It answers the refusal itself and returns false then.
func (s *Server) checkIncarnation(w http.ResponseWriter, r *http.Request) bool {
	v := r.Header.Get(HdrProcessIncarnation)
	if v == processIncarnation {
		return true
	}
	drainBody(r)
	if v == "" {
		s.writeError(w, r, streamcore.Errorf(http.StatusPreconditionRequired, CodeProcessIncarnationRequired,
			"admin mutations need the header %s: the process_incarnation of GET /__ursula/metrics, read before the operation (ursula ctl sends it)", HdrProcessIncarnation))
		return false
	}
	s.writeError(w, r, streamcore.Errorf(http.StatusPreconditionFailed, CodeProcessIncarnationMismatch,
		"the request is pinned to process incarnation %q but this process is %q: the node restarted since it was read; read it again (GET /__ursula/metrics) and decide again", v, processIncarnation).
		With(HdrProcessIncarnation, processIncarnation))
	return false
}

// streamRefuser is an engine that cannot serve some streams for now (their raft group
// stopped applying); nil when it can serve key.
type streamRefuser interface {
	StreamRefusal(key string) error
}

// streamRefusal is the answer to any request on key while its group cannot serve it.
func (s *Server) streamRefusal(key string) *streamcore.Error {
	sr, ok := s.engine.(streamRefuser)
	if !ok {
		return nil
	}
	err := sr.StreamRefusal(key)
	if err == nil {
		return nil
	}
	var e *streamcore.Error
	if errors.As(err, &e) {
		return e
	}
	return streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeInternal, "%s", err.Error()).With(streamcore.HdrRetryAfter, "5")
}

// groupRestarter restarts a raft group that stopped applying.
type groupRestarter interface {
	RestartGroupReport(group uint64) (any, error)
}

// handleRestartGroup serves POST /__ursula/raft/{g}/restart.
func (s *Server) handleRestartGroup(w http.ResponseWriter, r *http.Request, group string) {
	drainBody(r)
	if !s.allow(w, r, http.MethodPost) {
		return
	}
	gr, ok := s.engine.(groupRestarter)
	g, err := strconv.ParseUint(group, 10, 64)
	switch {
	case !ok:
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "this server does not run Raft"))
		return
	case err != nil:
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "use /__ursula/raft/{group}/restart"))
		return
	}
	rep, err := gr.RestartGroupReport(g)
	if err != nil {
		s.writeError(w, r, adminError(err))
		return
	}
	writeJSON(w, rep)
}
