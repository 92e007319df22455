// Package inlinehttp is an HTTP/1.1 client transport that does each exchange in the
// calling goroutine: the client package's default transport and the gateway's way to its
// upstreams.
package inlinehttp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Transport is an http.RoundTripper that sends each HTTP/1.1 request and reads its
// answer in the calling goroutine, over kept-alive connections of its own.
//
// Why: net/http's Transport gives every connection a reader and a writer goroutine, so
// one request is handed between three goroutines, and on a small machine every hand-off
// wakes an idle CPU. A replicated commit is one small request waited on; those hand-offs
// were a fifth to a quarter of an append's round trip to a server in another process on
// loopback (see docs/performance.md).
//
// What it leaves to Fallback (unchanged behaviour there): requests through a proxy,
// schemes other than http and https, and requests with Expect or Upgrade headers. Over
// TLS it offers HTTP/1.1 only (ALPN), so a server that would speak HTTP/2 speaks 1.1.
// It dials, resolves and configures TLS as Fallback does (its DialContext,
// TLSClientConfig, TLSHandshakeTimeout, IdleConnTimeout, MaxIdleConnsPerHost,
// DisableKeepAlives).
//
// Cancellation: the request's context interrupts a blocked write or read, also while
// the answer's body is being read, as with net/http; the connection is then closed.
type Transport struct {
	Fallback *http.Transport

	mu      sync.Mutex
	idle    map[string][]*inlineConn // by connection key (scheme://host:port), newest last
	reaping bool                     // a sweep of the idle connections is scheduled
	// reapEvery is how often idle connections are swept (0: reapInterval; tests).
	reapEvery time.Duration
}

// New returns a Transport over fallback (nil: a clone of http.DefaultTransport).
func New(fallback *http.Transport) *Transport {
	if fallback == nil {
		fallback = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &Transport{Fallback: fallback, idle: map[string][]*inlineConn{}}
}

type inlineConn struct {
	key    string
	conn   net.Conn
	raw    net.Conn // the TCP connection under TLS (conn itself for plain TCP)
	br     *bufio.Reader
	bw     *bufio.Writer // writes through sent
	sent   countingWriter
	idleAt time.Time
}

// countingWriter counts the bytes the connection took: a request none of whose bytes left
// can be sent again on another connection, whatever its method.
type countingWriter struct {
	w net.Conn
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// inlineWriteBuffer is the size of a connection's write buffer: a request of this size
// (head and body) leaves in one write.
const inlineWriteBuffer = 32 << 10

// aLongTimeAgo is a deadline in the past, set to interrupt a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// CloseIdleConnections closes the idle connections of both transports.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*inlineConn{}
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.conn.Close()
		}
	}
	t.Fallback.CloseIdleConnections()
}

func (t *Transport) inline(req *http.Request) bool {
	if req.URL == nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") || req.URL.Host == "" {
		return false
	}
	if req.Header.Get("Expect") != "" || req.Header.Get("Upgrade") != "" {
		return false
	}
	if t.Fallback.Proxy != nil {
		if u, err := t.Fallback.Proxy(req); err != nil || u != nil {
			return false
		}
	}
	return true
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.inline(req) {
		return t.Fallback.RoundTrip(req)
	}
	if t.Fallback.DisableKeepAlives && !req.Close {
		r2 := *req
		r2.Close = true // "Connection: close", as net/http sends then
		req = &r2
	}
	ctx := req.Context()
	key := req.URL.Scheme + "://" + hostPort(req.URL.Scheme, req.URL.Host)
	for {
		pc, reused, err := t.get(ctx, key, req)
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
		res, retry, err := t.exchange(ctx, pc, reused, req)
		if err == nil {
			return res, nil
		}
		if !retry {
			return nil, err
		}
		// A kept-alive connection the server had closed: send again on a new one, as
		// net/http does, when nothing of the request was taken or it may be replayed.
		if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			r2 := *req
			r2.Body = body
			req = &r2
		}
	}
}

