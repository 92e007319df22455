package inlinehttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// connCounter counts the connections a test server accepts.
func connCounter(ts *httptest.Server) *atomic.Int64 {
	var n atomic.Int64
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
	return &n
}

// stallingServer answers a request for which first is true with the head and the line
// "first\n", flushed, and then, like every other request, holds it until the client goes
// or the test ends.
func stallingServer(t *testing.T, first func(*http.Request) bool) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first(r) {
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); ts.Close() })
	return ts
}

func inlineClient(fallback *http.Transport) (*http.Client, *Transport) {
	t := New(fallback)
	return &http.Client{Transport: t}, t
}

// get sends a GET to u with hc and reads the answer's body to its end (the connection
// goes back to the pool).
func get(t *testing.T, hc *http.Client, u string) (*http.Response, string) {
	t.Helper()
	res, err := hc.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

func TestInlineReusesOneConnection(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/chunked":
			w.Write(b) // no Content-Length: chunked
			w.(http.Flusher).Flush()
			w.Write([]byte("!"))
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			w.Write(b)
		}
	}))
	conns := connCounter(ts)
	ts.Start()
	defer ts.Close()
	hc, _ := inlineClient(nil)
	for i := 0; i < 60; i++ {
		path := []string{"/len", "/chunked", "/empty"}[i%3]
		body := fmt.Sprintf("body %d", i)
		res, err := hc.Post(ts.URL+path, "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		want := body
		switch path {
		case "/chunked":
			want += "!"
		case "/empty":
			want = ""
		}
		if err != nil || string(got) != want || res.Proto != "HTTP/1.1" {
			t.Fatalf("%s: %q %v %s, want %q", path, got, err, res.Proto, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 60 sequential requests, want 1", n)
	}
}

// An answer's body closed before its end takes its connection with it; the next request
// dials again and works.
func TestInlineUnreadBodyDropsConnection(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 1<<20)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(big) }))
	conns := connCounter(ts)
	ts.Start()
	defer ts.Close()
	hc, _ := inlineClient(nil)
	for i := 0; i < 3; i++ {
		res, err := hc.Get(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, 10)
		if _, err := io.ReadFull(res.Body, p); err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if _, err := res.Body.Read(p); err == nil {
			t.Fatal("read after close succeeded")
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (one per abandoned body)", n)
	}
}

// The server closing kept-alive connections (between requests, or by answering with
// Connection: close) costs the client nothing: the next request goes out on a new one.
func TestInlineServerClosedIdleConnection(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		io.WriteString(w, "ok")
	}))
	conns := connCounter(ts)
	ts.Start()
	defer ts.Close()
	hc, _ := inlineClient(nil)
	post := func(path string) {
		t.Helper()
		res, err := hc.Post(ts.URL+path, "text/plain", strings.NewReader("x")) // not replayable
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != "ok" {
			t.Fatalf("%q", b)
		}
	}
	post("/")
	ts.CloseClientConnections()
	time.Sleep(50 * time.Millisecond) // the FIN arrives
	post("/")
	post("/close")
	post("/")
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

// Idle connections are closed past IdleConnTimeout, and once the server closed them,
// without another request.
func TestInlineReapsIdleConnections(t *testing.T) {
	var closed atomic.Int64
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	ts.Start()
	defer ts.Close()
	idle := func(tr *Transport) int {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		n := 0
		for _, cs := range tr.idle {
			n += len(cs)
		}
		return n
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	fb := http.DefaultTransport.(*http.Transport).Clone()
	fb.IdleConnTimeout = 100 * time.Millisecond
	hc, tr := inlineClient(fb)
	get(t, hc, ts.URL)
	if idle(tr) != 1 {
		t.Fatalf("%d idle connections after one request", idle(tr))
	}
	waitFor("the idle connection outlived IdleConnTimeout", func() bool { return closed.Load() == 1 && idle(tr) == 0 })

	fb2 := http.DefaultTransport.(*http.Transport).Clone()
	fb2.IdleConnTimeout = time.Hour
	hc2, tr2 := inlineClient(fb2)
	tr2.reapEvery = 50 * time.Millisecond
	get(t, hc2, ts.URL)
	ts.CloseClientConnections()
	waitFor("a connection the server closed stayed in the pool", func() bool { return idle(tr2) == 0 })
	get(t, hc2, ts.URL) // and the next request dials anew
}

// The request's context interrupts a wait for the answer's head, and a read of its body.
func TestInlineContextCancels(t *testing.T) {
	ts := stallingServer(t, func(r *http.Request) bool { return r.URL.Path == "/live" })
	hc, _ := inlineClient(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/slow", nil)
	t0 := time.Now()
	if _, err := hc.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow head: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx2, http.MethodGet, ts.URL+"/live", nil)
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 6)
	if _, err := io.ReadFull(res.Body, p); err != nil || string(p) != "first\n" {
		t.Fatalf("%q %v", p, err)
	}
	go func() { time.Sleep(50 * time.Millisecond); cancel2() }()
	if _, err := res.Body.Read(p); err == nil {
		t.Fatal("a read past the cancel succeeded")
	}
	res.Body.Close()
}

