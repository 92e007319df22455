package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// These tests drive the real server over real HTTP on loopback.

func newTestServer(t *testing.T) *httptest.Server {
	t.Helper()
	eng := engine.NewMemory(0)
	ts := httptest.NewServer(New(eng, Config{ClusterID: "test-cluster"}))
	t.Cleanup(func() { ts.Close(); eng.Close() })
	return ts
}

type answer struct {
	status int
	h      http.Header
	body   string
}

func do(t *testing.T, method, url string, body string, hdr ...string) answer {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	res, rb := coldDo(t, method, url, b, hdr...)
	return answer{res.StatusCode, res.Header, string(rb)}
}

func expect(t *testing.T, a answer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	if code != "" {
		d, ok := streamcore.ParseErrorBody([]byte(a.body))
		if !ok || d.Code != code {
			t.Fatalf("error body %q, want code %s", a.body, code)
		}
		if a.h.Get("Content-Type") != "application/json" {
			t.Fatalf("error Content-Type %q", a.h.Get("Content-Type"))
		}
	}
}

func TestRoutesAndIdentifiers(t *testing.T) {
	ts := newTestServer(t)
	u := ts.URL
	expect(t, do(t, "PUT", u+"/good-bucket", ""), 201, "")
	expect(t, do(t, "PUT", u+"/Bad", ""), 400, streamcore.CodeInvalidBucketID)                 // 2.1
	expect(t, do(t, "PUT", u+"/__sys", ""), 400, streamcore.CodeInvalidBucketID)               // 2.2
	expect(t, do(t, "GET", u+"/good-bucket", ""), 405, streamcore.CodeMethodNotAllowed)        // 1.13
	expect(t, do(t, "PUT", u+"/good-bucket/a%2Fb", ""), 400, streamcore.CodeInvalidStreamID)   // 1.15
	expect(t, do(t, "PUT", u+"/good-bucket/streams", ""), 400, streamcore.CodeInvalidStreamID) // 2.5
	expect(t, do(t, "PUT", u+"/good-bucket/a..b", ""), 400, streamcore.CodeInvalidStreamID)    // 2.3
	expect(t, do(t, "GET", u+"/good-bucket/s/attrs", ""), 404, streamcore.CodeNotFound)        // 1.12
	expect(t, do(t, "GET", u+"/good-bucket/s/snapshot", ""), 405, streamcore.CodeUnsupported)  // 1.11
	expect(t, do(t, "GET", u+"/nobucket/s", ""), 404, streamcore.CodeBucketNotFound)           // 2.8
	a := do(t, "PUT", u+"/good-bucket/snapshot", "")                                           // 1.14
	expect(t, a, 201, "")
	if a.h.Get("Ursula-Protocol") != "2" || a.h.Get("Ursula-Cluster-Id") != "test-cluster" || a.h.Get("Cache-Control") != "no-store" {
		t.Fatalf("server headers missing: %v", a.h)
	}
	expect(t, do(t, "GET", u+"/good-bucket/missing", ""), 404, streamcore.CodeStreamNotFound)
	h := do(t, "HEAD", u+"/good-bucket/missing", "")
	if h.status != 404 || h.body != "" || h.h.Get("Content-Type") != "application/json" {
		t.Fatalf("HEAD 404: %+v", h)
	}
}