// exchange writes req on pc and reads the answer head. retry says the failure happened
// on a reused connection before the server can have acted on the request.
func (t *Transport) exchange(ctx context.Context, pc *inlineConn, reused bool, req *http.Request) (*http.Response, bool, error) {
	stop := context.AfterFunc(ctx, func() { pc.conn.SetDeadline(aLongTimeAgo) })
	fail := func(err error) error {
		stop()
		pc.conn.Close()
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return err
	}
	pc.sent.n = 0
	werr := req.Write(pc.bw)
	if werr == nil {
		werr = pc.bw.Flush()
	}
	if werr != nil {
		// The server may have answered and closed before taking the whole body (a
		// refusal): read what it said.
		pc.conn.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		if res, err := readAnswer(pc.br, req); err == nil {
			pc.conn.SetReadDeadline(time.Time{})
			res.Close = true
			return t.wrap(res, pc, stop), false, nil
		}
		// No answer, and not a byte of the request left (a pooled connection the server
		// had closed): it can go again on another connection, as net/http does. Once
		// some bytes left, only the caller can tell whether sending again is safe.
		return nil, reused && pc.sent.n == 0 && ctx.Err() == nil && (req.Body == nil || req.Body == http.NoBody || req.GetBody != nil), fail(werr)
	}
	res, err := readAnswer(pc.br, req)
	if err != nil {
		replayable := req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodOptions ||
			req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
		// ReadResponse says io.ErrUnexpectedEOF for a connection closed before a byte.
		nothing := (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) && pc.br.Buffered() == 0
		return nil, reused && nothing && replayable && ctx.Err() == nil && (req.Body == nil || req.Body == http.NoBody || req.GetBody != nil), fail(err)
	}
	return t.wrap(res, pc, stop), false, nil
}

// readAnswer reads the final answer to req, past informational (1xx) answers such as
// 103 Early Hints, as net/http's transport does (101 is final: an Upgrade is not sent
// here).
func readAnswer(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		res, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if res.StatusCode < 100 || res.StatusCode > 199 || res.StatusCode == http.StatusSwitchingProtocols {
			return res, nil
		}
	}
}

// wrap hands the connection back when the answer's body has been read to its end.
func (t *Transport) wrap(res *http.Response, pc *inlineConn, stop func() bool) *http.Response {
	if tc, ok := pc.conn.(*tls.Conn); ok {
		st := tc.ConnectionState()
		res.TLS = &st
	}
	b := &inlineBody{t: t, pc: pc, rc: res.Body, stop: stop, keep: !res.Close}
	if res.Body == http.NoBody { // ReadResponse's body of HEAD, 204, 304 and Content-Length: 0
		b.finish(true)
		return res
	}
	res.Body = b
	return res
}

// inlineBody is an answer's body. Read and Close may run at once (a reader of a live
// stream is stopped by closing its body from another goroutine): Close closes the
// connection, which ends a blocked Read, and whichever of them finishes first decides
// what becomes of the connection.
type inlineBody struct {
	t    *Transport
	pc   *inlineConn
	rc   io.ReadCloser
	stop func() bool
	keep bool

	state atomic.Int32 // bodyOpen, bodyEOF, bodyClosed
}

const (
	bodyOpen int32 = iota
	bodyEOF
	bodyClosed
)

var errBodyClosed = errors.New("inlinehttp: read on a closed answer body")

func (b *inlineBody) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyEOF:
		return 0, io.EOF
	case bodyClosed:
		return 0, errBodyClosed
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		b.finish(false)
		if b.state.Load() == bodyClosed {
			err = errBodyClosed
		}
	}
	return n, err
}

// Close drops the connection unless the body was read to its end (net/http would read
// on to the end, which never comes for a live read).
func (b *inlineBody) Close() error {
	b.finish(false)
	return nil
}

// finish ends the body once: at its end (eof) the connection goes back to the pool when
// it can carry another request; otherwise it is closed.
func (b *inlineBody) finish(eof bool) {
	to := bodyClosed
	if eof {
		to = bodyEOF
	}
	if !b.state.CompareAndSwap(bodyOpen, to) {
		return
	}
	// stop is false when the context fired: its deadline may be on the connection.
	if b.stop() && eof && b.keep && b.pc.br.Buffered() == 0 && !b.t.Fallback.DisableKeepAlives {
		b.t.put(b.pc)
		return
	}
	b.pc.conn.Close()
}

