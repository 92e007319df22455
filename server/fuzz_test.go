package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// trimTextOracle is trimText on one flat slice, the way it was written before windows were
// cut in their parts: it gives the window's new length.
func trimTextOracle(flat []byte, json bool) int {
	n := len(flat)
	if json {
		if i := bytes.LastIndexByte(flat, '\n'); i >= 0 {
			n = i + 1
		}
	}
	if n == len(flat) {
		for k := 1; k <= 3 && k <= n; k++ {
			c := flat[n-k]
			if c < 0x80 {
				break
			}
			if c >= 0xC0 {
				if !utf8.FullRune(flat[n-k:]) {
					n -= k
				}
				break
			}
		}
	}
	if n == 0 {
		return len(flat)
	}
	return n
}

// FuzzTrimTextParts: cutting a text window held in parts (split anywhere: inside a code
// point, around a newline, with empty parts) keeps exactly the bytes the one-slice cut
// keeps, and never copies them (the parts left are prefixes of the parts given).
func FuzzTrimTextParts(f *testing.F) {
	f.Add([]byte("ab\ncd\xe2\x82"), []byte{3, 0, 2}, true)
	f.Add([]byte("h\xc3\xa9llo w\xf0\x9f\x98\x80"), []byte{1, 1, 5, 2}, false)
	f.Add([]byte("\xf0\x9f\x98"), []byte{1, 1}, false)
	f.Add([]byte("no newline at all"), []byte{4}, true)
	f.Fuzz(func(t *testing.T, flat []byte, cuts []byte, json bool) {
		if len(flat) == 0 {
			return
		}
		var parts [][]byte
		rest := flat
		for _, c := range cuts {
			n := min(int(c), len(rest))
			parts = append(parts, rest[:n])
			rest = rest[n:]
		}
		parts = append(parts, rest)
		given := slices.Clone(parts)
		v := &view{start: 100, end: 100 + uint64(len(flat)), tail: 200 + uint64(len(flat)), data: parts}
		trimText(v, json)
		want := trimTextOracle(flat, json)
		got := flatten(v.data)
		if int(v.end-v.start) != want || !bytes.Equal(got, flat[:want]) {
			t.Fatalf("%q in %q (json=%v): kept %q (end %d), want %q", flat, given, json, got, v.end-v.start, flat[:want])
		}
		for i, p := range v.data {
			if len(p) > 0 && &p[0] != &given[i][0] {
				t.Fatalf("part %d was copied", i)
			}
		}
	})
}