func TestAppendReadJSON(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/events"
	expect(t, do(t, "PUT", s, "[]", "Content-Type", "application/json"), 201, "")
	expect(t, do(t, "POST", s, "[]", "Content-Type", "application/json"), 400, streamcore.CodeEmptyAppend)
	expect(t, do(t, "POST", s, "{bad", "Content-Type", "application/json"), 400, "")
	a := do(t, "POST", s, `[ {"b": 1, "a" : [1, 2]}, 1.50e3 ]`, "Content-Type", "application/json")
	expect(t, a, 204, "")
	r := do(t, "GET", s+"?offset=-1", "")
	expect(t, r, 200, "")
	if r.body != "{\"b\":1,\"a\":[1,2]}\n1.50e3\n" || r.h.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("stored JSON %q (%s)", r.body, r.h.Get("Content-Type"))
	}
	if r.h.Get("Stream-Up-To-Date") != "true" || r.h.Get("ETag") == "" {
		t.Fatalf("read headers %v", r.h)
	}
	// 19.3: If-None-Match answers 304.
	expect(t, do(t, "GET", s+"?offset=-1", "", "If-None-Match", "W/"+r.h.Get("ETag")), 304, "")
	// max_bytes shortens and drops Up-To-Date (15.3).
	p := do(t, "GET", s+"?offset=-1&max_bytes=3", "")
	if p.body != "{\"b" || p.h.Get("Stream-Up-To-Date") != "" || p.h.Get("Stream-Next-Offset") != streamcore.FormatOffset(3) {
		t.Fatalf("partial read %q %v", p.body, p.h)
	}
	expect(t, do(t, "GET", s+"?offset=12", ""), 400, streamcore.CodeInvalidOffset)
	expect(t, do(t, "GET", s+"?offset=99999999999999999999", ""), 400, streamcore.CodeInvalidOffset)
	expect(t, do(t, "GET", s+"?offset=00000000000000009999", ""), 416, streamcore.CodeOffsetOutOfRange)
	expect(t, do(t, "GET", s+"?offset=-1&live=forever", ""), 400, streamcore.CodeInvalidQuery)
	expect(t, do(t, "GET", s+"?record=1", ""), 400, streamcore.CodeInvalidQuery)
}

func TestProducerOverHTTP(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/p"
	expect(t, do(t, "PUT", s, "", "Content-Type", "text/plain"), 201, "")
	w := func(body string, epoch, seq string) answer {
		return do(t, "POST", s, body, "Content-Type", "text/plain", "Producer-Id", "w1", "Producer-Epoch", epoch, "Producer-Seq", seq)
	}
	expect(t, w("a", "0", "0"), 200, "")
	expect(t, w("b", "0", "1"), 200, "")
	d := w("b", "0", "1")
	expect(t, d, 204, "")
	if d.h.Get("Stream-Offset") != streamcore.FormatOffset(1) {
		t.Fatalf("duplicate receipt %v", d.h)
	}
	expect(t, w("c", "0", "05"), 400, streamcore.CodeInvalidProducer)
	expect(t, do(t, "POST", s, "x", "Content-Type", "text/plain", "Producer-Id", "w1"), 400, streamcore.CodeInvalidProducer)
	expect(t, w("c", "1", "0"), 200, "")
	f := w("d", "0", "2")
	expect(t, f, 403, streamcore.CodeEpochClosed)
	if f.h.Get("Producer-Epoch") != "1" {
		t.Fatalf("fence headers %v", f.h)
	}
	// Producer-Digest: BLAKE3 of the body, checked for writes that would apply.
	expect(t, do(t, "POST", s, "e", "Content-Type", "text/plain", "Producer-Id", "w1", "Producer-Epoch", "1", "Producer-Seq", "1",
		"Producer-Digest", strings.Repeat("0", 64)), 400, streamcore.CodeDigestMismatch)
	expect(t, do(t, "POST", s, "e", "Content-Type", "text/plain", "Producer-Digest", "xyz"), 400, streamcore.CodeInvalidHeader)
	r := do(t, "GET", s+"?offset=-1", "")
	if r.body != "abc" {
		t.Fatalf("body %q", r.body)
	}
}

