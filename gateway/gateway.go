package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/internal/inlinehttp"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// Redirect following bounds: a request meets at most MaxRedirectHops leader redirects,
// and no hop starts later than RedirectWindow after the first redirect.
const (
	MaxRedirectHops = 3
	RedirectWindow  = 5 * time.Second
)

// Config is what a Gateway needs.
type Config struct {
	// Upstreams are the nodes, by the URLs their redirects name (their peer URLs). Only
	// these hosts are ever contacted, in this order when no redirect says otherwise.
	Upstreams []*url.URL
	// Auth authenticates and authorizes clients exactly as a node does; nil: the gateway
	// is a trusted pass-through.
	Auth *auth.Authorizer
	// Quotas are the per-bucket limits; nil: none.
	Quotas *Quotas
	// MaxRequestBodyBytes bounds a request body (0: the protocol's maximum, which is also
	// the ceiling: a larger limit would accept bodies the nodes refuse after forwarding).
	MaxRequestBodyBytes int64
	// Usage counts every request; nil: none.
	Usage *UsageLog
	// UpstreamToken, when set and not empty, is the gateway's own bearer token towards the
	// nodes (for nodes that run with auth on): clients' tokens are never forwarded.
	UpstreamToken func() string
	// EjectFor is how long an upstream whose connection failed is tried only after the
	// others (0: DefaultEjectFor).
	EjectFor time.Duration
	// MaxInflightBodyBytes is the gateway-wide budget of request body bytes it holds
	// (buffered for forwarding); a body that does not fit is refused with 503
	// IngressBodyBytesLimitReached, as a node does. 0: DefaultInflightBodyBytes.
	MaxInflightBodyBytes int64
	// CORSAllowedOrigins lists the origins browsers may read from ("*": all); the gateway
	// answers preflight and sets the CORS headers itself. nil: every origin without auth,
	// none with auth (a node's rule).
	CORSAllowedOrigins []string
	// Transport reaches the upstreams; nil: an inline HTTP/1.1 transport (each exchange
	// in the handler's goroutine, internal/inlinehttp) with UpstreamConnectTimeout.
	Transport http.RoundTripper
	// UpstreamConnectTimeout bounds a connection to an upstream in the default Transport
	// (0: DefaultUpstreamConnectTimeout).
	UpstreamConnectTimeout time.Duration
	// UpstreamResponseHeaderTimeout bounds the wait for an upstream's response headers
	// once the request is sent, except for live reads (long-poll, SSE), which wait for
	// data by design. Past it the client gets 504 UPSTREAM_TIMEOUT, unmarked: a write may
	// have been applied. 0: DefaultUpstreamResponseHeaderTimeout; negative: none.
	UpstreamResponseHeaderTimeout time.Duration
	// BodyIdleTimeout is the longest gap between two reads of a request body, and the
	// grace before BodyMinRate applies; a slower body gets 408 BODY_TOO_SLOW, as from a
	// node. 0: server.DefaultBodyIdleTimeout.
	BodyIdleTimeout time.Duration
	// WriteTimeout bounds the relay of a whole non-live answer to the client; a client
	// that stops reading is disconnected (0: server.DefaultWriteTimeout).
	WriteTimeout time.Duration
	// LiveWriteTimeout bounds each write of a live read's answer (long-poll, SSE)
	// (0: server.DefaultLiveWriteTimeout).
	LiveWriteTimeout time.Duration
	// BodyMinRate is the average pace in bytes a second a body keeps after the first
	// BodyIdleTimeout. 0: server.DefaultBodyMinRate; negative: only the gap is checked.
	BodyMinRate int64
	Logger      *slog.Logger
}

// Defaults of Config.
const (
	DefaultInflightBodyBytes             = 256 << 20 // gateway-wide request body budget
	DefaultUpstreamConnectTimeout        = 5 * time.Second
	DefaultUpstreamResponseHeaderTimeout = 30 * time.Second
)

// CodeUpstreamTimeout answers a request whose upstream sent no response headers within
// Config.UpstreamResponseHeaderTimeout.
const CodeUpstreamTimeout = "UPSTREAM_TIMEOUT"

// CodeIngressBodyLimit is the node's code for a body that does not fit the budget.
const CodeIngressBodyLimit = server.CodeIngressBodyLimit

// Gateway is an http.Handler forwarding to the upstream nodes.
type Gateway struct {
	cfg      Config
	client   *http.Client
	now      func() time.Time
	up       *upstreams
	metrics  *metrics
	bodyUsed atomic.Int64
	settings atomic.Pointer[settings]
}