// get returns an idle connection for key, or dials one.
func (t *Transport) get(ctx context.Context, key string, req *http.Request) (*inlineConn, bool, error) {
	now := time.Now()
	for {
		t.mu.Lock()
		cs := t.idle[key]
		if len(cs) == 0 {
			t.mu.Unlock()
			break
		}
		pc := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		t.idle[key] = cs[:len(cs)-1]
		t.mu.Unlock()
		if to := t.Fallback.IdleConnTimeout; to > 0 && now.Sub(pc.idleAt) > to || !connAlive(pc.raw) {
			pc.conn.Close()
			continue
		}
		return pc, true, nil
	}
	pc, err := t.dial(ctx, key, req)
	return pc, false, err
}

func (t *Transport) put(pc *inlineConn) {
	pc.idleAt = time.Now()
	max := t.Fallback.MaxIdleConnsPerHost
	if max <= 0 {
		max = http.DefaultMaxIdleConnsPerHost
	}
	t.mu.Lock()
	if t.idle == nil {
		t.idle = map[string][]*inlineConn{}
	}
	if cs := t.idle[pc.key]; len(cs) < max {
		t.idle[pc.key] = append(cs, pc)
		if !t.reaping {
			t.reaping = true
			time.AfterFunc(t.reapInterval(), t.reap)
		}
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	pc.conn.Close()
}

// reapInterval is how often idle connections are swept: net/http closes a connection
// the server closed at once (its reader goroutine sees the end) and an idle one at
// IdleConnTimeout; without a goroutine per connection, a sweep does both, so a client
// that stops sending does not keep sockets the server has closed.
const reapInterval = 15 * time.Second

func (t *Transport) reapInterval() time.Duration {
	every := reapInterval
	if t.reapEvery > 0 {
		every = t.reapEvery
	}
	if to := t.Fallback.IdleConnTimeout; to > 0 && to < every {
		every = to
	}
	return every
}

// reap closes the idle connections past IdleConnTimeout or closed by the server, and
// schedules the next sweep while any remain.
func (t *Transport) reap() {
	now := time.Now()
	to := t.Fallback.IdleConnTimeout
	var gone []*inlineConn
	t.mu.Lock()
	for key, cs := range t.idle {
		kept := cs[:0]
		for _, pc := range cs {
			if to > 0 && now.Sub(pc.idleAt) >= to || !connAlive(pc.raw) {
				gone = append(gone, pc)
				continue
			}
			kept = append(kept, pc)
		}
		clear(cs[len(kept):])
		if len(kept) == 0 {
			delete(t.idle, key)
		} else {
			t.idle[key] = kept
		}
	}
	t.reaping = len(t.idle) > 0
	if t.reaping {
		time.AfterFunc(t.reapInterval(), t.reap)
	}
	t.mu.Unlock()
	for _, pc := range gone {
		pc.conn.Close()
	}
}

func (t *Transport) dial(ctx context.Context, key string, req *http.Request) (*inlineConn, error) {
	addr := hostPort(req.URL.Scheme, req.URL.Host)
	dial := t.Fallback.DialContext
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	raw, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	conn := raw
	if req.URL.Scheme == "https" {
		cfg := &tls.Config{}
		if t.Fallback.TLSClientConfig != nil {
			cfg = t.Fallback.TLSClientConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = req.URL.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(raw, cfg)
		hctx := ctx
		if to := t.Fallback.TLSHandshakeTimeout; to > 0 {
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(ctx, to)
			defer cancel()
		}
		if err := tc.HandshakeContext(hctx); err != nil {
			raw.Close()
			return nil, err
		}
		conn = tc
	}
	pc := &inlineConn{key: key, conn: conn, raw: raw, br: bufio.NewReaderSize(conn, 16<<10), sent: countingWriter{w: conn}}
	pc.bw = bufio.NewWriterSize(&pc.sent, inlineWriteBuffer)
	return pc, nil
}

// hostPort is host with the scheme's default port when it names none.
func hostPort(scheme, host string) string {
	if _, port, err := net.SplitHostPort(host); err == nil && port != "" {
		return host
	}
	h := host
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
	}
	if scheme == "https" {
		return net.JoinHostPort(h, "443")
	}
	return net.JoinHostPort(h, "80")
}