func TestSnapshotRetentionBootstrap(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/db"
	expect(t, do(t, "PUT", s, "0123456789", "Content-Type", "application/octet-stream"), 201, "")
	expect(t, do(t, "PUT", s+"/retention/00000000000000000004", ""), 400, streamcore.CodeInvalidRetention)
	pub := do(t, "PUT", s+"/snapshot/00000000000000000004", "SNAP", "Content-Type", "application/x-test")
	expect(t, pub, 204, "")
	digest := pub.h.Get("Stream-Snapshot-Digest")
	if len(digest) != 64 || digest != SnapshotDigest("application/x-test", []byte("SNAP")) {
		t.Fatalf("digest %q", digest)
	}
	expect(t, do(t, "PUT", s+"/snapshot/00000000000000000004", "OTHER"), 409, streamcore.CodeSnapshotConflict)
	rd := do(t, "GET", s+"/snapshot/00000000000000000004", "", "Range", "bytes=1-2")
	if rd.status != 206 || rd.body != "NA" || rd.h.Get("Content-Range") != "bytes 1-2/4" {
		t.Fatalf("range read %+v", rd)
	}
	expect(t, do(t, "GET", s+"/snapshot/00000000000000000004", "", "Range", "bytes=9-"), 416, streamcore.CodeRangeNotSatisfiable)
	expect(t, do(t, "GET", s+"/snapshot/00000000000000000003", ""), 404, streamcore.CodeSnapshotNotFound)
	ret := do(t, "PUT", s+"/retention/00000000000000000004", "")
	expect(t, ret, 204, "")
	if ret.h.Get("Stream-Retained-Offset") != streamcore.FormatOffset(4) {
		t.Fatal(ret.h)
	}
	g := do(t, "GET", s+"?offset=00000000000000000002", "")
	expect(t, g, 410, streamcore.CodeStreamGone)
	if g.h.Get("Stream-Next-Offset") != streamcore.FormatOffset(4) {
		t.Fatal(g.h)
	}
	hd := do(t, "HEAD", s, "")
	if hd.h.Get("Stream-Snapshot-Offset") != streamcore.FormatOffset(4) || hd.h.Get("Stream-Retained-Offset") != streamcore.FormatOffset(4) ||
		hd.h.Get("Ursula-Max-Request-Bytes") != "33554432" {
		t.Fatalf("HEAD %v", hd.h)
	}
	b := do(t, "GET", s+"/bootstrap", "")
	expect(t, b, 200, "")
	parts, err := streamcore.ReadMultipart(b.h.Get("Content-Type"), strings.NewReader(b.body))
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || string(parts[0].Body) != "SNAP" || parts[0].ContentType != "application/x-test" || string(parts[1].Body) != "456789" {
		t.Fatalf("bootstrap parts %+v", parts)
	}
	if b.h.Get("Stream-Up-To-Date") != "true" || b.h.Get("Stream-Next-Offset") != streamcore.FormatOffset(10) {
		t.Fatal(b.h)
	}
	expect(t, do(t, "GET", s+"/bootstrap?live=sse", ""), 400, streamcore.CodeInvalidQuery)
}

func TestImmutableChunks(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/imm"
	c := do(t, "PUT", s, "abcdef", "Content-Type", "text/plain")
	tok := c.h.Get("Stream-Incarnation")
	a := do(t, "GET", s+"/incarnation/"+tok+"/chunk/00000000000000000002", "")
	if a.status != 200 || a.body != "cdef" || a.h.Get("Stream-Immutable") != "" {
		t.Fatalf("open-tail chunk %+v", a)
	}
	expect(t, do(t, "POST", s, "", "Stream-Closed", "true"), 204, "")
	a = do(t, "GET", s+"/incarnation/"+tok+"/chunk/00000000000000000002", "")
	if a.h.Get("Stream-Immutable") != "true" || a.h.Get("Stream-Closed") != "true" {
		t.Fatalf("closed chunk %v", a.h)
	}
	expect(t, do(t, "GET", s+"/incarnation/"+tok+"/chunk/00000000000000000002?x=1", ""), 400, streamcore.CodeQueryNotAccepted)
	expect(t, do(t, "GET", s+"/incarnation/"+tok+"/chunk/-1", ""), 400, streamcore.CodeInvalidResource)
	expect(t, do(t, "GET", s+"/incarnation/4503599627370497/chunk/00000000000000000000", ""), 412, streamcore.CodeIncarnationMismatch)
}

