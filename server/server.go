// Package server is the Durable Streams HTTP server: routing, request parsing, the answers
// of every route of the protocol and its Ursula extensions, live reads (long-poll, SSE),
// admin endpoints, and the engines behind the Engine seam.
package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// CompatPrefix is the path family of the Durable Streams reference server and its
// conformance suite: /v1/stream/{path...}. Its streams live in CompatBucket, a bucket name
// the native API can never address (bucket ids starting with "__" are refused there).
const (
	CompatPrefix = "/v1/stream/"
	CompatBucket = "__v1_stream"
)

// Config holds the server settings.
type Config struct {
	ClusterID      string        // Ursula-Cluster-Id; generated when empty
	MaxLiveReaders int           // long-poll + SSE readers per node (503 above it)
	SSEMaxIdle     time.Duration // close idle SSE connections after this (0 = never)
	Logger         *slog.Logger
}

// Server answers the protocol over HTTP on top of an Engine.
type Server struct {
	cfg     Config
	engine  Engine
	metrics metrics
	live    atomic.Int64
	ready   atomic.Bool
	clock   func() time.Time
	cold    *coldTier // nil without a cold store (cold.go)
}

// New returns a server over engine.
func New(engine Engine, cfg Config) *Server {
	if cfg.ClusterID == "" {
		cfg.ClusterID = NewClusterID()
	}
	if cfg.MaxLiveReaders == 0 {
		cfg.MaxLiveReaders = 100000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, engine: engine, clock: time.Now}
	s.metrics.init()
	s.ready.Store(true)
	return s
}

// NewClusterID returns a fresh cluster id.
func NewClusterID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ursula-" + strings.ToLower(strings.TrimRight(base32hex(b[:]), "="))
}

func base32hex(b []byte) string {
	const alpha = "0123456789abcdefghijklmnopqrstuv"
	var sb strings.Builder
	v := binary.BigEndian.Uint64(b)
	for i := 0; i < 13; i++ {
		sb.WriteByte(alpha[v&31])
		v >>= 5
	}
	return sb.String()
}

// SetReady flips the readiness endpoint (false while shutting down).
func (s *Server) SetReady(ok bool) { s.ready.Store(ok) }

// Engine returns the engine the server runs on.
func (s *Server) Engine() Engine { return s.engine }

func (s *Server) now() int64 { return s.clock().UnixMilli() }

// target is a parsed stream address.
type target struct {
	bucket string
	stream string
	key    string // bucket/stream
	compat bool
	url    string // the path the client addressed (for Location)
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w}
	s.commonHeaders(rw.Header())
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.cfg.Logger.Error("handler panic", "method", r.Method, "err", v)
			if !rw.wrote {
				s.writeError(rw, r, streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "internal error"))
			}
		}
		s.metrics.observe(r.Method, rw.status, time.Since(start))
	}()
	s.route(rw, r)
}

