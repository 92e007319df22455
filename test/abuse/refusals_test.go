package abuse

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
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

// TestLibraryRefusalsAreJSON sends what Go's HTTP parser refuses before any handler runs,
// over raw TCP, and checks that each refusal still carries the JSON error body.
func TestLibraryRefusalsAreJSON(t *testing.T) {
	n := start(t, t.TempDir(), "")
	canned := "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
	u := n.url + "/abuse/canned"
	do(t, "PUT", u, nil, "Content-Type", "text/plain")
	do(t, "POST", u, []byte(canned), "Content-Type", "text/plain")
	for _, tc := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"control byte in a header", "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n", 400, streamcore.CodeInvalidRequest},
		{"invalid header name", "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX Bad: a\r\n\r\n", 400, streamcore.CodeInvalidHeader},
		{"NUL in the path", "GET /abuse/\x00x HTTP/1.1\r\nHost: x\r\n\r\n", 400, streamcore.CodeInvalidRequest},
		{"broken escape in the path", "GET /abuse/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, streamcore.CodeInvalidRequest},
		{"malformed request line", "GARBAGE\r\nHost: x\r\n\r\n", 400, streamcore.CodeInvalidRequest},
		{"no Host", "GET /abuse/x HTTP/1.1\r\n\r\n", 400, streamcore.CodeInvalidHeader},
		{"oversized headers", "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 80<<10) + "\r\n\r\n", 431, streamcore.CodeInvalidRequest},
		{"unknown transfer coding", "POST /abuse/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, streamcore.CodeInternal},
		{"unsupported Expect", "POST /abuse/x HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417, streamcore.CodeInvalidHeader},
		// A keep-alive connection whose first request is fine: the refusal after it too.
		{"after a served request", "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\nGET /abuse/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, streamcore.CodeInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, n.addr, tc.req)
			defer c.Close()
			br := bufio.NewReader(c)
			res, b := readAnswerFrom(t, c, br)
			if strings.HasPrefix(tc.name, "after") {
				if res.StatusCode != 200 {
					t.Fatalf("first request: %d %s", res.StatusCode, b)
				}
				res, b = readAnswerFrom(t, c, br)
			}
			d, ok := streamcore.ParseErrorBody(b)
			if res.StatusCode != tc.status || !ok || d.Code != tc.code || d.Message == "" ||
				res.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), b)
			}
		})
	}
	// A handler's answer is never rewritten, even when its bytes are the library's refusal.
	c := rawConn(t, n.addr, "GET /abuse/canned?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\nGET /abuse/canned?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n")
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		if res, b := readAnswerFrom(t, c, br); res.StatusCode != http.StatusOK || !bytes.Equal(b, []byte(canned)) {
			t.Fatalf("read %d of a stream holding the library's refusal: %d %q", i, res.StatusCode, b)
		}
	}
	// The admin listener refuses the same way.
	ac := rawConn(t, n.adminAddr, "GET /__ursula/\x00x HTTP/1.1\r\nHost: x\r\n\r\n")
	defer ac.Close()
	if res, b := readAnswer(t, ac); res.StatusCode != 400 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("admin listener: %d %s", res.StatusCode, b)
	}
	n.alive(t)
	n.served(t, "refusals")
}

// readAnswerFrom reads the next HTTP answer off c through br, so pipelined answers are
// read one after the other (bounded by a generous deadline).
func readAnswerFrom(t *testing.T, c net.Conn, br *bufio.Reader) (*http.Response, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, b
}

// TestLibraryRefusalsOverTLSAndAdmin: with TLS on, the parser's refusals inside the TLS
// stream get the JSON error body too, on the client and the admin listener, and a plain
// HTTP client on the TLS port gets a JSON 400; a normal https client is still served.
func TestLibraryRefusalsOverTLSAndAdmin(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "abuse-ca")
	cf, kf := ca.Issue(t, "node").Write(t, dir, "node")
	pool, err := tlsfiles.LoadCAPool(ca.WriteCA(t, dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	ccfg := tlsfiles.ClientConfig(pool, nil)
	cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: ccfg.Clone(), ForceAttemptHTTP2: true}}
	n := startWith(t, t.TempDir(), fmt.Sprintf("[server]\ntls_cert_file = %q\ntls_key_file = %q\n", cf, kf), "https", cl)

	for _, addr := range []string{n.addr, n.adminAddr} {
		for _, tc := range []struct {
			name, req string
			code      string
		}{
			{"NUL in the path", "GET /abuse/\x00x HTTP/1.1\r\nHost: x\r\n\r\n", streamcore.CodeInvalidRequest},
			{"invalid header name", "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX Bad: a\r\n\r\n", streamcore.CodeInvalidHeader},
		} {
			cfg := ccfg.Clone()
			cfg.NextProtos = []string{"http/1.1"}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 20 * time.Second}, "tcp", addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(30 * time.Second))
			c.Write([]byte(tc.req))
			res, b := readAnswer(t, c)
			c.Close()
			if d, ok := streamcore.ParseErrorBody(b); res.StatusCode != 400 || !ok || d.Code != tc.code {
				t.Fatalf("%s over TLS to %s: %d %s", tc.name, addr, res.StatusCode, b)
			}
		}
		c := rawConn(t, addr, "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n")
		res, b := readAnswer(t, c)
		c.Close()
		if d, ok := streamcore.ParseErrorBody(b); res.StatusCode != 400 || !ok || d.Code != streamcore.CodeInvalidRequest {
			t.Fatalf("plain HTTP to the TLS port %s: %d %s", addr, res.StatusCode, b)
		}
	}
	// A normal https client (HTTP/2, as before): create, append, read.
	u := n.url + "/abuse/tls"
	for _, step := range []struct {
		method, body string
		want         int
	}{{"PUT", "", 201}, {"POST", "over tls", 204}, {"GET", "", 200}} {
		req, _ := http.NewRequest(step.method, u, strings.NewReader(step.body))
		if step.method == "GET" {
			req.URL.RawQuery = "offset=-1"
		} else {
			req.Header.Set("Content-Type", "text/plain")
		}
		res, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode/100 != step.want/100 || res.ProtoMajor != 2 || (step.method == "GET" && string(b) != "over tls") {
			t.Fatalf("%s %s: %d over %s %s", step.method, u, res.StatusCode, res.Proto, b)
		}
		if step.method == "PUT" && !strings.HasPrefix(res.Header.Get("Location"), "https://") {
			t.Fatalf("Location %q: the request lost its TLS state", res.Header.Get("Location"))
		}
	}
	n.alive(t)
}
