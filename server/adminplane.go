package server

// The admin plane: a second HTTP handler for the admin listener (server.admin_listen,
// loopback by default). Every mutating operational endpoint lives here only; the client
// listener keeps readiness and metrics. The admin plane sends no CORS headers, so a web
// page cannot drive it from a browser on the same host.

import (
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// CodeRaftAdmin is the error code of refused admin operations (not the leader, unknown
// node, a change in progress); the message says which.
const CodeRaftAdmin = "RAFT_ADMIN"

// AdminHandler returns the handler of the admin listener.
func (s *Server) AdminHandler() http.Handler { return http.HandlerFunc(s.serveAdmin) }

func (s *Server) serveAdmin(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w}
	h := rw.Header()
	h["Ursula-Protocol"] = []string{streamcore.ProtocolVersion}
	h["Ursula-Cluster-Id"] = []string{s.cfg.ClusterID}
	h["Cache-Control"] = []string{"no-store"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.cfg.Logger.Error("admin handler panic", "method", r.Method, "err", v)
			if !rw.wrote {
				s.writeError(rw, r, streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "internal error"))
			}
		}
		s.metrics.observe(r.Method, rw.status, time.Since(start))
	}()
	s.routeAdmin(rw, r)
}

// isAdminPath reports the paths served only by the admin plane (the client plane answers
// them 404, naming the admin listener).
func isAdminPath(raw string) bool {
	return strings.HasPrefix(raw, "/__ursula/raft/") || strings.HasPrefix(raw, "/__ursula/flush-cold/") ||
		raw == "/__ursula/members" || strings.HasPrefix(raw, "/__ursula/recovery") ||
		strings.HasPrefix(raw, purgePrefix) || raw == "/__ursula/usage" ||
		strings.HasPrefix(raw, "/__ursula/leadership-shed")
}

func (s *Server) adminOnly(w http.ResponseWriter, r *http.Request) {
	drainBody(r)
	s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "%s is an admin endpoint: use the admin listener (server.admin_listen)", r.URL.Path))
}