func (s *Server) commonHeaders(h http.Header) {
	h["Ursula-Protocol"] = []string{streamcore.ProtocolVersion}
	h["Ursula-Cluster-Id"] = []string{s.cfg.ClusterID}
	h["Cache-Control"] = []string{"no-store"}
	h["Access-Control-Allow-Origin"] = []string{"*"}
	h["Access-Control-Expose-Headers"] = []string{"*"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	h["Cross-Origin-Resource-Policy"] = []string{"cross-origin"}
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.EscapedPath()
	if r.Method == http.MethodOptions {
		s.preflight(w, r)
		return
	}
	switch raw {
	case "/__ursula/ready":
		s.handleReady(w, r)
		return
	case "/__ursula/metrics":
		s.handleMetricsJSON(w, r)
		return
	case "/metrics":
		s.handleMetricsProm(w, r)
		return
	case "/__ursula/raft/status", "/__ursula/raft/transfer", "/__ursula/raft/drain":
		s.handleRaftAdmin(w, r, raw)
		return
	}
	if raw == "/__ursula/cold-refs" {
		s.handleColdRefs(w, r) // cold_gc.go
		return
	}
	if strings.HasPrefix(raw, "/__ursula/flush-cold/") {
		s.handleFlushCold(w, r, raw) // cold.go
		return
	}
	if strings.HasPrefix(raw, "/__ursula/") || raw == "/__ursula" {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such operational endpoint"))
		return
	}
	if strings.HasPrefix(raw, CompatPrefix) {
		s.routeCompat(w, r, raw[len(CompatPrefix):])
		return
	}
	segs, err := splitPath(raw)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch len(segs) {
	case 0:
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no route; streams live at /{bucket}/{stream}"))
	case 1:
		s.routeBucket(w, r, segs[0])
	default:
		if e := streamcore.ValidateBucketID(segs[0]); e != nil {
			s.writeError(w, r, e)
			return
		}
		if e := streamcore.ValidateStreamID(segs[0], segs[1]); e != nil {
			s.writeError(w, r, e)
			return
		}
		t := &target{bucket: segs[0], stream: segs[1], key: segs[0] + "/" + segs[1], url: raw}
		s.routeStream(w, r, t, segs[2:])
	}
}

// splitPath splits on raw '/' before percent-decoding each segment (checklist 1.15).
func splitPath(raw string) ([]string, *streamcore.Error) {
	raw = strings.TrimPrefix(raw, "/")
	if raw == "" {
		return nil, nil
	}
	parts := strings.Split(raw, "/")
	for i, p := range parts {
		d, err := url.PathUnescape(p)
		if err != nil {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "path is not valid percent-encoding")
		}
		if strings.Contains(d, "/") {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidStreamID, "an encoded '/' is not allowed in a path segment")
		}
		parts[i] = d
	}
	return parts, nil
}

func (s *Server) routeBucket(w http.ResponseWriter, r *http.Request, bucket string) {
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", "PUT, OPTIONS")
		s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeMethodNotAllowed, "a bucket only supports PUT (validate id)"))
		return
	}
	if e := streamcore.ValidateBucketID(bucket); e != nil {
		s.writeError(w, r, e)
		return
	}
	drainBody(r)
	w.WriteHeader(http.StatusCreated)
}

var removedSubresources = map[string]bool{"attrs": true, "keyed-state": true, "append-batch": true}

func (s *Server) routeStream(w http.ResponseWriter, r *http.Request, t *target, rest []string) {
	m := r.Method
	switch len(rest) {
	case 0:
		switch m {
		case http.MethodPut:
			s.handleCreate(w, r, t)
		case http.MethodPost:
			s.handleAppend(w, r, t)
		case http.MethodGet:
			s.handleRead(w, r, t)
		case http.MethodHead:
			if s.verifyLeader(w, r, t.key) {
				s.handleHead(w, r, t)
			}
		case http.MethodDelete:
			s.handleDelete(w, r, t)
		default:
			s.methodNotAllowed(w, r, "GET, HEAD, PUT, POST, DELETE, OPTIONS")
		}
		return
	case 1:
		switch rest[0] {
		case "bootstrap":
			if m != http.MethodGet {
				s.methodNotAllowed(w, r, "GET, OPTIONS")
				return
			}
			if s.verifyLeader(w, r, t.key) {
				s.handleBootstrap(w, r, t)
			}
			return
		case "snapshot":
			// The removed latest-snapshot path (checklist 1.11).
			w.Header().Set("Allow", "")
			s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeUnsupported, "the latest-snapshot path was removed; use HEAD for Stream-Snapshot-Offset, then GET /snapshot/{offset}"))
			return
		}
	case 2:
		switch rest[0] {
		case "snapshot":
			if rest[1] == "parts" && m == http.MethodDelete {
				s.handleDiscardParts(w, r, t)
				return
			}
			switch m {
			case http.MethodPut:
				s.handlePublishSnapshot(w, r, t, rest[1])
			case http.MethodGet:
				if s.verifyLeader(w, r, t.key) {
					s.handleReadSnapshot(w, r, t, rest[1], false)
				}
			case http.MethodDelete:
				s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeUnsupported, "snapshots cannot be deleted"))
			default:
				s.methodNotAllowed(w, r, "GET, PUT, OPTIONS")
			}
			return
		case "retention":
			if m != http.MethodPut {
				s.methodNotAllowed(w, r, "PUT, OPTIONS")
				return
			}
			s.handleRetain(w, r, t, rest[1])
			return
		}
	case 3:
		if rest[0] == "snapshot" && rest[2] == "parts" {
			if m != http.MethodPost {
				s.methodNotAllowed(w, r, "POST, OPTIONS")
				return
			}
			s.handleStagePart(w, r, t, rest[1])
			return
		}
	case 4:
		if rest[0] == "incarnation" && (rest[2] == "chunk" || rest[2] == "snapshot") {
			if m != http.MethodGet && m != http.MethodHead {
				s.methodNotAllowed(w, r, "GET, HEAD, OPTIONS")
				return
			}
			s.handleImmutable(w, r, t, rest[1], rest[2], rest[3])
			return
		}
	}
	s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such route"))
}

