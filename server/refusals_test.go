package server

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

const libraryHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func TestJSONRefusal(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		status   int
		code     string // "" : not rewritten
	}{
		{"bad request", "HTTP/1.1 400 Bad Request" + libraryHeaders + "400 Bad Request", 400, streamcore.CodeInvalidRequest},
		{"headers too large", "HTTP/1.1 431 Request Header Fields Too Large" + libraryHeaders + "431 Request Header Fields Too Large", 431, streamcore.CodeInvalidRequest},
		{"invalid header value", "HTTP/1.1 400 Bad Request: invalid header value" + libraryHeaders + "400 Bad Request: invalid header value", 400, streamcore.CodeInvalidHeader},
		{"invalid header name", "HTTP/1.1 400 Bad Request: invalid header name" + libraryHeaders + "400 Bad Request: invalid header name", 400, streamcore.CodeInvalidHeader},
		{"missing host", "HTTP/1.1 400 Bad Request: missing required Host header" + libraryHeaders + "400 Bad Request: missing required Host header", 400, streamcore.CodeInvalidHeader},
		{"version", "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + libraryHeaders + "505 HTTP Version Not Supported: unsupported protocol version", 505, streamcore.CodeInternal},
		{"transfer encoding", "HTTP/1.1 501 Not Implemented" + libraryHeaders + "Unsupported transfer encoding", 501, streamcore.CodeInternal},
		{"expect", "HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nContent-Length: 0\r\nDate: Sat, 05 Dec 2026 05:00:00 GMT\r\n\r\n", 417, streamcore.CodeInvalidHeader},
		{"http to https", "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n", 400, streamcore.CodeInvalidRequest},
		{"success", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0, ""},
		{"redirect", "HTTP/1.1 307 Temporary Redirect\r\nContent-Length: 0\r\n\r\n", 0, ""},
		{"headers cut", "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain", 0, ""},
		{"not http", "\x17\x03\x03\x00\x10HTTP/1.1 400 Bad Request\r\n\r\n", 0, ""},
		{"status not a number", "HTTP/1.1 4x0 Bad Request\r\n\r\n", 0, ""},
		{"status too long", "HTTP/1.1 4000 Bad Request\r\n\r\n", 0, ""},
		{"too long", "HTTP/1.1 400 Bad Request\r\n\r\n" + strings.Repeat("x", maxRefusalBytes), 0, ""},
		{"empty", "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ans, ok := jsonRefusal([]byte(tc.in))
			if tc.code == "" {
				if ok {
					t.Fatalf("rewrote %q into %q", tc.in, ans)
				}
				return
			}
			if !ok {
				t.Fatalf("did not rewrite %q", tc.in)
			}
			res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(ans)), nil)
			if err != nil {
				t.Fatalf("the rewrite is no HTTP answer: %v\n%q", err, ans)
			}
			body, _ := io.ReadAll(res.Body)
			d, isErr := streamcore.ParseErrorBody(body)
			if res.StatusCode != tc.status || !isErr || d.Code != tc.code || d.Message == "" ||
				res.Header.Get("Content-Type") != "application/json" || !res.Close {
				t.Fatalf("got %d %v %s (%+v)", res.StatusCode, res.Header, body, d)
			}
		})
	}
}

func FuzzJSONRefusal(f *testing.F) {
	f.Add([]byte("HTTP/1.1 400 Bad Request" + libraryHeaders + "400 Bad Request"))
	f.Add([]byte("HTTP/1.1 431 Request Header Fields Too Large" + libraryHeaders + "x"))
	f.Add([]byte("HTTP/1.1 200 OK\r\n\r\n"))
	f.Fuzz(func(t *testing.T, p []byte) {
		ans, ok := jsonRefusal(p)
		if !ok {
			return
		}
		res, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(ans)), nil)
		if err != nil {
			t.Fatalf("rewrite of %q is no HTTP answer: %v", p, err)
		}
		body, _ := io.ReadAll(res.Body)
		if _, isErr := streamcore.ParseErrorBody(body); !isErr || res.StatusCode < 400 {
			t.Fatalf("rewrite of %q: %d %s", p, res.StatusCode, body)
		}
	})
}
