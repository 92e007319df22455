package client

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// These tests check the client's classification of write answers (extension spec 000
// §11.1). The answers are canned by httptest handlers on purpose: many of them (OUTCOME_UNKNOWN,
// NO_LEADER, gateway codes, a 2xx from a misrouting proxy, a reset after the upload) are
// answers our single-node server never gives, yet the client must read them correctly. The
// client against the real server is tested in client_server_test.go.

type canned struct {
	status int
	hdr    map[string]string
	body   string
}

func (c canned) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	for k, v := range c.hdr {
		w.Header().Set(k, v)
	}
	if c.body != "" {
		if strings.HasPrefix(c.body, "{") {
			w.Header().Set("Content-Type", "application/json")
		}
	}
	w.WriteHeader(c.status)
	io.WriteString(w, c.body)
}

func errBody(code string) string { return `{"error":{"code":"` + code + `","message":"canned"}}` }

func newCannedClient(t *testing.T, h http.HandlerFunc, p OutcomePolicy) (*Client, string) {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c, err := New(ts.URL+"/bucket", WithPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	return c, ts.URL + "/bucket/stream"
}

type writeCall func(c *Client, u string) (*WriteResult, error)

var (
	plainAppend writeCall = func(c *Client, u string) (*WriteResult, error) {
		return c.Append(context.Background(), u, []byte("hello"), AppendOptions{ContentType: "text/plain"})
	}
	producerAppend writeCall = func(c *Client, u string) (*WriteResult, error) {
		return c.Append(context.Background(), u, []byte("hello"), AppendOptions{ContentType: "text/plain",
			Producer: &ProducerKey{ID: "p", Epoch: 1, Seq: 4}, Digest: true})
	}
	createCall writeCall = func(c *Client, u string) (*WriteResult, error) {
		return c.Create(context.Background(), u, CreateOptions{ContentType: "text/plain"})
	}
	retainCall writeCall = func(c *Client, u string) (*WriteResult, error) {
		return c.Retain(context.Background(), u, streamcore.FormatOffset(3))
	}
	publishCall writeCall = func(c *Client, u string) (*WriteResult, error) {
		return c.PublishSnapshot(context.Background(), u, streamcore.FormatOffset(3), "application/octet-stream", []byte("snap"))
	}
	deleteCall writeCall = func(c *Client, u string) (*WriteResult, error) {
		return c.Delete(context.Background(), u)
	}
)

func TestClientClassifyCannedAnswers(t *testing.T) {
	receipt := map[string]string{streamcore.HdrStreamOffset: streamcore.FormatOffset(0), streamcore.HdrStreamNextOff: streamcore.FormatOffset(5),
		streamcore.HdrProducerEpoch: "1", streamcore.HdrProducerSeq: "4", streamcore.HdrIncarnation: "4503599627370497"}
	marker := func(tok string, extra map[string]string) map[string]string {
		m := map[string]string{streamcore.HdrNotApplied: tok}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name   string
		call   writeCall
		answer canned
		policy OutcomePolicy
		want   Outcome
		check  func(t *testing.T, r *WriteResult, ce *Error)
	}{
		// 2xx: applied only with the typed answer of the write (§11.1).
		{name: "append 204 with next offset", call: plainAppend, want: Applied,
			answer: canned{status: 204, hdr: map[string]string{streamcore.HdrStreamNextOff: streamcore.FormatOffset(5)}},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if r.NextOffset != streamcore.FormatOffset(5) || r.Duplicate {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "append 204 without next offset is unknown", call: plainAppend, want: Unknown,
			answer: canned{status: 204}},
		{name: "append 204 without next offset, lenient", call: plainAppend, want: Applied,
			answer: canned{status: 204}, policy: OutcomePolicy{LenientSuccess: true}},
		{name: "producer 200 new write", call: producerAppend, want: Applied,
			answer: canned{status: 200, hdr: receipt},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if r.Duplicate || r.Offset != streamcore.FormatOffset(0) || r.NextOffset != streamcore.FormatOffset(5) ||
					r.ProducerEpoch != 1 || r.ProducerSeq != 4 || r.ProducerClosedEpoch != -1 {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "producer 204 repeat with receipt", call: producerAppend, want: Applied,
			answer: canned{status: 204, hdr: receipt},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if !r.Duplicate || r.ReceiptEvicted {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "producer 204 receipt-evicted", call: producerAppend, want: Applied,
			answer: canned{status: 204, hdr: map[string]string{streamcore.HdrProducerEpoch: "1", streamcore.HdrProducerSeq: "9",
				streamcore.HdrProducerOutcome: "receipt-evicted"}},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if !r.Duplicate || !r.ReceiptEvicted || r.Offset != "" {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "producer claim closes earlier epoch", call: producerAppend, want: Applied,
			answer: canned{status: 200, hdr: map[string]string{streamcore.HdrStreamOffset: streamcore.FormatOffset(0),
				streamcore.HdrStreamNextOff: streamcore.FormatOffset(5), streamcore.HdrProducerEpoch: "2", streamcore.HdrProducerSeq: "0",
				streamcore.HdrProducerClosedEpoch: "1", streamcore.HdrProducerClosedSeq: "7"}},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if r.ProducerClosedEpoch != 1 || r.ProducerClosedSeq != 7 {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "producer 200 without receipt (base-only server) is unknown", call: producerAppend, want: Unknown,
			answer: canned{status: 200, hdr: map[string]string{streamcore.HdrProducerEpoch: "1", streamcore.HdrProducerSeq: "4"}}},
		{name: "create 201 with incarnation", call: createCall, want: Applied,
			answer: canned{status: 201, hdr: map[string]string{streamcore.HdrIncarnation: "4503599627370497",
				"Location": "/bucket/stream", streamcore.HdrStreamNextOff: streamcore.FormatOffset(0)}},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if !r.Created || r.Incarnation != "4503599627370497" || r.Location != "/bucket/stream" {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "create 200 without incarnation is unknown", call: createCall, want: Unknown,
			answer: canned{status: 200}},
		{name: "retention 204 without incarnation is unknown", call: retainCall, want: Unknown,
			answer: canned{status: 204, hdr: map[string]string{streamcore.HdrRetainedOffset: streamcore.FormatOffset(3)}}},
		{name: "retention 204 typed", call: retainCall, want: Applied,
			answer: canned{status: 204, hdr: map[string]string{streamcore.HdrRetainedOffset: streamcore.FormatOffset(3), streamcore.HdrIncarnation: "4503599627370497"}},
			check: func(t *testing.T, r *WriteResult, _ *Error) {
				if r.RetainedOffset != streamcore.FormatOffset(3) {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "publish 204 typed", call: publishCall, want: Applied,
			answer: canned{status: 204, hdr: map[string]string{streamcore.HdrSnapshotOffset: streamcore.FormatOffset(3), streamcore.HdrSnapshotDigest: "ab"}}},
		{name: "delete 204 by status", call: deleteCall, want: Applied, answer: canned{status: 204}},

		// 4xx other than 408: refusals.
		{name: "400 invalid producer", call: producerAppend, want: NotApplied,
			answer: canned{status: 400, body: errBody("INVALID_PRODUCER")},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.Code != "INVALID_PRODUCER" || ce.Message != "canned" {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "401 plain text from a layer", call: plainAppend, want: NotApplied,
			answer: canned{status: 401, body: "no token"},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.Code != "" || ce.Message != "no token" {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "402", call: plainAppend, want: NotApplied, answer: canned{status: 402, body: errBody("PAYMENT_REQUIRED")}},
		{name: "403 epoch closed by claim", call: producerAppend, want: NotApplied,
			answer: canned{status: 403, body: errBody("PRODUCER_EPOCH_CLOSED"), hdr: map[string]string{
				streamcore.HdrProducerEpoch: "2", streamcore.HdrProducerOutcome: "epoch-closed;by=claim",
				streamcore.HdrProducerClosedEpoch: "1", streamcore.HdrProducerClosedSeq: "3"}},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if !ce.Fenced() || ce.ProducerEpoch != 2 || ce.ProducerClosedEpoch != 1 || ce.ProducerClosedSeq != 3 ||
					OutcomeToken(ce.ProducerOutcome) != "epoch-closed" {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "403 access layer is not fenced", call: plainAppend, want: NotApplied,
			answer: canned{status: 403, body: errBody("FORBIDDEN")},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.Fenced() {
					t.Errorf("access 403 read as a producer fence: %+v", ce)
				}
			}},
		{name: "404", call: plainAppend, want: NotApplied, answer: canned{status: 404, body: errBody("STREAM_NOT_FOUND")}},
		{name: "409 producer gap", call: producerAppend, want: NotApplied,
			answer: canned{status: 409, body: errBody("PRODUCER_SEQ_CONFLICT"), hdr: map[string]string{
				streamcore.HdrProducerExpectedSeq: "2", streamcore.HdrProducerReceivedSeq: "4"}},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.ProducerExpectedSeq != 2 || ce.ProducerReceivedSeq != 4 || ce.Fenced() {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "409 stream seq", call: plainAppend, want: NotApplied,
			answer: canned{status: 409, body: errBody("STREAM_SEQ_CONFLICT"), hdr: map[string]string{
				streamcore.HdrStreamLastSeq: "0009", streamcore.HdrStreamNextOff: streamcore.FormatOffset(42)}},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.StreamLastSeq != "0009" || ce.StreamNextOffset != streamcore.FormatOffset(42) {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "409 closed", call: plainAppend, want: NotApplied,
			answer: canned{status: 409, body: errBody("STREAM_CLOSED"), hdr: map[string]string{
				streamcore.HdrStreamClosed: "true", streamcore.HdrStreamNextOff: streamcore.FormatOffset(7)}},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if !ce.StreamClosed || ce.StreamNextOffset != streamcore.FormatOffset(7) {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "412", call: plainAppend, want: NotApplied, answer: canned{status: 412, body: errBody("INCARNATION_MISMATCH"),
			hdr: map[string]string{streamcore.HdrIncarnation: "4503599627370498"}},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.Incarnation != "4503599627370498" {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "413 marked", call: plainAppend, want: NotApplied,
			answer: canned{status: 413, body: errBody("REQUEST_TOO_LARGE"), hdr: marker("RequestBodyTooLarge",
				map[string]string{streamcore.HdrMaxRequestBytes: "33554432"})},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.NotApplied != "RequestBodyTooLarge" || ce.MaxRequestBytes != 33554432 {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "429 producer limit", call: producerAppend, want: NotApplied, answer: canned{status: 429, body: errBody("PRODUCER_LIMIT")}},

		// 408: only BODY_TOO_SLOW proves a refusal.
		{name: "408 body too slow", call: plainAppend, want: NotApplied, answer: canned{status: 408, body: errBody("BODY_TOO_SLOW")}},
		{name: "408 without code", call: plainAppend, want: Unknown, answer: canned{status: 408}},

		// 5xx: the code decides, never the status.
		{name: "503 outcome unknown", call: producerAppend, want: Unknown,
			answer: canned{status: 503, body: errBody("OUTCOME_UNKNOWN"), hdr: map[string]string{streamcore.HdrRetryAfter: "1"}},
			check: func(t *testing.T, _ *WriteResult, ce *Error) {
				if ce.RetryAfter != time.Second || ce.Code != "OUTCOME_UNKNOWN" {
					t.Errorf("error %+v", ce)
				}
			}},
		{name: "503 no leader", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("NO_LEADER")}},
		{name: "503 wal pressure marked", call: plainAppend, want: NotApplied,
			answer: canned{status: 503, body: errBody("WAL_DISK_PRESSURE"), hdr: marker("WalDiskPressure", nil)}},
		{name: "503 raft log pressure", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("RAFT_LOG_PRESSURE")}},
		{name: "503 ingress limit", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("INGRESS_BODY_BYTES_LIMIT_REACHED")}},
		{name: "503 cold backpressure", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("COLD_BACKPRESSURE")}},
		{name: "503 uncommitted backpressure", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("RAFT_UNCOMMITTED_BACKPRESSURE")}},
		{name: "503 apply stopped", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("APPLY_STOPPED")}},
		{name: "503 group restarting", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("GROUP_RESTARTING")}},
		{name: "503 history pending", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("HISTORY_PENDING")}},
		{name: "503 json boundary unverified", call: retainCall, want: NotApplied, answer: canned{status: 503, body: errBody("JSON_BOUNDARY_UNVERIFIED")}},
		{name: "503 snapshot commits busy", call: publishCall, want: NotApplied, answer: canned{status: 503, body: errBody("SNAPSHOT_COMMITS_BUSY")}},
		{name: "503 gateway upstream unreachable", call: plainAppend, want: NotApplied, answer: canned{status: 503, body: errBody("UPSTREAM_UNREACHABLE")}},
		{name: "503 snapshot commit in progress", call: publishCall, want: Unknown, answer: canned{status: 503, body: errBody("SNAPSHOT_COMMIT_IN_PROGRESS")}},
		{name: "503 live read backpressure", call: plainAppend, want: Unknown, answer: canned{status: 503, body: errBody("LIVE_READ_BACKPRESSURE")}},
		{name: "503 unknown code", call: plainAppend, want: Unknown, answer: canned{status: 503, body: errBody("SOMETHING_NEW")}},
		{name: "503 without body", call: plainAppend, want: Unknown, answer: canned{status: 503}},
		{name: "501 no cold store", call: publishCall, want: NotApplied, answer: canned{status: 501, body: errBody("NO_COLD_STORE")}},
		{name: "500 internal", call: plainAppend, want: Unknown, answer: canned{status: 500, body: errBody("INTERNAL")}},
		{name: "500 created at out of range", call: createCall, want: Unknown, answer: canned{status: 500, body: errBody("CREATED_AT_OUT_OF_RANGE")}},
		{name: "500 marked NotLeader (node without peers)", call: plainAppend, want: NotApplied,
			answer: canned{status: 500, body: errBody("INTERNAL"), hdr: marker("NotLeader", nil)}},
		{name: "502 cold store failed", call: publishCall, want: Unknown, answer: canned{status: 502, body: errBody("COLD_STORE_FAILED")}},
		{name: "504 upstream timeout", call: plainAppend, want: Unknown, answer: canned{status: 504, body: errBody("UPSTREAM_TIMEOUT")}},

		// The marker with RequireVouch: only marker + vouch proves the refusal.
		{name: "vouch required, marker alone", call: plainAppend, want: Unknown, policy: OutcomePolicy{RequireVouch: true},
			answer: canned{status: 503, body: errBody("SOMETHING_NEW"), hdr: marker("RaftLogPressure", nil)}},
		{name: "vouch required, marker and vouch", call: plainAppend, want: NotApplied, policy: OutcomePolicy{RequireVouch: true},
			answer: canned{status: 503, body: errBody("SOMETHING_NEW"), hdr: marker("RaftLogPressure",
				map[string]string{streamcore.HdrNotAppliedChecked: "1"})}},

		// Redirects and other 3xx.
		{name: "307 unmarked after the body went out", call: plainAppend, want: Unknown,
			answer: canned{status: 307, hdr: map[string]string{"Location": "/elsewhere"}}},
		{name: "302 proves nothing", call: plainAppend, want: Unknown,
			answer: canned{status: 302, hdr: map[string]string{"Location": "/elsewhere"}}},
		{name: "304 proves nothing", call: plainAppend, want: Unknown, answer: canned{status: 304}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, u := newCannedClient(t, tc.answer.serve, tc.policy)
			r, err := tc.call(c, u)
			if got := OutcomeOf(err); got != tc.want {
				t.Fatalf("outcome %v, want %v (err %v)", got, tc.want, err)
			}
			var ce *Error
			if err != nil {
				if !errors.As(err, &ce) {
					t.Fatalf("error %T is not a *Error", err)
				}
				if ce.Status != tc.answer.status {
					t.Errorf("status %d, want %d", ce.Status, tc.answer.status)
				}
			} else if r == nil || r.Status != tc.answer.status {
				t.Fatalf("result %+v", r)
			}
			if tc.check != nil {
				tc.check(t, r, ce)
			}
		})
	}
}

// TestClientClassifyRedirects: a marked redirect, and one answered before any body byte,
// prove the target applied nothing; the client then repeats the write at the Location.
func TestClientClassifyRedirects(t *testing.T) {
	var leaderHits atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/leader/", func(w http.ResponseWriter, r *http.Request) {
		leaderHits.Add(1)
		b, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && string(b) != "hello" {
			t.Errorf("leader got body %q", b)
		}
		w.Header().Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(5))
		w.WriteHeader(204)
	})
	mux.HandleFunc("/bucket/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/leader/bucket/stream")
		if r.Header.Get("X-Mark") != "" {
			w.Header().Set(streamcore.HdrNotApplied, "NotLeader")
		}
		w.WriteHeader(307)
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	c, _ := New("")
	u := ts.URL + "/bucket/stream"

	r, err := c.Append(context.Background(), u, []byte("hello"), AppendOptions{ContentType: "text/plain",
		Header: http.Header{"X-Mark": {"1"}}})
	if err != nil || r.NextOffset != streamcore.FormatOffset(5) || leaderHits.Load() != 1 {
		t.Fatalf("marked redirect: %v %+v hits %d", err, r, leaderHits.Load())
	}
	// A delete has no body, so its redirect proves nothing applied even unmarked.
	if _, err := c.Delete(context.Background(), u); err != nil || leaderHits.Load() != 2 {
		t.Fatalf("bodiless redirect: %v hits %d", err, leaderHits.Load())
	}
	// Unmarked after the body went out: unknown, not followed.
	_, err = c.Append(context.Background(), u, []byte("hello"), AppendOptions{ContentType: "text/plain"})
	var ce *Error
	if !errors.As(err, &ce) || ce.Outcome != Unknown || ce.Status != 307 || ce.Location != "/leader/bucket/stream" || leaderHits.Load() != 2 {
		t.Fatalf("unmarked redirect: %v hits %d", err, leaderHits.Load())
	}
}

// TestClientClassifyTransport covers writes that got no answer.
func TestClientClassifyTransport(t *testing.T) {
	ctx := context.Background()
	body := []byte("hello")
	opts := AppendOptions{ContentType: "text/plain"}

	t.Run("dial refused is not applied", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		c, _ := New("")
		_, err = c.Append(ctx, "http://"+addr+"/bucket/stream", body, opts)
		var ce *Error
		if !errors.As(err, &ce) || ce.Outcome != NotApplied || ce.Status != 0 || ce.Err == nil {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("cancelled before sending is not applied", func(t *testing.T) {
		c, u := newCannedClient(t, canned{status: 204}.serve, OutcomePolicy{})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := c.Append(cctx, u, body, opts)
		if OutcomeOf(err) != NotApplied {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("reset after the request was read is unknown", func(t *testing.T) {
		c, u := newCannedClient(t, func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetLinger(0) // RST
			}
			conn.Close()
		}, OutcomePolicy{})
		_, err := c.Append(ctx, u, body, opts)
		var ce *Error
		if !errors.As(err, &ce) || ce.Outcome != Unknown || ce.Status != 0 {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("timeout after sending is unknown", func(t *testing.T) {
		release := make(chan struct{})
		c, u := newCannedClient(t, func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}, OutcomePolicy{})
		defer close(release)
		c.WriteTimeout = 100 * time.Millisecond
		_, err := c.Append(ctx, u, body, opts)
		var ce *Error
		if !errors.As(err, &ce) || ce.Outcome != Unknown || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v", err)
		}
	})
}

// TestClientClassifyPure checks the classifier itself on answers no handler needs.
func TestClientClassifyPure(t *testing.T) {
	p := OutcomePolicy{}
	h := http.Header{}
	for _, tc := range []struct {
		a    WriteAnswer
		want Outcome
	}{
		{WriteAnswer{Kind: WriteAppend, Status: 100, Header: h}, Unknown},
		{WriteAnswer{Kind: WriteAppend, Status: 308, Header: h, BodySent: false}, NotApplied},
		{WriteAnswer{Kind: WriteAppend, Status: 308, Header: h, BodySent: true}, Unknown},
		{WriteAnswer{Kind: WriteAppend, Status: 405, Header: h, Code: "METHOD_NOT_ALLOWED"}, NotApplied},
		{WriteAnswer{Kind: WriteAppend, Status: 503, Header: h, Code: "NO_LEADER"}, NotApplied},
		{WriteAnswer{Kind: WriteCreateBucket, Status: 201, Header: h}, Applied},
		{WriteAnswer{Kind: WriteStagePart, Status: 201, Header: h}, Unknown},
		{WriteAnswer{Kind: WriteStagePart, Status: 201, Header: http.Header{"Stream-Snapshot-Part": {"p1"}}}, Applied},
		{WriteAnswer{Kind: WriteDiscardParts, Status: 204, Header: http.Header{"Stream-Incarnation": {"1"}}}, Applied},
	} {
		if got := p.Classify(tc.a); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.a, got, tc.want)
		}
	}
	if ClassifyUnanswered(false) != NotApplied || ClassifyUnanswered(true) != Unknown {
		t.Error("ClassifyUnanswered")
	}
	if OutcomeOf(errors.New("x")) != Unknown || OutcomeOf(nil) != Applied {
		t.Error("OutcomeOf")
	}
}

// TestClientReadErrorsAndToken: read refusals are typed errors; the bearer token is sent.
func TestClientReadErrorsAndToken(t *testing.T) {
	var auth atomic.Value
	c, u := newCannedClient(t, func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		w.Header().Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(9))
		w.Header().Set(streamcore.HdrIncarnation, "4503599627370497")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(416)
		io.WriteString(w, errBody("OFFSET_OUT_OF_RANGE"))
	}, OutcomePolicy{})
	c.SetToken("s3cret")
	_, err := c.Read(context.Background(), u, ReadOptions{Offset: streamcore.FormatOffset(99)})
	var ce *Error
	if !errors.As(err, &ce) || ce.Status != 416 || ce.Code != "OFFSET_OUT_OF_RANGE" ||
		ce.StreamNextOffset != streamcore.FormatOffset(9) || ce.Incarnation != "4503599627370497" || ce.Outcome != NotApplied {
		t.Fatalf("got %v", err)
	}
	if auth.Load() != "Bearer s3cret" {
		t.Fatalf("authorization %q", auth.Load())
	}
	c.SetToken("")
	c.Read(context.Background(), u, ReadOptions{})
	if auth.Load() != "" {
		t.Fatalf("token not cleared: %q", auth.Load())
	}
}

func TestClientDigests(t *testing.T) {
	// BLAKE3-256 of the empty input (the published test vector).
	if got := streamcore.ProducerDigestOf(nil); got != "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262" {
		t.Fatalf("empty digest %s", got)
	}
	if a, b := streamcore.SnapshotDigestOf("text/plain", []byte("x")), streamcore.SnapshotDigestOf("text/plai", []byte("nx")); a == b {
		t.Fatal("snapshot digest must bind the content type length")
	}
	// Written in pieces, the incremental digest is the one of the whole body.
	h := streamcore.NewSnapshotDigest("application/octet-stream")
	h.Write([]byte("UR"))
	h.Write([]byte("SS body"))
	if got, want := hex.EncodeToString(h.Sum(nil)), streamcore.SnapshotDigestOf("application/octet-stream", []byte("URSS body")); got != want {
		t.Fatalf("incremental digest %s, want %s", got, want)
	}
	if got := StreamURL("http://h:1/", "b-ok", "a b"); got != "http://h:1/b-ok/a%20b" {
		t.Fatalf("StreamURL %s", got)
	}
}