func noColdStore() *streamcore.Error {
	return streamcore.Errorf(http.StatusNotImplemented, streamcore.CodeNoColdStore, "snapshot upload in parts needs a cold store; this server has none")
}

// routeCompat serves /v1/stream/{path...}: the whole remainder names one stream of the
// compatibility bucket, and only the stream routes exist there.
func (s *Server) routeCompat(w http.ResponseWriter, r *http.Request, rawRest string) {
	name, err := url.PathUnescape(rawRest)
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "path is not valid percent-encoding"))
		return
	}
	if e := streamcore.ValidateCompatPath(name); e != nil {
		s.writeError(w, r, e)
		return
	}
	t := &target{bucket: CompatBucket, stream: name, key: CompatBucket + "/" + name, compat: true, url: r.URL.EscapedPath()}
	s.routeStream(w, r, t, nil)
}

// keyForPath maps a stream path as a client names it (Stream-Forked-From) to a key.
func keyForPath(p string) (string, *streamcore.Error) {
	if u, err := url.Parse(p); err == nil && u.Path != "" {
		p = u.EscapedPath()
	}
	if strings.HasPrefix(p, CompatPrefix) {
		name, err := url.PathUnescape(p[len(CompatPrefix):])
		if err != nil {
			return "", streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidHeader, "Stream-Forked-From is not a valid stream path")
		}
		if e := streamcore.ValidateCompatPath(name); e != nil {
			return "", e
		}
		return CompatBucket + "/" + name, nil
	}
	segs, e := splitPath(p)
	if e != nil || len(segs) != 2 {
		return "", streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidHeader, "Stream-Forked-From must name a stream path /{bucket}/{stream}")
	}
	if e := streamcore.ValidateBucketID(segs[0]); e != nil {
		return "", e
	}
	if e := streamcore.ValidateStreamID(segs[0], segs[1]); e != nil {
		return "", e
	}
	return segs[0] + "/" + segs[1], nil
}

func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeMethodNotAllowed, "method %s is not supported here", r.Method))
}

func (s *Server) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, DELETE, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	} else {
		h.Set("Access-Control-Allow-Headers", "*")
	}
	h.Set("Access-Control-Max-Age", "86400")
	w.WriteHeader(http.StatusNoContent)
}

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

// writeResult writes a command's answer.
func (s *Server) writeResult(w http.ResponseWriter, r *http.Request, t *target, res streamcore.Result) {
	if res.Err != nil {
		s.writeError(w, r, res.Err)
		return
	}
	h := w.Header()
	for _, kv := range res.Headers {
		h[kv.Name] = []string{kv.Value}
	}
	if res.Created {
		h.Set("Location", absoluteURL(r, t.url))
	}
	w.WriteHeader(res.Status)
}

func absoluteURL(r *http.Request, path string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + path
}

func (s *Server) propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, *streamcore.Error) {
	res, err := s.engine.Propose(ctx, c)
	if err != nil {
		if e, ok := err.(*streamcore.Error); ok {
			return res, e
		}
		// Only appends, closes and creates carry the not-applied marker when refused before
		// proposal; deletes, snapshots and retention stay unmarked (checklist-ops 147).
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
	var nl *NotLeaderError
	var e *streamcore.Error
	proposed := false
	switch {
	case errors.Is(err, ErrNoLeader):
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
	lv, ok := s.engine.(LeaderVerifier)
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

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
