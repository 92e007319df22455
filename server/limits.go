package server

// Node limits: how long a client may take to send and to receive, how many body bytes the
// node holds for clients, and whether the node takes writes at all (disk pressure).

import (
	"github.com/ursula-go/ursula/engine"
	"net/http"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// Limits bound what one client, and all clients together, can make the node hold.
type Limits struct {
	// InflightBodyBytes is the node-wide budget of request body bytes being read or held
	// by handlers. A body that does not fit is refused with 503 IngressBodyBytesLimitReached.
	InflightBodyBytes int64
	// BodyIdleTimeout is the longest gap allowed between two reads of a request body, and
	// the grace period before BodyMinRate applies. A slower body gets 408 BODY_TOO_SLOW.
	BodyIdleTimeout time.Duration
	// BodyMinRate is the average pace, in bytes a second, a body must keep after the
	// first BodyIdleTimeout (0 = only the gap is checked).
	BodyMinRate int64
	// WriteTimeout bounds the sending of a whole non-live response (after its request
	// body arrived). Long-poll and SSE are exempt; each SSE write gets LiveWriteTimeout.
	WriteTimeout time.Duration
	// LiveWriteTimeout bounds each write of an SSE stream: a reader that stops reading is
	// disconnected once its socket buffers are full for this long (at least three quarters
	// of it once the subscription owns its connection: see sseSub.writeChunk).
	LiveWriteTimeout time.Duration
	// SSEKeepAlive is the interval of SSE comment lines on a quiet stream, so proxies and
	// clients see the connection alive and a vanished reader is noticed.
	SSEKeepAlive time.Duration
	// ColdReadBytes is the most a catch-up read (plain, long-poll or SSE event) takes
	// from the cold tier at once; the client reads on from Stream-Next-Offset.
	ColdReadBytes int64
	// InflightColdReadBytes is the node-wide budget of cold-tier bytes held for readers
	// until their clients took them. A read that finds no room within a second gets 503
	// COLD_READ_BACKPRESSURE with Retry-After.
	InflightColdReadBytes int64
	// MaxStreamsPerBucket caps the live streams of one bucket (0: no cap). A create of a
	// new stream past it gets 429 STREAMS_PER_BUCKET_LIMIT and creates nothing.
	MaxStreamsPerBucket int
}

// Default limits (documented in README.md, "Limits").
const (
	DefaultInflightBodyBytes     = 256 << 20
	DefaultBodyIdleTimeout       = 10 * time.Second
	DefaultBodyMinRate           = 4 << 10
	DefaultWriteTimeout          = 60 * time.Second
	DefaultLiveWriteTimeout      = 30 * time.Second
	DefaultSSEKeepAlive          = 15 * time.Second
	DefaultColdReadBytes         = 1 << 20
	DefaultInflightColdReadBytes = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.InflightBodyBytes <= 0 {
		l.InflightBodyBytes = DefaultInflightBodyBytes
	}
	if l.BodyIdleTimeout <= 0 {
		l.BodyIdleTimeout = DefaultBodyIdleTimeout
	}
	if l.BodyMinRate == 0 {
		l.BodyMinRate = DefaultBodyMinRate
	}
	if l.BodyMinRate < 0 {
		l.BodyMinRate = 0
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	if l.LiveWriteTimeout <= 0 {
		l.LiveWriteTimeout = DefaultLiveWriteTimeout
	}
	if l.SSEKeepAlive <= 0 {
		l.SSEKeepAlive = DefaultSSEKeepAlive
	}
	if l.ColdReadBytes <= 0 {
		l.ColdReadBytes = DefaultColdReadBytes
	}
	if l.InflightColdReadBytes <= 0 {
		l.InflightColdReadBytes = DefaultInflightColdReadBytes
	}
	return l
}

// paceRequest sets the response's write deadline and paces the request body. The write
// deadline restarts once the body has arrived, so a slow upload does not eat it.
//
// It returns a shallow copy of r (in x) carrying the paced body: the server's own request
// must keep its body, or net/http, seeing an unknown body type, tries to drain a declared
// but never sent body before answering, and waits for it forever.
func (s *Server) paceRequest(x *exchange, r *http.Request, start time.Time) *http.Request {
	x.rc = *http.NewResponseController(&x.sw)
	rc := &x.rc
	wt := s.cfg.Limits.WriteTimeout
	rc.SetWriteDeadline(start.Add(wt)) // ErrNotSupported off a real connection: nothing to bound
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r
	}
	x.req = *r
	x.paced = pacedBody{
		body: r.Body, rc: rc, start: start,
		idle: s.cfg.Limits.BodyIdleTimeout, minRate: s.cfg.Limits.BodyMinRate,
		writeTimeout: wt,
	}
	x.req.Body = &x.paced
	return &x.req
}

// Admission says whether the node takes writes now. WriteRefusal returns "" when it does,
// or the refusal's token (such as "WalDiskPressure") and why.
type Admission interface {
	WriteRefusal() (token, reason string)
}

// CodeWalDiskPressure refuses a write while the node journal's disk is (nearly) full.
const CodeWalDiskPressure = "WAL_DISK_PRESSURE"

// SetAdmission installs the node's write admission (before serving).
func (s *Server) SetAdmission(a Admission) { s.admit = a }

// admitWrite refuses a write before its body is read while the node is under pressure.
func (s *Server) admitWrite() *streamcore.Error {
	if s.admit == nil {
		return nil
	}
	token, why := s.admit.WriteRefusal()
	if token == "" {
		return nil
	}
	code := CodeWalDiskPressure
	if token != "WalDiskPressure" {
		code = "WRITE_ADMISSION"
	}
	return streamcore.Errorf(http.StatusServiceUnavailable, code, "the node takes no writes now: %s", why).
		With(streamcore.HdrRetryAfter, "1").With(streamcore.HdrNotApplied, token)
}

// CodeStreamsPerBucketLimit refuses the create of a stream in a bucket at its cap.
const CodeStreamsPerBucketLimit = "STREAMS_PER_BUCKET_LIMIT"

// admitStream refuses the create of a new stream at key when its bucket already holds
// MaxStreamsPerBucket live streams. A repeat of a create of an existing stream passes.
// The count is this node's applied state of every group, read before the proposal:
// creates racing in the same bucket (on one node, or on the leaders of different groups)
// can each pass at the cap minus one, so the cap may be overshot by their number.
func (s *Server) admitStream(key string) *streamcore.Error {
	max := s.cfg.Limits.MaxStreamsPerBucket
	bc, ok := s.engine.(engine.BucketCounter)
	if max <= 0 || !ok {
		return nil
	}
	exists := false
	s.engine.View(key, s.now(), func(_ *streamcore.State, st *streamcore.Stream) { exists = st != nil })
	if exists {
		return nil
	}
	if bc.BucketStreams(streamcore.BucketOf(key)) < max {
		return nil
	}
	return streamcore.Errorf(http.StatusTooManyRequests, CodeStreamsPerBucketLimit,
		"the bucket holds as many streams as the node allows (%d)", max).
		With(streamcore.HdrNotApplied, "StreamsPerBucketLimit")
}
