package server

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testcerts"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/tlsfiles"
)

// serveTLSRefusals serves h over TLS the way the node does (TLSListener under
// JSONRefusals, hs.Serve) and returns the address and a client config trusting it.
func serveTLSRefusals(t *testing.T, h http.Handler) (string, *tls.Config, *http.Server) {
	t.Helper()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "test-ca")
	cf, kf := ca.Issue(t, "node").Write(t, dir, "node")
	cert, err := tlsfiles.LoadCertificate(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := tlsfiles.LoadCAPool(ca.WriteCA(t, dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	hs.ConnState = func(c net.Conn, st http.ConnState) {
		// A hook set before JSONRefusals still runs, with a conn that carries TLS state.
		if _, ok := c.(interface{ ConnectionState() tls.ConnectionState }); !ok {
			t.Errorf("ConnState %v on a connection without TLS state (%T)", st, c)
		}
	}
	ln := JSONRefusals(hs, TLSListener(LimitConnections(raw, 64), tlsfiles.ServerConfig(cert), 10*time.Second))
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return raw.Addr().String(), tlsfiles.ClientConfig(pool, nil), hs
}

func TestTLSListenerRefusalsAndServing(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/who", func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || !r.TLS.HandshakeComplete {
			http.Error(w, "no TLS state", 500)
			return
		}
		io.WriteString(w, r.Proto)
	})
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		// An answer that reads like the library's refusal goes out unchanged after the
		// hijack; then echo one line.
		c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		line, _ := brw.ReadString('\n')
		c.Write([]byte(line))
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		<-r.Context().Done() // held open until the client leaves
	})
	addr, ccfg, _ := serveTLSRefusals(t, mux)

	dialH1 := func(t *testing.T) *tls.Conn {
		t.Helper()
		cfg := ccfg.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c
	}
	readJSON := func(t *testing.T, br *bufio.Reader, status int, code string) {
		t.Helper()
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		d, ok := streamcore.ParseErrorBody(b)
		if res.StatusCode != status || !ok || d.Code != code || res.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("got %d %q %s, want %d %s", res.StatusCode, res.Header.Get("Content-Type"), b, status, code)
		}
	}

	for _, tc := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"NUL in the path", "GET /x\x00y HTTP/1.1\r\nHost: x\r\n\r\n", 400, streamcore.CodeInvalidRequest},
		{"control byte in a header", "GET /who HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n", 400, streamcore.CodeInvalidRequest},
		{"invalid header name", "GET /who HTTP/1.1\r\nHost: x\r\nX Bad: a\r\n\r\n", 400, streamcore.CodeInvalidHeader},
		{"oversized headers", "GET /who HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 80<<10) + "\r\n\r\n", 431, streamcore.CodeInvalidRequest},
	} {
		t.Run("tls/"+tc.name, func(t *testing.T) {
			c := dialH1(t)
			c.Write([]byte(tc.req))
			readJSON(t, bufio.NewReader(c), tc.status, tc.code)
		})
	}

	t.Run("tls/after a served request", func(t *testing.T) {
		c := dialH1(t)
		c.Write([]byte("GET /who HTTP/1.1\r\nHost: x\r\n\r\nGET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n"))
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || string(b) != "HTTP/1.1" {
			t.Fatalf("first request: %d %s", res.StatusCode, b)
		}
		readJSON(t, br, 400, streamcore.CodeInvalidRequest)
	})

	t.Run("plain HTTP to the TLS port", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write([]byte("GET /who HTTP/1.1\r\nHost: x\r\n\r\n"))
		readJSON(t, bufio.NewReader(c), 400, streamcore.CodeInvalidRequest)
	})

	for _, h2 := range []bool{true, false} {
		name := "https/http1.1"
		if h2 {
			name = "https/h2"
		}
		t.Run(name, func(t *testing.T) {
			tr := &http.Transport{TLSClientConfig: ccfg.Clone(), ForceAttemptHTTP2: h2}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			res, err := cl.Get("https://" + addr + "/who")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			want := "HTTP/1.1"
			if h2 {
				want = "HTTP/2.0" // ALPN offers h2 as http.Server.ServeTLS does
			}
			if res.StatusCode != 200 || string(b) != want || res.Proto != want {
				t.Fatalf("got %d %s over %s, want %s", res.StatusCode, b, res.Proto, want)
			}
		})
	}

	t.Run("hijack over TLS", func(t *testing.T) {
		c := dialH1(t)
		c.Write([]byte("GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n"))
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != 101 {
			t.Fatalf("upgrade: %v %v", res, err)
		}
		got := make([]byte, len("HTTP/1.1 400 Bad Request\r\n\r\n"))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != "HTTP/1.1 400 Bad Request\r\n\r\n" {
			t.Fatalf("hijacked bytes rewritten or lost: %q %v", got, err)
		}
		c.Write([]byte("ping\n"))
		if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo over the hijacked TLS connection: %q %v", line, err)
		}
	})

	t.Run("SSE over TLS is flushed", func(t *testing.T) {
		tr := &http.Transport{TLSClientConfig: ccfg.Clone()} // HTTP/1.1: through the wrapper
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/sse")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		if err != nil || line != "data: one\n" || res.ProtoMajor != 1 {
			t.Fatalf("first event of a held-open stream: %q %v over %s", line, err, res.Proto)
		}
	})

	t.Run("a stalled handshake blocks no one", func(t *testing.T) {
		stalled, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer stalled.Close()
		c := dialH1(t)
		c.Write([]byte("GET /who HTTP/1.1\r\nHost: x\r\n\r\n"))
		if res, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || res.StatusCode != 200 {
			t.Fatalf("a client behind a stalled handshake: %v %v", res, err)
		}
	})
}

// TestTLSListenerBoundsHandshakes: a connection that never finishes its handshake is
// closed after the timeout, and Close closes those still in their handshake.
func TestTLSListenerBoundsHandshakes(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	cf, kf := ca.Issue(t, "node").Write(t, dir, "node")
	cert, err := tlsfiles.LoadCertificate(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	ln := TLSListener(raw, tlsfiles.ServerConfig(cert), 200*time.Millisecond)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed := func(c net.Conn, what string) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("%s: got bytes", what)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: still open after 30 s", what)
		}
	}
	c1, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	closed(c1, "a silent handshake past its timeout")

	ln2 := TLSListener(mustListen(t), tlsfiles.ServerConfig(cert), 0) // no handshake bound
	c2, err := net.Dial("tcp", ln2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	// Wait until the listener holds it in its handshake, then close the listener.
	l2 := ln2.(*tlsListener)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l2.mu.Lock()
		n := len(l2.pending)
		l2.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection never reached its handshake")
		}
	}
	ln2.Close()
	closed(c2, "a handshake in progress at Close")
	if _, err := ln2.Accept(); err == nil {
		t.Fatal("Accept after Close returned a connection")
	}
	ln.Close()
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