func TestRequestTooLarge(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/big"
	expect(t, do(t, "PUT", s, "", "Content-Type", "application/octet-stream"), 201, "")
	big := bytes.Repeat([]byte("x"), streamcore.MaxRequestBytes+1)
	req, _ := http.NewRequest("POST", s, bytes.NewReader(big))
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 413 || res.Header.Get("Ursula-Max-Request-Bytes") != "33554432" || res.Header.Get("X-Ursula-Not-Applied") != "RequestBodyTooLarge" {
		t.Fatalf("413: %d %v", res.StatusCode, res.Header)
	}
	hd := do(t, "HEAD", s, "")
	if hd.h.Get("Stream-Next-Offset") != streamcore.FormatOffset(0) {
		t.Fatal("a refused append changed the stream")
	}
}

func TestLongPollAndSSE(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/live"
	expect(t, do(t, "PUT", s, "", "Content-Type", "text/plain"), 201, "")
	// Long-poll timeout: 204 with cursor.
	lp := do(t, "GET", s+"?offset=now&live=long-poll&timeout_ms=50", "")
	if lp.status != 204 || lp.h.Get("Stream-Cursor") == "" || lp.h.Get("Stream-Up-To-Date") != "true" {
		t.Fatalf("long-poll timeout %+v", lp)
	}
	// Long-poll woken by an append.
	done := make(chan answer, 1)
	go func() { done <- do(t, "GET", s+"?offset=00000000000000000000&live=long-poll&timeout_ms=5000", "") }()
	time.Sleep(50 * time.Millisecond)
	expect(t, do(t, "POST", s, "hi", "Content-Type", "text/plain"), 204, "")
	select {
	case a := <-done:
		if a.status != 200 || a.body != "hi" {
			t.Fatalf("long-poll %+v", a)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("long-poll was not woken")
	}
	// SSE: history, a live append, then close ends the stream.
	res, err := http.Get(s + "?offset=-1&live=sse")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatal(res.Header)
	}
	rd := streamcore.NewSSEReader(bufio.NewReader(res.Body))
	next := func() streamcore.SSEEvent {
		ev, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := next(); ev.Type != "data" || string(ev.Data) != "hi" {
		t.Fatalf("first event %+v", ev)
	}
	var ctl streamcore.SSEControl
	ev := next()
	if ev.Type != "control" || json.Unmarshal(ev.Data, &ctl) != nil || !ctl.UpToDate || ctl.StreamCursor == "" {
		t.Fatalf("control %s", ev.Data)
	}
	expect(t, do(t, "POST", s, "yo", "Content-Type", "text/plain", "Stream-Closed", "true"), 204, "")
	if ev := next(); string(ev.Data) != "yo" {
		t.Fatalf("live event %+v", ev)
	}
	ev = next()
	if json.Unmarshal(ev.Data, &ctl) != nil || !ctl.StreamClosed || ctl.StreamNextOffset != streamcore.FormatOffset(4) {
		t.Fatalf("final control %s", ev.Data)
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("SSE must end after the final control, got %v", err)
	}
}

func TestAdminEndpoints(t *testing.T) {
	ts := newTestServer(t)
	expect(t, do(t, "GET", ts.URL+"/__ursula/ready", ""), 200, "")
	do(t, "PUT", ts.URL+"/bkt1/m", "abc", "Content-Type", "text/plain")
	m := do(t, "GET", ts.URL+"/__ursula/metrics", "")
	var ms MetricsSnapshot
	if err := json.Unmarshal([]byte(m.body), &ms); err != nil || ms.Engine.Streams != 1 || ms.Engine.Bytes != 3 {
		t.Fatalf("metrics %s", m.body)
	}
	p := do(t, "GET", ts.URL+"/metrics", "")
	if !strings.Contains(p.body, "ursula_streams 1") || !strings.Contains(p.body, `ursula_http_requests_total{method="PUT",code="2xx"}`) {
		t.Fatalf("prometheus %s", p.body)
	}
}