func (s *Server) routeAdmin(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.EscapedPath()
	if r.Method == http.MethodOptions {
		w.WriteHeader(http.StatusNoContent) // no preflight grant, ever
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && (!s.checkIncarnation(w, r) || !s.explicitAdmin(w, r)) {
		return // a mutation a web page could have sent, or pinned to another run: refused
	}
	if raw != "/__ursula/ready" { // readiness stays open for probes
		if r = s.guard(w, r, "", auth.Admin); r == nil {
			return // with auth on, every operation needs the admin scope
		}
	}
	switch raw {
	case "/__ursula/ready":
		s.handleReady(w, r)
		return
	case "/__ursula/metrics":
		if r.URL.Query().Get("gc") == "1" {
			// Admin listener only: a full collection first, so memory.heap_live_bytes is
			// the live heap of now (the benchmark's memory per idle stream and reader).
			runtime.GC()
		}
		s.handleMetricsJSON(w, r)
		return
	case "/metrics":
		s.handleMetricsProm(w, r)
		return
	case "/__ursula/raft/status", "/__ursula/raft/transfer", "/__ursula/raft/drain":
		s.handleRaftAdmin(w, r, raw)
		return
	}
	if raw == "/__ursula/usage" {
		s.handleUsage(w, r)
		return
	}
	if strings.HasPrefix(raw, purgePrefix) {
		s.handlePurge(w, r, raw)
		return
	}
	if strings.HasPrefix(raw, "/__ursula/flush-cold/") {
		// A follower's refusal names the leader instead of redirecting: the redirect would
		// point at the leader's client listener, which does not serve this path.
		s.handleFlushCold(&noRedirectWriter{statusWriter: w.(*statusWriter)}, r, raw)
		return
	}
	lc, ok := s.engine.(engine.Lifecycle)
	if !ok {
		drainBody(r)
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such admin endpoint (cluster operations need the raft engine)"))
		return
	}
	switch raw {
	case "/__ursula/members":
		if !s.allow(w, r, http.MethodGet) {
			return
		}
		writeJSON(w, lc.Members())
		return
	case "/__ursula/recovery":
		if !s.allow(w, r, http.MethodGet) {
			return
		}
		writeJSON(w, lc.RecoveryReport())
		return
	case "/__ursula/recovery/accept-unsynced-loss":
		if !s.allow(w, r, http.MethodPost) {
			return
		}
		drainBody(r)
		rep, err := lc.AcceptUnsyncedLoss()
		if err != nil {
			s.writeError(w, r, adminError(err))
			return
		}
		writeJSON(w, rep)
		return
	case "/__ursula/leadership-shed/maintenance":
		s.handleDrainMark(w, r, lc)
		return
	}
	// /__ursula/raft/{g}/learners/{node}, /voters/{node}, /members/{node}
	if rest, ok := strings.CutPrefix(raw, "/__ursula/raft/"); ok {
		parts := strings.Split(rest, "/")
		if len(parts) == 3 {
			s.handleMemberChange(w, r, lc, parts)
			return
		}
		if len(parts) == 2 && parts[1] == "restart" {
			s.handleRestartGroup(w, r, parts[0])
			return
		}
	}
	drainBody(r)
	s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such admin endpoint"))
}

// handleDrainMark serves POST /__ursula/leadership-shed/maintenance (set the persistent
// drain mark, then hand every leadership away) and DELETE (clear it).
func (s *Server) handleDrainMark(w http.ResponseWriter, r *http.Request, lc engine.Lifecycle) {
	drainBody(r)
	switch r.Method {
	case http.MethodPost:
		if err := lc.SetDrainMark(true); err != nil {
			s.writeError(w, r, adminError(err))
			return
		}
		if ra, ok := s.engine.(engine.RaftAdmin); ok {
			if err := ra.Drain(); err != nil {
				s.writeError(w, r, adminError(err))
				return
			}
		}
	case http.MethodDelete:
		if err := lc.SetDrainMark(false); err != nil {
			s.writeError(w, r, adminError(err))
			return
		}
	default:
		s.methodNotAllowed(w, r, "POST, DELETE")
		return
	}
	writeJSON(w, map[string]any{"ok": true, "drain_mark": r.Method == http.MethodPost})
}

// handleMemberChange serves POST /__ursula/raft/{g}/learners/{node}?url=&raft_addr=,
// POST /__ursula/raft/{g}/voters/{node} and DELETE /__ursula/raft/{g}/members/{node}.
func (s *Server) handleMemberChange(w http.ResponseWriter, r *http.Request, lc engine.Lifecycle, parts []string) {
	drainBody(r)
	g, gerr := strconv.ParseUint(parts[0], 10, 64)
	node, nerr := strconv.ParseUint(parts[2], 10, 64)
	if gerr != nil || nerr != nil || node == 0 {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "use /__ursula/raft/{group}/{learners|voters|members}/{node_id}"))
		return
	}
	c := engine.MemberChange{NodeID: node}
	want := http.MethodPost
	switch parts[1] {
	case "learners":
		c.Op = engine.AddLearner
		q := r.URL.Query()
		c.URL, c.RaftAddr = strings.TrimRight(q.Get("url"), "/"), q.Get("raft_addr")
		if c.RaftAddr == "" {
			s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "a learner needs raft_addr= (and url=, its client URL)"))
			return
		}
	case "voters":
		c.Op = engine.PromoteVoter
	case "members":
		c.Op, want = engine.RemoveMember, http.MethodDelete
	default:
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such admin endpoint"))
		return
	}
	if r.Method != want {
		s.methodNotAllowed(w, r, want)
		return
	}
	if err := lc.ChangeMember(r.Context(), g, c); err != nil {
		s.writeError(w, r, adminError(err))
		return
	}
	writeJSON(w, map[string]any{"ok": true, "group": g, "node_id": node})
}

// adminError maps an engine's refusal of an admin operation to an answer: 404 unknown
// group, 400 unknown node, 503 no leader, 409 otherwise.
func adminError(err error) *streamcore.Error {
	status := http.StatusConflict
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no such raft group"):
		status = http.StatusNotFound
	case strings.Contains(msg, "no such voter"):
		status = http.StatusBadRequest
	case strings.Contains(msg, "nothing to restart"):
		return streamcore.Errorf(http.StatusConflict, "GROUP_NOT_STOPPED", "%s", msg)
	case errors.Is(err, engine.ErrNoLeader):
		return streamcore.Errorf(http.StatusServiceUnavailable, CodeNotLeader, "%s", msg).With(streamcore.HdrRetryAfter, "1")
	}
	return streamcore.Errorf(status, CodeRaftAdmin, "%s", msg)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// readyReason is the readiness reason of an engine's not-ready detail: its leading token
// when it names one ("recovery_gate_closed: ..."), else raft_replica_unready.
func readyReason(detail string) string {
	tok, _, ok := strings.Cut(detail, ":")
	if ok && tok != "" && !strings.ContainsAny(tok, " ") {
		return tok
	}
	return "raft_replica_unready"
}

// noRedirectWriter turns a leader redirect into 409 on the admin plane (the Location names
// the leader's client listener, which does not serve admin paths).
type noRedirectWriter struct {
	*statusWriter
}

func (w *noRedirectWriter) WriteHeader(code int) {
	if code == http.StatusTemporaryRedirect {
		w.Header().Set("Ursula-Leader", w.Header().Get("Location"))
		w.Header().Del("Location")
		code = http.StatusConflict
	}
	w.statusWriter.WriteHeader(code)
}
