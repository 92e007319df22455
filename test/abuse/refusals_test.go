package abuse

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
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