// A request some of whose bytes left is never sent again by the transport: here the
// server drops the connection without an answer while the body is still being written
// (on a pooled connection, where a request that wrote nothing would be sent again).
func TestInlineNoResendAfterPartialWrite(t *testing.T) {
	var drops atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			drops.Add(1)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	defer ts.Close()
	hc, _ := inlineClient(nil)
	for i := 0; i < 5; i++ {
		get(t, hc, ts.URL) // a pooled connection for the PUT
		req, _ := http.NewRequest(http.MethodPut, ts.URL, bytes.NewReader(make([]byte, 8<<20)))
		if res, err := hc.Do(req); err == nil {
			res.Body.Close()
			t.Fatalf("a dropped PUT answered %d", res.StatusCode)
		}
		if n := drops.Load(); n != int64(i+1) {
			t.Fatalf("the server saw %d PUTs after %d sent", n, i+1)
		}
	}
}

// Informational answers (103 Early Hints) before the final one are skipped.
func TestInlineSkipsInformational(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	defer ts.Close()
	hc, _ := inlineClient(nil)
	for i := 0; i < 2; i++ {
		res, b := get(t, hc, ts.URL)
		if res.StatusCode != http.StatusCreated || b != "made" {
			t.Fatalf("%d %q", res.StatusCode, b)
		}
	}
}

// Closing a live answer's body from another goroutine ends a Read blocked on it.
func TestInlineCloseEndsBlockedRead(t *testing.T) {
	ts := stallingServer(t, func(*http.Request) bool { return true })
	hc, _ := inlineClient(nil)
	res, err := hc.Get(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 6)
	if _, err := io.ReadFull(res.Body, p); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := res.Body.Read(p); done <- err }()
	time.Sleep(50 * time.Millisecond) // the Read blocks
	res.Body.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the blocked read returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the blocked Read")
	}
	if _, err := res.Body.Read(p); err == nil || err == io.EOF {
		t.Fatalf("read after close: %v", err)
	}
}

// A refusal sent before the server read the body (here: Connection: close and no read of
// 8 MiB) reaches the caller as the server's answer, not as a write error.
func TestInlineEarlyRefusal(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		io.WriteString(w, `{"code":"TOO_LARGE"}`)
	}))
	defer ts.Close()
	hc, _ := inlineClient(nil)
	res, err := hc.Post(ts.URL, "application/octet-stream", bytes.NewReader(make([]byte, 8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "TOO_LARGE") {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
}

// Over TLS: the fallback's trust settings apply, HTTP/1.1 is negotiated, a certificate
// from elsewhere is refused.
func TestInlineTLS(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) }))
	ts.EnableHTTP2 = true
	conns := connCounter(ts)
	ts.StartTLS()
	defer ts.Close()
	fb := http.DefaultTransport.(*http.Transport).Clone()
	fb.TLSClientConfig = ts.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	hc, _ := inlineClient(fb)
	for i := 0; i < 3; i++ {
		res, b := get(t, hc, ts.URL)
		if b != "HTTP/1.1" || res.TLS == nil || !res.TLS.HandshakeComplete || res.TLS.NegotiatedProtocol == "h2" {
			t.Fatalf("server saw %q; TLS state %v", b, res.TLS)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d TLS connections, want 1", n)
	}
	other, _ := inlineClient(nil) // system roots: the test certificate is not trusted
	_, err := other.Get(ts.URL)
	var uerr *tls.CertificateVerificationError
	if !errors.As(err, &uerr) {
		t.Fatalf("untrusted certificate: %v", err)
	}
}

// A request the fallback's proxy function sends through a proxy goes to the fallback.
func TestInlineProxyGoesToFallback(t *testing.T) {
	var proxied atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		io.WriteString(w, "via proxy "+r.URL.String())
	}))
	defer proxy.Close()
	pu, _ := url.Parse(proxy.URL)
	fb := http.DefaultTransport.(*http.Transport).Clone()
	fb.Proxy = http.ProxyURL(pu)
	hc, _ := inlineClient(fb)
	_, b := get(t, hc, "http://stream.invalid/b/s")
	if proxied.Load() != 1 || b != "via proxy http://stream.invalid/b/s" {
		t.Fatalf("%d %q", proxied.Load(), b)
	}
}

func TestHostPort(t *testing.T) {
	for _, c := range []struct{ scheme, host, want string }{
		{"http", "h", "h:80"}, {"https", "h", "h:443"}, {"http", "h:8", "h:8"},
		{"http", "[::1]", "[::1]:80"}, {"https", "[::1]:9", "[::1]:9"},
	} {
		if got := hostPort(c.scheme, c.host); got != c.want {
			t.Errorf("hostPort(%s, %s) = %s, want %s", c.scheme, c.host, got, c.want)
		}
	}
}
