package server

import (
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/coldtier"
	"github.com/ursula-go/ursula/engine"
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
	MaxLiveReaders int           // long-poll + SSE readers per node (503 above it); 0: 65536 per CPU, < 0: no limit
	SSEMaxIdle     time.Duration // close idle SSE connections after this (0 = never)
	Logger         *slog.Logger
	Limits         Limits // request pacing and memory bounds; zero fields take defaults
	// Auth authenticates and authorizes requests (guard.go); nil lets every request in.
	Auth *auth.Authorizer
	// CORSAllowedOrigins lists the origins browsers may read from ("*": all). nil: every
	// origin without Auth, none with it.
	CORSAllowedOrigins []string
}

// Server answers the protocol over HTTP on top of an Engine.
type Server struct {
	cfg       Config
	engine    engine.Engine
	metrics   metrics
	live      atomic.Int64
	ready     atomic.Bool
	clock     func() time.Time
	cold      *coldtier.Tier // nil without a cold store (EnableCold): every byte is hot
	bodies    *bodyBudget
	coldReads *coldBudget // cold bytes held for readers (coldread.go)
	flushes   flushLimiter
	admit     Admission // nil: writes are never refused for node pressure
	usage     usageMeter
	// clusterIDValue is the Ursula-Cluster-Id header value, shared by every answer.
	clusterIDValue []string
	sse            sseHub // SSE subscriptions parked without a goroutine (sse.go)
}

// New returns a server over eng.
func New(eng engine.Engine, cfg Config) *Server {
	if cfg.ClusterID == "" {
		cfg.ClusterID = NewClusterID()
	}
	if cfg.MaxLiveReaders == 0 {
		cfg.MaxLiveReaders = 65536 * runtime.GOMAXPROCS(0)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	s := &Server{cfg: cfg, engine: eng, clock: time.Now, bodies: newBodyBudget(cfg.Limits.InflightBodyBytes),
		coldReads: newColdBudget(cfg.Limits.InflightColdReadBytes)}
	s.clusterIDValue = []string{cfg.ClusterID}
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
func (s *Server) Engine() engine.Engine { return s.engine }

func (s *Server) now() int64 { return s.clock().UnixMilli() }

// target is a parsed stream address.
type target struct {
	bucket string
	stream string
	key    string // bucket/stream
	compat bool
	url    string // the path the client addressed (for Location)
}

// exchange is what ServeHTTP keeps for one request, in one allocation: the status
// recording writer, its response controller, and the paced copy of the request with its
// body (paceRequest). One allocation instead of four on every request.
type exchange struct {
	sw    statusWriter
	rc    http.ResponseController
	req   http.Request
	paced pacedBody
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	x := &exchange{sw: statusWriter{ResponseWriter: w}}
	rw := &x.sw
	s.commonHeaders(rw.Header(), r)
	r = s.paceRequest(x, r, start)
	defer func() {
		s.bodies.give(rw.bodyCharge)
		if rw.scratch != nil {
			putScratch(rw.scratch) // the handler is done with the body it read
		}
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

// Header values every answer carries. net/http never changes a value slice in place (it
// clones the map before writing it), Set and Del replace the slice and Add appends past
// its capacity, so the slices are shared by every request instead of allocated for each.
var (
	hdrProtocolValue = []string{streamcore.ProtocolVersion}
	hdrNoStore       = []string{"no-store"}
	hdrStar          = []string{"*"}
	hdrVaryOrigin    = []string{"Origin"}
	hdrNoSniff       = []string{"nosniff"}
	hdrCrossOrigin   = []string{"cross-origin"}
)

func (s *Server) commonHeaders(h http.Header, r *http.Request) {
	h["Ursula-Protocol"] = hdrProtocolValue
	h["Ursula-Cluster-Id"] = s.clusterIDValue
	h["Cache-Control"] = hdrNoStore
	if isOpsPath(r.URL.Path) {
		// Admin routes get no CORS grant: a web page must not drive the node's operations.
	} else if o := s.corsOrigin(r.Header.Get("Origin")); o != "" {
		if o == "*" {
			h["Access-Control-Allow-Origin"] = hdrStar
		} else {
			h["Access-Control-Allow-Origin"] = []string{o}
		}
		h["Access-Control-Expose-Headers"] = hdrStar
		if o != "*" {
			h["Vary"] = hdrVaryOrigin
		}
	}
	h["X-Content-Type-Options"] = hdrNoSniff
	h["Cross-Origin-Resource-Policy"] = hdrCrossOrigin
}

// writeResult writes a command's answer.
func (s *Server) writeResult(w http.ResponseWriter, r *http.Request, t *target, res streamcore.Result) {
	if res.Err != nil {
		s.writeError(w, r, res.Err)
		return
	}
	h := w.Header()
	// One backing array for all the values; each slice is capped at its one value, so an
	// Add to one header never writes over the next.
	vals := make([]string, len(res.Headers))
	for i, kv := range res.Headers {
		vals[i] = kv.Value
		h[kv.Name] = vals[i : i+1 : i+1]
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

type statusWriter struct {
	http.ResponseWriter
	status     int
	wrote      bool
	sent       int64        // body bytes written
	bodyCharge int64        // request body bytes charged to the node's budget until the request ends
	scratch    *scratchBody // a pooled request body, returned when the request ends
	bodyFrame  []byte       // the frame a large body was read into (finishExact)
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
	n, err := w.ResponseWriter.Write(b)
	w.sent += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