// settings are what a reload may change.
type settings struct {
	maxBody     int64
	maxInflight int64
	cors        []string
}

func checkSettings(maxBody, maxInflight int64, cors []string) (*settings, error) {
	switch {
	case maxBody == 0:
		maxBody = streamcore.MaxRequestBytes
	case maxBody < 0 || maxBody > streamcore.MaxRequestBytes:
		return nil, fmt.Errorf("gateway: max request body %d is outside 1..%d (the nodes' limit)", maxBody, streamcore.MaxRequestBytes)
	}
	switch {
	case maxInflight == 0:
		maxInflight = DefaultInflightBodyBytes
	case maxInflight < 0:
		return nil, fmt.Errorf("gateway: max in-flight body bytes %d is negative", maxInflight)
	}
	for _, o := range cors {
		if o != "*" && (!strings.Contains(o, "://") || strings.HasSuffix(o, "/")) {
			return nil, fmt.Errorf("gateway: CORS origin %q is not \"*\" or scheme://host[:port]", o)
		}
	}
	return &settings{maxBody: maxBody, maxInflight: maxInflight, cors: cors}, nil
}

// Update replaces the settings a reload may change: the body limit, the in-flight body
// budget and the CORS origins. Invalid values change nothing.
func (g *Gateway) Update(maxRequestBodyBytes, maxInflightBodyBytes int64, corsAllowedOrigins []string) error {
	st, err := checkSettings(maxRequestBodyBytes, maxInflightBodyBytes, corsAllowedOrigins)
	if err != nil {
		return err
	}
	g.settings.Store(st)
	return nil
}

// New checks cfg and returns the gateway.
func New(cfg Config) (*Gateway, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("gateway: no upstream")
	}
	for _, u := range cfg.Upstreams {
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("gateway: upstream %q is not an http(s) URL", u)
		}
	}
	st, err := checkSettings(cfg.MaxRequestBodyBytes, cfg.MaxInflightBodyBytes, cfg.CORSAllowedOrigins)
	if err != nil {
		return nil, err
	}
	if cfg.UpstreamConnectTimeout <= 0 {
		cfg.UpstreamConnectTimeout = DefaultUpstreamConnectTimeout
	}
	if cfg.UpstreamResponseHeaderTimeout == 0 {
		cfg.UpstreamResponseHeaderTimeout = DefaultUpstreamResponseHeaderTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = server.DefaultWriteTimeout
	}
	if cfg.LiveWriteTimeout <= 0 {
		cfg.LiveWriteTimeout = server.DefaultLiveWriteTimeout
	}
	if cfg.BodyIdleTimeout <= 0 {
		cfg.BodyIdleTimeout = server.DefaultBodyIdleTimeout
	}
	switch {
	case cfg.BodyMinRate == 0:
		cfg.BodyMinRate = server.DefaultBodyMinRate
	case cfg.BodyMinRate < 0:
		cfg.BodyMinRate = 0
	}
	if cfg.Transport == nil {
		cfg.Transport = inlinehttp.New(&http.Transport{
			DialContext:         (&net.Dialer{Timeout: cfg.UpstreamConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		})
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, now: time.Now, up: newUpstreams(cfg.Upstreams, cfg.EjectFor), metrics: newMetrics()}
	g.settings.Store(st)
	// Redirects are followed by hand: only to listed upstreams, with the mark bookkeeping.
	g.client = &http.Client{Transport: cfg.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return g, nil
}

// target is what a request addresses, for authorization, quotas and usage.
type target struct {
	bucket, stream string
	act            auth.Action
	open           bool // readiness: no credentials asked
	live           bool // a long-poll or SSE read
}

func classify(r *http.Request) (target, *streamcore.Error) {
	raw := r.URL.EscapedPath()
	t := target{act: auth.Write, live: r.URL.Query().Has("live")}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		t.act = auth.Read
	}
	switch {
	case raw == "/__ursula/ready":
		t.open = true
		return t, nil
	case strings.HasPrefix(raw, "/__ursula/") || raw == "/__ursula" || raw == "/metrics":
		t.act = auth.Admin
		return t, nil
	case strings.HasPrefix(raw, server.CompatPrefix):
		name, err := url.PathUnescape(raw[len(server.CompatPrefix):])
		if err != nil {
			return t, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "path is not valid percent-encoding")
		}
		t.bucket, t.stream = server.CompatBucket, name
		return t, nil
	}
	segs := strings.SplitN(strings.TrimPrefix(raw, "/"), "/", 3)
	for i, s := range segs {
		d, err := url.PathUnescape(s)
		if err != nil || strings.Contains(d, "/") {
			return t, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "path is not valid percent-encoding")
		}
		segs[i] = d
	}
	t.bucket = segs[0]
	if len(segs) > 1 {
		t.stream = segs[1]
	}
	return t, nil
}

