package server

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

// declare sends a request head whose Content-Length declares an oversized body, sends no
// body, and returns the answer the server gives without waiting for it.
func declare(t *testing.T, base, method, path string, contentLength string, hdr ...string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var b strings.Builder
	b.WriteString(method + " " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + contentLength + "\r\n")
	for i := 0; i+1 < len(hdr); i += 2 {
		b.WriteString(hdr[i] + ": " + hdr[i+1] + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res
}

// The size of a write is its first check: an oversized append that also carries only some
// of the producer headers answers 413 (too large), not 400 (malformed headers); the same
// holds on a stream that does not exist (413 before 404) (protocol 8.10(a)).
func TestOversizedWriteAnswers413BeforeHeaderFaults(t *testing.T) {
	ts := newTestServer(t)
	expect(t, do(t, "PUT", ts.URL+"/bkt1/s", "", "Content-Type", "text/plain"), 201, "")
	over := "33554433"
	for _, c := range []struct {
		method, path string
		hdr          []string
	}{
		{"POST", "/bkt1/s", []string{"Content-Type", "text/plain", "Producer-Id", "p1"}},       // partial producer headers
		{"POST", "/bkt1/s", []string{"Content-Type", "text/plain", "Stream-Incarnation", "x"}}, // malformed precondition
		{"POST", "/bkt1/missing", []string{"Content-Type", "text/plain"}},                      // no such stream
		{"PUT", "/bkt1/n", []string{"Content-Type", "text/plain", "Producer-Id", "p1"}},        // producer headers on create
		{"POST", "/Bad/s", []string{"Content-Type", "text/plain"}},                             // malformed path
	} {
		res := declare(t, ts.URL, c.method, c.path, over, c.hdr...)
		if res.StatusCode != http.StatusRequestEntityTooLarge || res.Header.Get(streamcore.HdrMaxRequestBytes) != "33554432" ||
			res.Header.Get(streamcore.HdrNotApplied) != "RequestBodyTooLarge" {
			t.Fatalf("%s %s %v: %d %v", c.method, c.path, c.hdr, res.StatusCode, res.Header)
		}
	}
	// At the limit, the header faults answer as before.
	res := declare(t, ts.URL, "POST", "/bkt1/s", "0", "Content-Type", "text/plain", "Producer-Id", "p1")
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("partial producer headers within the limit: %d", res.StatusCode)
	}
}

// Bucket, retention and delete requests obey the request body limit too: a declared body
// over 32 MiB answers 413 with the limit header, and nothing changes (protocol 27.1).
func TestBucketRetentionDeleteRefuseOversizedBodies(t *testing.T) {
	ts := newTestServer(t)
	expect(t, do(t, "PUT", ts.URL+"/bkt1/s", "", "Content-Type", "text/plain"), 201, "")
	for _, c := range []struct{ method, path string }{
		{"PUT", "/bkt2"},
		{"PUT", "/bkt1/s/retention/00000000000000000000"},
		{"DELETE", "/bkt1/s"},
		{"POST", "/bkt1/s/snapshot/00000000000000000000/parts"},
	} {
		res := declare(t, ts.URL, c.method, c.path, "33554433")
		if res.StatusCode != http.StatusRequestEntityTooLarge || res.Header.Get(streamcore.HdrMaxRequestBytes) != "33554432" {
			t.Fatalf("%s %s: %d %v", c.method, c.path, res.StatusCode, res.Header)
		}
	}
	expect(t, do(t, "HEAD", ts.URL+"/bkt1/s", ""), 200, "") // the refused delete deleted nothing
}
