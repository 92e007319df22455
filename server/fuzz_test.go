package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// FuzzRequest throws arbitrary requests at the handler: it must never panic (a recovered
// panic shows as a 500, which the memory engine never answers otherwise) and every error
// answer must carry the JSON error body.
func FuzzRequest(f *testing.F) {
	f.Add("PUT", "/bkt1/s", "application/json", "", "", "[1,2]")
	f.Add("POST", "/bkt1/s", "text/plain", "p", "0", "abc")
	f.Add("GET", "/bkt1/s?offset=-1&max_bytes=2", "", "", "", "")
	f.Add("GET", "/bkt1/s?offset=now&live=long-poll&timeout_ms=1", "", "", "", "")
	f.Add("PUT", "/bkt1/s/snapshot/00000000000000000001", "x/y", "", "", "zz")
	f.Add("PUT", "/bkt1/s/retention/00000000000000000001", "", "", "", "")
	f.Add("GET", "/bkt1/s/bootstrap", "", "", "", "")
	f.Add("GET", "/bkt1/s/incarnation/4503599627370497/chunk/00000000000000000000", "", "", "", "")
	f.Add("PUT", "/v1/stream/a/b", "", "", "", "")
	f.Add("DELETE", "/bkt1/%zz", "", "", "", "")
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "fuzz"})
	// Seed state the fuzzer can hit.
	for _, r := range []*http.Request{
		httptest.NewRequest("PUT", "/bkt1/s", strings.NewReader(`{"a":1}`)),
		httptest.NewRequest("PUT", "/bkt1/t", strings.NewReader("abc")),
	} {
		r.Header.Set("Content-Type", "application/json")
		srv.ServeHTTP(httptest.NewRecorder(), r)
	}
	f.Fuzz(func(t *testing.T, method, target, ct, pid, seq, body string) {
		if len(target) == 0 || target[0] != '/' || strings.ContainsAny(target, " \r\n\t#") {
			return
		}
		switch method {
		case "GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS":
		default:
			return
		}
		var r *http.Request
		func() {
			defer func() { recover() }() // httptest.NewRequest panics on targets it cannot parse
			r = httptest.NewRequest(method, target, bytes.NewReader([]byte(body)))
		}()
		if r == nil {
			return
		}
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		if pid != "" {
			r.Header.Set("Producer-Id", pid)
			r.Header.Set("Producer-Epoch", "0")
			r.Header.Set("Producer-Seq", seq)
		}
		// Live reads end when the request context does.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		r = r.WithContext(ctx)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if w.Code >= 500 && w.Code != 501 {
			t.Fatalf("%s %s answered %d: %s", method, target, w.Code, w.Body.String())
		}
		if w.Code >= 400 && method != "HEAD" {
			if _, ok := streamcore.ParseErrorBody(w.Body.Bytes()); !ok {
				t.Fatalf("%s %s answered %d without a JSON error body: %q", method, target, w.Code, w.Body.String())
			}
		}
	})
}