// ServeHTTP authenticates, applies quotas, forwards and records usage.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &countingWriter{ResponseWriter: w}
	in := &countingReader{r: r.Body}
	if r.Body != nil {
		r.Body = in
	}
	rec := UsageRecord{Action: actionClass(r)}
	g.cors(w.Header(), r)
	g.serve(cw, r, &rec)
	if cw.status == 0 {
		cw.status = http.StatusOK
	}
	g.metrics.request(cw.status)
	if g.cfg.Usage != nil {
		rec.Status = cw.status
		rec.BytesIn, rec.BytesOut = in.n, cw.n
		g.cfg.Usage.Add(rec)
	}
}

func (g *Gateway) serve(w *countingWriter, r *http.Request, rec *UsageRecord) {
	if r.Method == http.MethodOptions {
		// Preflight: the same answer for every path, before and without credentials.
		g.preflight(w, r)
		return
	}
	t, e := classify(r)
	if e != nil {
		g.refuse(w, r, e, "InvalidRequest")
		return
	}
	if !t.open && t.act != auth.Admin {
		rec.Bucket = t.bucket
	}
	var p *auth.Principal
	if a := g.cfg.Auth; a != nil && !t.open {
		var err error
		p, err = a.Authenticate(r.Header.Get("Authorization"))
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			g.refuse(w, r, streamcore.Errorf(http.StatusUnauthorized, server.CodeUnauthorized, "the bearer token is not valid"), "Unauthorized")
			return
		}
		switch a.Decide(p, t.bucket, t.act) {
		case auth.Allow:
		case auth.Unauthenticated:
			w.Header().Set("WWW-Authenticate", "Bearer")
			g.refuse(w, r, streamcore.Errorf(http.StatusUnauthorized, server.CodeUnauthorized, "this request needs a bearer token"), "Unauthorized")
			return
		default:
			// Conceal: the answer a node gives for a bucket nothing created.
			if t.act == auth.Admin {
				g.refuse(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such operational endpoint"), "NotFound")
			} else {
				g.refuse(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeBucketNotFound, "bucket does not exist"), "NotFound")
			}
			return
		}
		if p != nil {
			rec.Principal = p.Issuer + "|" + p.Subject
		}
	}
	if r.URL.Path == "/metrics" {
		// The gateway's own metrics (a node's are on its admin listener).
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			g.refuse(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeMethodNotAllowed, "method %s is not supported here", r.Method), "MethodNotAllowed")
			return
		}
		g.serveMetrics(w)
		return
	}
	st := g.settings.Load()
	limit := st.maxBody
	if q := g.cfg.Quotas; q != nil && t.bucket != "" {
		lim := q.limitsOf(t.bucket)
		if lim.MaxRequestBodyBytes > 0 && lim.MaxRequestBodyBytes < limit {
			limit = lim.MaxRequestBodyBytes
		}
		if wait, ok := q.take(t.bucket, g.now()); !ok {
			secs := int((wait + time.Second - 1) / time.Second)
			g.refuse(w, r, streamcore.Errorf(http.StatusTooManyRequests, "RATE_LIMITED", "tenant request rate limit exceeded").
				With(streamcore.HdrRetryAfter, strconv.Itoa(max(secs, 1))), "TenantRequestRate")
			return
		}
		if t.live && t.act == auth.Read {
			if !q.acquireLive(t.bucket) {
				g.refuse(w, r, streamcore.Errorf(http.StatusTooManyRequests, "RATE_LIMITED", "tenant concurrent live read limit exceeded").
					With(streamcore.HdrRetryAfter, "1"), "TenantLiveReads")
				return
			}
			defer q.releaseLive(t.bucket)
		}
	}
	r = server.PaceBody(w, r, g.cfg.BodyIdleTimeout, g.cfg.BodyMinRate)
	body, charged, e := g.readBody(r, limit, st.maxInflight)
	defer g.bodyUsed.Add(-charged)
	if e != nil {
		g.refuse(w, r, e, e.Headers[streamcore.HdrNotApplied])
		return
	}
	if r.Method == http.MethodPost || r.Method == http.MethodPut && len(body) > 0 {
		// An append, or a create with initial data: an empty create writes nothing.
		rec.Chunks = g.cfg.Usage.chunksOf(int64(len(body)))
	}
	var expires time.Time
	if p != nil && t.live {
		expires = p.Expires
	}
	g.forward(w, r, routeKey(t.bucket, t.stream), body, &expires)
}

