package server

import (
	"net/http"
	"testing"
)

// An immutable chunk's ETag covers the content type and a hash of the body besides the
// token, the range and how the range ends (protocol 26.11): the same range under another
// type or with other bytes has another ETag, and the served ETag is exactly that of the
// bytes and type served; If-None-Match with it answers 304.
func TestChunkETagCoversTypeAndBody(t *testing.T) {
	base := chunkETag(1<<52, 0, 4, "o", "text/plain", [][]byte{[]byte("ab"), []byte("cd")})
	if base != chunkETag(1<<52, 0, 4, "o", "text/plain", [][]byte{[]byte("abcd")}) {
		t.Fatal("the ETag depends on how the body is split")
	}
	for _, other := range []string{
		chunkETag(1<<52, 0, 4, "o", "application/octet-stream", [][]byte{[]byte("abcd")}),
		chunkETag(1<<52, 0, 4, "o", "text/plain", [][]byte{[]byte("abce")}),
		chunkETag(1<<52, 0, 4, "c", "text/plain", [][]byte{[]byte("abcd")}),
	} {
		if other == base {
			t.Fatalf("%s: a different chunk got the same ETag", other)
		}
	}

	ts := newTestServer(t)
	s := ts.URL + "/bkt1/imm"
	c := do(t, "PUT", s, "abcdef", "Content-Type", "text/plain")
	tok := c.h.Get("Stream-Incarnation")
	a := do(t, "GET", s+"/incarnation/"+tok+"/chunk/00000000000000000002", "")
	inc, _ := parseSafeInt(tok)
	if want := chunkETag(inc, 2, 6, "o", a.h.Get("Content-Type"), [][]byte{[]byte(a.body)}); a.h.Get("ETag") != want {
		t.Fatalf("ETag %s, want %s", a.h.Get("ETag"), want)
	}
	if n := do(t, "GET", s+"/incarnation/"+tok+"/chunk/00000000000000000002", "", "If-None-Match", "W/"+a.h.Get("ETag")); n.status != http.StatusNotModified {
		t.Fatalf("If-None-Match: %d", n.status)
	}
}
