package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// The client against the real server (memory engine) over real HTTP on loopback.

func newRealServer(t *testing.T) (*client.Client, string) {
	t.Helper()
	ts := testserver.Start(t, testserver.Options{ClusterID: "client-test"})
	c, err := client.New(ts.URL + "/bucket")
	if err != nil {
		t.Fatal(err)
	}
	return c, ts.URL
}

func TestClientAgainstServer(t *testing.T) {
	c, base := newRealServer(t)
	ctx := context.Background()
	u := client.StreamURL(base, "bucket", "s1")

	cr, err := c.Create(ctx, "s1", client.CreateOptions{ContentType: "text/plain", TTL: time.Hour, Body: []byte("ab")})
	if err != nil || !cr.Created || cr.Incarnation == "" || cr.NextOffset != streamcore.FormatOffset(2) {
		t.Fatalf("create: %v %+v", err, cr)
	}
	inc := cr.Incarnation
	if again, err := c.Create(ctx, u, client.CreateOptions{ContentType: "text/plain", TTL: time.Hour}); err != nil || again.Created || again.Incarnation != inc {
		t.Fatalf("repeat create: %v %+v", err, again)
	}
	_, err = c.Create(ctx, u, client.CreateOptions{ContentType: "application/json"})
	if ce := asClientError(t, err); ce.Status != 409 || ce.Code != streamcore.CodeAlreadyExists || ce.Outcome != client.NotApplied {
		t.Fatalf("conflicting create: %v", err)
	}

	p := &client.ProducerKey{ID: "writer", Epoch: 1, Seq: 0}
	ar, err := c.Append(ctx, u, []byte("cd"), client.AppendOptions{ContentType: "text/plain", Producer: p, Digest: true, IfIncarnation: inc})
	if err != nil || ar.Duplicate || ar.Offset != streamcore.FormatOffset(2) || ar.NextOffset != streamcore.FormatOffset(4) || ar.ProducerEpoch != 1 || ar.ProducerSeq != 0 {
		t.Fatalf("producer append: %v %+v", err, ar)
	}
	dup, err := c.Append(ctx, u, []byte("cd"), client.AppendOptions{ContentType: "text/plain", Producer: p, Digest: true})
	if err != nil || !dup.Duplicate || dup.Offset != streamcore.FormatOffset(2) || dup.NextOffset != streamcore.FormatOffset(4) {
		t.Fatalf("producer repeat: %v %+v", err, dup)
	}
	_, err = c.Append(ctx, u, []byte("zz"), client.AppendOptions{ContentType: "text/plain", Producer: &client.ProducerKey{ID: "writer", Epoch: 1, Seq: 5}})
	if ce := asClientError(t, err); ce.Status != 409 || ce.ProducerExpectedSeq != 1 || ce.ProducerReceivedSeq != 5 || ce.Outcome != client.NotApplied {
		t.Fatalf("producer gap: %v", err)
	}
	if _, err := c.Append(ctx, u, []byte("ef"), client.AppendOptions{ContentType: "text/plain", Producer: &client.ProducerKey{ID: "writer", Epoch: 2, Seq: 0}}); err != nil {
		t.Fatalf("claim: %v", err)
	}
	_, err = c.Append(ctx, u, []byte("gh"), client.AppendOptions{ContentType: "text/plain", Producer: &client.ProducerKey{ID: "writer", Epoch: 1, Seq: 1}})
	if ce := asClientError(t, err); !ce.Fenced() || ce.ProducerEpoch != 2 || ce.Outcome != client.NotApplied {
		t.Fatalf("fenced: %v", err)
	}
	if _, err := c.Append(ctx, u, []byte("gh"), client.AppendOptions{ContentType: "text/plain", StreamSeq: "b"}); err != nil {
		t.Fatalf("stream-seq append: %v", err)
	}
	_, err = c.Append(ctx, u, []byte("ij"), client.AppendOptions{ContentType: "text/plain", StreamSeq: "a"})
	if ce := asClientError(t, err); ce.Code != streamcore.CodeStreamSeqConflict || ce.StreamLastSeq != "b" || ce.StreamNextOffset != streamcore.FormatOffset(8) {
		t.Fatalf("stream-seq conflict: %v", err)
	}
	_, err = c.Append(ctx, u, []byte("ij"), client.AppendOptions{ContentType: "text/plain", IfIncarnation: "4503599627370496"})
	if ce := asClientError(t, err); ce.Status != 412 || ce.Incarnation != inc {
		t.Fatalf("incarnation mismatch: %v", err)
	}

	rr, err := c.Read(ctx, u, client.ReadOptions{})
	if err != nil || string(rr.Data) != "abcdefgh" || !rr.UpToDate || rr.NextOffset != streamcore.FormatOffset(8) || rr.Incarnation != inc || rr.ETag == "" {
		t.Fatalf("read: %v %+v", err, rr)
	}
	rr, err = c.Read(ctx, u, client.ReadOptions{Offset: streamcore.FormatOffset(2), MaxBytes: 3, Buf: make([]byte, 0, 64)})
	if err != nil || string(rr.Data) != "cde" || rr.UpToDate || rr.NextOffset != streamcore.FormatOffset(5) {
		t.Fatalf("partial read: %v %+v", err, rr)
	}
	_, err = c.Read(ctx, u, client.ReadOptions{Offset: streamcore.FormatOffset(99)})
	if ce := asClientError(t, err); ce.Status != 416 || ce.StreamNextOffset != streamcore.FormatOffset(8) {
		t.Fatalf("read beyond tail: %v", err)
	}

	// Long-poll: times out with 204, then wakes on an append.
	lp, err := c.Read(ctx, u, client.ReadOptions{Offset: streamcore.FormatOffset(8), LongPoll: true, Timeout: 50 * time.Millisecond})
	if err != nil || lp.Status != 204 || !lp.UpToDate || lp.NextOffset != streamcore.FormatOffset(8) {
		t.Fatalf("long-poll timeout: %v %+v", err, lp)
	}
	done := make(chan *client.ReadResult, 1)
	go func() {
		r, err := c.Read(ctx, u, client.ReadOptions{Offset: streamcore.FormatOffset(8), LongPoll: true, Timeout: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(50 * time.Millisecond)

	// SSE subscription from the start sees history, then live data.
	sub, err := c.Subscribe(ctx, u, client.SubscribeOptions{Offset: streamcore.FormatOffset(0)})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer sub.Close()
	if sub.Incarnation != inc || sub.Base64 {
		t.Fatalf("subscription headers %+v", sub)
	}
	if _, err := c.Append(ctx, u, []byte("kl"), client.AppendOptions{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r == nil || string(r.Data) != "kl" {
		t.Fatalf("long-poll wake: %+v", r)
	}
	var got []byte
	for ctl := (streamcore.SSEControl{}); ctl.StreamNextOffset != streamcore.FormatOffset(10); {
		m, err := sub.Next()
		if err != nil {
			t.Fatalf("sse next: %v", err)
		}
		switch m.Kind {
		case "data":
			got = append(got, m.Data...)
		case "control":
			ctl = m.Control
		}
	}
	if string(got) != "abcdefghkl" {
		t.Fatalf("sse data %q", got)
	}

	// Snapshot, retention, bootstrap, HEAD.
	pub, err := c.PublishSnapshot(ctx, u, streamcore.FormatOffset(4), "application/x-snap", []byte("SNAP"))
	if err != nil || pub.SnapshotOffset != streamcore.FormatOffset(4) || pub.SnapshotDigest != streamcore.SnapshotDigestOf("application/x-snap", []byte("SNAP")) {
		t.Fatalf("publish: %v %+v", err, pub)
	}
	sr, err := c.ReadSnapshot(ctx, u, streamcore.FormatOffset(4))
	if err != nil || string(sr.Data) != "SNAP" || sr.ContentType != "application/x-snap" || sr.Digest != pub.SnapshotDigest {
		t.Fatalf("read snapshot: %v %+v", err, sr)
	}
	if nm, err := c.ReadSnapshot(ctx, u, streamcore.FormatOffset(4), client.SnapshotReadOptions{IfNoneMatch: sr.ETag}); err != nil || !nm.NotModified {
		t.Fatalf("snapshot 304: %v %+v", err, nm)
	}
	ret, err := c.Retain(ctx, u, streamcore.FormatOffset(4))
	if err != nil || ret.RetainedOffset != streamcore.FormatOffset(4) {
		t.Fatalf("retain: %v %+v", err, ret)
	}
	_, err = c.Read(ctx, u, client.ReadOptions{Offset: streamcore.FormatOffset(0)})
	if ce := asClientError(t, err); ce.Status != 410 || ce.Code != streamcore.CodeStreamGone {
		t.Fatalf("read below retention: %v", err)
	}
	bs, err := c.Bootstrap(ctx, u)
	if err != nil || string(bs.Snapshot.Body) != "SNAP" || bs.SnapshotOffset != streamcore.FormatOffset(4) || !bs.UpToDate || bs.NextOffset != streamcore.FormatOffset(10) {
		t.Fatalf("bootstrap: %v %+v", err, bs)
	}
	var upd []byte
	for _, p := range bs.Updates {
		upd = append(upd, p.Body...)
	}
	if string(upd) != "efghkl" {
		t.Fatalf("bootstrap updates %q", upd)
	}
	hd, err := c.Head(ctx, u)
	if err != nil || hd.NextOffset != streamcore.FormatOffset(10) || hd.ContentType != "text/plain" || hd.TTL != 3600 ||
		hd.RetainedOffset != streamcore.FormatOffset(4) || hd.SnapshotOffset != streamcore.FormatOffset(4) || hd.SnapshotDigest != pub.SnapshotDigest ||
		hd.Incarnation != inc || hd.MaxRequestBytes != streamcore.MaxRequestBytes || hd.Closed {
		t.Fatalf("head: %v %+v", err, hd)
	}

	// Close: the subscription ends after a closed control event.
	cl, err := c.Close(ctx, u, client.AppendOptions{})
	if err != nil || !cl.Closed || cl.NextOffset != streamcore.FormatOffset(10) {
		t.Fatalf("close: %v %+v", err, cl)
	}
	sawClosed := false
	for m, err := range sub.All() {
		if err != nil {
			t.Fatalf("sse after close: %v", err)
		}
		if m.Kind == "control" && m.Control.StreamClosed {
			sawClosed = true
		}
	}
	if !sawClosed {
		t.Fatal("no closed control event")
	}
	_, err = c.Append(ctx, u, []byte("x"), client.AppendOptions{ContentType: "text/plain"})
	if ce := asClientError(t, err); ce.Code != streamcore.CodeStreamClosed || !ce.StreamClosed {
		t.Fatalf("append to closed: %v", err)
	}

	if _, err := c.Delete(ctx, u, client.CallOptions{IfIncarnation: inc}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err = c.Head(ctx, u)
	if ce := asClientError(t, err); ce.Status != 404 {
		t.Fatalf("head after delete: %v", err)
	}
}

func TestClientBinarySSEAgainstServer(t *testing.T) {
	c, base := newRealServer(t)
	ctx := context.Background()
	u := client.StreamURL(base, "bucket", "bin")
	if _, err := c.Create(ctx, u, client.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, u, client.SubscribeOptions{Offset: "now"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !sub.Base64 {
		t.Fatalf("octet-stream SSE not base64: %v", sub.Header)
	}
	payload := []byte{0, 1, 2, '\n', '\r', 0xff}
	if _, err := c.Append(ctx, u, payload, client.AppendOptions{ContentType: "application/octet-stream"}); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(payload) {
		m, err := sub.Next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Data...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("got %v", got)
	}
	// Deleting the stream ends the subscription with an error event.
	if _, err := c.Delete(ctx, u); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := sub.Next()
		if err == nil {
			continue
		}
		if err == io.EOF {
			break // a server may also just end the stream
		}
		var ce *client.Error
		if !errors.As(err, &ce) {
			t.Fatalf("sse end: %v", err)
		}
		break
	}
}

func asClientError(t *testing.T, err error) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want a *Error, got %v", err)
	}
	return ce
}

func TestClientSubscriptionCloseWhileBlocked(t *testing.T) {
	c, base := newRealServer(t)
	ctx := context.Background()
	u := client.StreamURL(base, "bucket", "idle")
	if _, err := c.Create(ctx, u, client.CreateOptions{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, u, client.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := sub.Next(); err != nil || m.Kind != "control" || !m.Control.UpToDate {
		t.Fatalf("first event: %+v %v", m, err)
	}
	errc := make(chan error, 1)
	go func() { _, err := sub.Next(); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	sub.Close()
	select {
	case err := <-errc:
		if err != io.EOF {
			t.Fatalf("Next after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a blocked Next")
	}
}

// writeCounter counts the writes that reach a connection.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestAppendIsOneWrite: an append of a body up to about 30 KB leaves in one write, head
// and body together. net/http flushes the head on its own first when it cannot tell the body is in
// memory, which costs a second write and wakes the server twice per commit.
func TestAppendIsOneWrite(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{ClusterID: "client-test"})
	var writes atomic.Int64
	tr := client.NewTransport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, &writes}, nil
	}
	c, err := client.New(ts.URL, client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	u := ts.URL + "/bucket/onewrite"
	if _, err := c.Create(context.Background(), u, client.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
		t.Fatal(err)
	}
	var off uint64
	for seq := uint64(0); seq < 6; seq++ {
		body := bytes.Repeat([]byte("x"), []int{100, 1000, 5000, 12000, 30000, 1000}[seq])
		before := writes.Load()
		wr, err := c.Append(context.Background(), u, body, client.AppendOptions{ContentType: "application/octet-stream",
			Producer: &client.ProducerKey{ID: "p", Seq: seq}, Digest: true})
		if err != nil {
			t.Fatal(err)
		}
		off += uint64(len(body))
		if wr.NextOffset != streamcore.FormatOffset(off) {
			t.Fatalf("append %d: next offset %s", seq, wr.NextOffset)
		}
		if n := writes.Load() - before; n != 1 {
			t.Fatalf("append %d took %d writes, want 1", seq, n)
		}
	}
}