// bodyStep is the unit a body is read in and charged to the in-flight budget by.
const bodyStep = 64 << 10

// readBody buffers a request body of at most limit bytes (a redirect hop sends it again),
// charging what it holds to the gateway's in-flight budget of maxInflight bytes. The
// caller gives back charged when the request ends, whatever the outcome.
func (g *Gateway) readBody(r *http.Request, limit, maxInflight int64) (body []byte, charged int64, e *streamcore.Error) {
	tooLarge := func() *streamcore.Error {
		return streamcore.Errorf(http.StatusRequestEntityTooLarge, streamcore.CodeInvalidRequest, "the request body is over %d bytes", limit).
			With(streamcore.HdrMaxRequestBytes, strconv.FormatInt(limit, 10)).
			With(streamcore.HdrNotApplied, "RequestBodyTooLarge")
	}
	if r.ContentLength > limit {
		return nil, 0, tooLarge()
	}
	if r.Body == nil || r.ContentLength == 0 {
		return nil, 0, nil
	}
	take := func(n int64) bool {
		if g.bodyUsed.Add(n) > maxInflight {
			g.bodyUsed.Add(-n)
			return false
		}
		charged += n
		return true
	}
	full := streamcore.Errorf(http.StatusServiceUnavailable, CodeIngressBodyLimit, "the gateway holds as many request body bytes in flight as it admits").
		With(streamcore.HdrRetryAfter, "1").
		With(streamcore.HdrNotApplied, "IngressBodyBytesLimitReached")
	if r.ContentLength > 0 {
		// A declared length is charged whole before a byte is read: waiting for a body
		// that cannot fit would only hold the budget.
		if !take(r.ContentLength) {
			return nil, charged, full
		}
		b := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, charged, unreadable(err)
		}
		return b, charged, nil
	}
	var b []byte
	for {
		if !take(bodyStep) {
			return nil, charged, full
		}
		n := len(b)
		b = append(b, make([]byte, bodyStep)...)
		// A chunked body cut before its last chunk is an error, not its end (FillBody).
		m, err := server.FillBody(r.Body, b[n:])
		b = b[:n+m]
		if int64(len(b)) > limit {
			return nil, charged, tooLarge()
		}
		if err == io.EOF {
			return b, charged, nil
		}
		if err != nil {
			return nil, charged, unreadable(err)
		}
	}
}

func unreadable(err error) *streamcore.Error {
	if errors.Is(err, server.ErrBodyTooSlow) {
		return server.BodyTooSlow()
	}
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "the request body could not be read").
		With(streamcore.HdrNotApplied, "RequestBodyUnreadable")
}

// refuse answers a request the gateway decided not to forward: nothing was applied, so
// the answer carries the mark (token) and the vouch. It carries none of the nodes'
// route-level headers (Ursula-Protocol, Ursula-Cluster-Id): those come only from a node.
func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, e *streamcore.Error, token string) {
	g.metrics.refusal(token)
	h := w.Header()
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	h.Set(streamcore.HdrNotApplied, token)
	h.Set(streamcore.HdrNotAppliedChecked, "1")
	h.Set("Content-Type", "application/json")
	if r.Method == http.MethodHead {
		w.WriteHeader(e.Status)
		return
	}
	b := e.Body()
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.Status)
	w.Write(b)
}

// forward sends r (with body) to the upstreams, following leader redirects, and relays
// the final answer. key names the stream for the leader memory. expires (non-nil,
// non-zero) ends a live read at the credential's expiry with a credential-expired event.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, key string, body []byte, expires *time.Time) {
	order := g.up.order(key, g.now())
	tried := make(map[string]bool, len(order))
	next := func() *url.URL {
		for _, u := range order {
			if !tried[u.Host] {
				return u
			}
		}
		return nil
	}
	up, uri := order[0], r.URL.RequestURI()
	hops, allMarked := 0, true
	var firstRedirect time.Time
	leaderNotFound := func() {
		e := streamcore.Errorf(http.StatusServiceUnavailable, "LEADER_NOT_FOUND", "no upstream leads the stream's group").With(streamcore.HdrRetryAfter, "1")
		g.relayRefusal(w, r, e, allMarked, "LeaderNotFound")
	}
	for {
		tried[up.Host] = true
		res, err := g.send(r, up, uri, body)
		if err != nil {
			if r.Context().Err() != nil {
				return // the client left
			}
			if errors.Is(err, errUpstreamTimeout) {
				// The request went out: the outcome is unknown, unmarked.
				g.metrics.upstreamError(up.Host, "timeout")
				g.cfg.Logger.Warn("gateway: upstream sent no response headers in time", "upstream", up.Host, "timeout", g.cfg.UpstreamResponseHeaderTimeout)
				e := streamcore.Errorf(http.StatusGatewayTimeout, CodeUpstreamTimeout, "the upstream did not answer within %s", g.cfg.UpstreamResponseHeaderTimeout)
				g.relayRefusal(w, r, e, false, "")
				return
			}
			if isDialError(err) {
				// Nothing of the request went out: another upstream may take it, and
				// this one goes last for a while.
				g.metrics.upstreamError(up.Host, "connect")
				if !g.up.isEjected(up.Host, g.now()) {
					g.cfg.Logger.Warn("gateway: upstream ejected after a failed connection", "upstream", up.Host, "for", g.up.ejectFor, "err", err)
				}
				g.up.eject(up.Host, g.now())
				if n := next(); n != nil {
					up, uri = n, r.URL.RequestURI()
					continue
				}
				e := streamcore.Errorf(http.StatusServiceUnavailable, "UPSTREAM_UNREACHABLE", "no upstream could be reached").With(streamcore.HdrRetryAfter, "1")
				g.relayRefusal(w, r, e, allMarked, "UpstreamUnreachable")
				return
			}
			// Part of the request may have reached a node: the outcome is unknown, unmarked.
			g.metrics.upstreamError(up.Host, "exchange")
			g.cfg.Logger.Warn("gateway: upstream exchange failed", "upstream", up.Host, "err", err)
			e := streamcore.Errorf(http.StatusBadGateway, "UPSTREAM_FAILED", "the upstream exchange failed")
			g.relayRefusal(w, r, e, false, "")
			return
		}
		g.up.answered(up.Host)
		if res.StatusCode != http.StatusTemporaryRedirect && res.StatusCode != http.StatusPermanentRedirect {
			if hops > 0 && res.StatusCode < 500 {
				// This upstream answered after a redirect: go to it first next time.
				g.up.remember(key, up.Host)
			}
			if !allMarked {
				// A redirect without a mark may have followed a proposal: the final
				// answer's mark can no longer be vouched for.
				res.Header.Del(streamcore.HdrNotApplied)
			}
			g.relay(w, r, res, expires)
			return
		}
		g.metrics.redirect()
		loc := res.Header.Get("Location")
		allMarked = allMarked && res.Header.Get(streamcore.HdrNotApplied) != ""
		io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		res.Body.Close()
		now := g.now()
		if hops == 0 {
			firstRedirect = now
		}
		hops++
		if hops > MaxRedirectHops || now.Sub(firstRedirect) > RedirectWindow {
			leaderNotFound()
			return
		}
		to, err := res.Request.URL.Parse(loc)
		if n := g.upstreamOf(to); err == nil && n != nil && !tried[n.Host] {
			up, uri = n, to.RequestURI()
		} else if n := next(); n != nil {
			// A target outside the list, or one already tried: search the rest in order.
			up, uri = n, r.URL.RequestURI()
		} else {
			leaderNotFound()
			return
		}
	}
}

// upstreamOf is the listed upstream u points at (same scheme and host), or nil.
func (g *Gateway) upstreamOf(u *url.URL) *url.URL {
	if u == nil {
		return nil
	}
	for _, up := range g.cfg.Upstreams {
		if strings.EqualFold(up.Scheme, u.Scheme) && strings.EqualFold(up.Host, u.Host) {
			return up
		}
	}
	return nil
}

// hopHeaders are connection-scoped and never forwarded either way.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func dropHopHeaders(h http.Header) {
	for _, c := range h.Values("Connection") {
		for _, name := range strings.Split(c, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

func (g *Gateway) send(r *http.Request, up *url.URL, uri string, body []byte) (*http.Response, error) {
	u, err := up.Parse(uri)
	if err != nil {
		return nil, err
	}
	u.Scheme, u.Host = up.Scheme, up.Host
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	out, err := http.NewRequestWithContext(ctx, r.Method, u.String(), rd)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	out.Header = r.Header.Clone()
	dropHopHeaders(out.Header)
	// Credentials end here: the nodes never see end-user tokens.
	out.Header.Del("Authorization")
	if g.cfg.UpstreamToken != nil {
		if tok := g.cfg.UpstreamToken(); tok != "" {
			out.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	out.ContentLength = int64(len(body))
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		out.Header.Set("X-Forwarded-For", host)
	}
	var timer *time.Timer
	if d := g.cfg.UpstreamResponseHeaderTimeout; d > 0 && !r.URL.Query().Has("live") {
		timer = time.AfterFunc(d, func() { cancel(errUpstreamTimeout) })
	}
	res, err := g.client.Do(out)
	if timer != nil && !timer.Stop() && err == nil {
		// The headers came as the timer fired: the context is gone, and the body with it.
		res.Body.Close()
		err = errUpstreamTimeout
	}
	if err != nil {
		if context.Cause(ctx) == errUpstreamTimeout {
			err = errUpstreamTimeout
		}
		cancel(nil)
		return nil, err
	}
	res.Body = &cancelOnClose{ReadCloser: res.Body, cancel: cancel}
	return res, nil
}

var errUpstreamTimeout = errors.New("gateway: upstream response header timeout")

// cancelOnClose ends an upstream request's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// relayRefusal answers a refusal of the gateway's own after forwarding started: marked
// (token) only when every redirect the request met was marked, vouched always.
func (g *Gateway) relayRefusal(w http.ResponseWriter, r *http.Request, e *streamcore.Error, marked bool, token string) {
	if marked && token != "" {
		g.refuse(w, r, e, token)
		return
	}
	g.metrics.refusal(e.Code)
	h := w.Header()
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	h.Set(streamcore.HdrNotAppliedChecked, "1")
	h.Set("Content-Type", "application/json")
	b := e.Body()
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.Status)
	if r.Method != http.MethodHead {
		w.Write(b)
	}
}

// sseCredentialExpired is the last frame of a live read whose credential expired.
const sseCredentialExpired = "event: credential-expired\ndata: {}\n\n"

// relay copies the upstream answer to the client, flushing every read so live reads
// (SSE, long-poll) reach the client as they come.
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, res *http.Response, expires *time.Time) {
	defer res.Body.Close()
	h := w.Header()
	for k, vs := range res.Header {
		switch {
		case strings.HasPrefix(k, "Access-Control-"):
			// CORS headers are the gateway's (set before forwarding).
		case k == "Vary":
			for _, v := range vs {
				if !slices.Contains(h[k], v) {
					h[k] = append(h[k], v)
				}
			}
		default:
			h[k] = vs
		}
	}
	dropHopHeaders(h)
	h.Set(streamcore.HdrNotAppliedChecked, "1")
	rc := http.NewResponseController(w)
	// A client that stops reading must not hold the handler and the upstream exchange:
	// the whole answer gets WriteTimeout, a live one LiveWriteTimeout per write. The
	// deadline is cleared at the end, as the connection may serve another request.
	live := r.URL.Query().Has("live")
	wt := g.cfg.WriteTimeout
	if live {
		wt = g.cfg.LiveWriteTimeout
	}
	rc.SetWriteDeadline(time.Now().Add(wt))
	defer rc.SetWriteDeadline(time.Time{})
	w.WriteHeader(res.StatusCode)
	rc.Flush()
	sse := strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
	var timer *time.Timer
	if expires != nil && !expires.IsZero() && sse {
		// The subscription must not outlive its credential: close the upstream body at
		// exp, then say why.
		fired, cancel := context.WithCancel(context.Background())
		defer cancel()
		timer = time.AfterFunc(time.Until(*expires), func() {
			res.Body.Close()
			cancel()
		})
		defer func() {
			if timer.Stop() {
				return // the upstream ended first
			}
			<-fired.Done()
			io.WriteString(w, sseCredentialExpired)
			rc.Flush()
		}()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		if n > 0 {
			if live {
				rc.SetWriteDeadline(time.Now().Add(wt))
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// countingWriter counts the bytes and keeps the status sent to the client.
type countingWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (c *countingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's Flush.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// countingReader counts the request body bytes read.
type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }
