package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// parkedCount counts the subscriptions of s that own their connection and wait with no
// goroutine, and all that own their connection.
func parkedCount(s *Server) (parked, owned int) {
	s.sse.mu.Lock()
	defer s.sse.mu.Unlock()
	for c := range s.sse.subs {
		owned++
		if c.state.Load() == sseParked {
			parked++
		}
	}
	return parked, owned
}

// waitFor polls cond with a generous deadline (the machine may be loaded).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type sseClient struct {
	res *http.Response
	rd  *streamcore.SSEReader
}

func subscribe(t *testing.T, u string) *sseClient {
	t.Helper()
	res, err := http.Get(u)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("subscribe: %v %v", err, res)
	}
	t.Cleanup(func() { res.Body.Close() })
	return &sseClient{res: res, rd: streamcore.NewSSEReader(bufio.NewReader(res.Body))}
}

// next returns the next data event's payload, skipping control events.
func (c *sseClient) nextData(t *testing.T) string {
	t.Helper()
	for {
		ev, err := c.rd.Next()
		if err != nil {
			t.Fatalf("reading events: %v", err)
		}
		if ev.Type == "data" {
			return string(ev.Data)
		}
	}
}

// Idle subscriptions park without a goroutine: each still gets every append, in order,
// parks again after each, and a deleted stream ends them with an error event and a
// properly ended answer.
func TestSSEParkedSubscriptionsDeliver(t *testing.T) {
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "c"})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); eng.Close() })
	s := ts.URL + "/bkt1/parked"
	expect(t, do(t, "PUT", s, "a", "Content-Type", "text/plain"), 201, "")
	const n = 20
	var cs []*sseClient
	for range n {
		c := subscribe(t, s+"?offset=-1&live=sse")
		if got := c.nextData(t); got != "a" {
			t.Fatalf("history %q", got)
		}
		cs = append(cs, c)
	}
	waitFor(t, "every subscription parked", func() bool { p, o := parkedCount(srv); return p == n && o == n })
	outBefore := srv.usage.snapshot()["bkt1"].bytesOut.Load()
	for i, msg := range []string{"b", "c", "d"} {
		expect(t, do(t, "POST", s, msg, "Content-Type", "text/plain"), 204, "")
		for j, c := range cs {
			if got := c.nextData(t); got != msg {
				t.Fatalf("append %d, reader %d: %q, want %q", i, j, got, msg)
			}
		}
		waitFor(t, "parked again", func() bool { p, _ := parkedCount(srv); return p == n })
	}
	// What parked subscriptions write counts in the bucket's usage as before.
	if out := srv.usage.snapshot()["bkt1"].bytesOut.Load() - outBefore; out < n*3*uint64(len("data:b\n\n")) {
		t.Fatalf("bytes out grew by %d for %d deliveries", out, n*3)
	}
	expect(t, do(t, "DELETE", s, ""), 204, "")
	for j, c := range cs {
		ev, err := c.rd.Next()
		for err == nil && ev.Type == "control" {
			ev, err = c.rd.Next()
		}
		if err != nil || ev.Type != "error" {
			t.Fatalf("reader %d after delete: %+v %v", j, ev, err)
		}
		if _, err := c.rd.Next(); err != io.EOF {
			t.Fatalf("reader %d: the answer must end properly after the error event, got %v", j, err)
		}
	}
	waitFor(t, "no live readers", func() bool { _, o := parkedCount(srv); return srv.live.Load() == 0 && o == 0 })
}

// keepAliveSubscription starts a memory-engine server with the given keep-alive interval,
// creates the text stream /bkt1/name and subscribes to it over a plain connection (closed
// at the end of the test). It returns the server, the stream's URL, the connection and the
// 200 answer, whose body is the event stream.
func keepAliveSubscription(t *testing.T, keepAlive time.Duration, name string) (*Server, string, net.Conn, *http.Response) {
	t.Helper()
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "c", Limits: Limits{SSEKeepAlive: keepAlive}})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); eng.Close() })
	s := ts.URL + "/bkt1/" + name
	expect(t, do(t, "PUT", s, "", "Content-Type", "text/plain"), 201, "")
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	io.WriteString(conn, "GET /bkt1/"+name+"?offset=-1&live=sse HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("answer %v %v", err, res)
	}
	return srv, s, conn, res
}

// A parked subscription writes its keep-alive comment on time, and a reader that went
// away is found by that write: its slot is freed.
func TestSSEParkedKeepAliveAndGoneReader(t *testing.T) {
	srv, _, conn, res := keepAliveSubscription(t, 50*time.Millisecond, "ka")
	if res.TransferEncoding == nil {
		t.Fatalf("answer %v", res)
	}
	// Two keep-alive comments through the chunked body: the subscription parked and its
	// timer woke it (at least once from the parked state).
	body := bufio.NewReader(res.Body)
	comments := 0
	for comments < 2 {
		line, err := body.ReadString('\n')
		if err != nil {
			t.Fatalf("reading: %v", err)
		}
		if line == ":\n" {
			comments++
		}
	}
	conn.Close()
	waitFor(t, "the gone reader's slot freed", func() bool { _, o := parkedCount(srv); return srv.live.Load() == 0 && o == 0 })
}

// A subscription that is woken by its stream leaves its keep-alive timer running (armTimer):
// while events keep coming, the timer's spare wake must write no comment, and once the
// stream goes quiet the comment must still come one keep-alive interval after the last
// event (the spare wake re-arms the timer). The interval is above timerMargin, so the
// running timer is really left alone.
func TestSSEKeepAliveAfterBusyStretch(t *testing.T) {
	const keepAlive = 1500 * time.Millisecond
	srv, s, _, res := keepAliveSubscription(t, keepAlive, "busy")
	type line struct {
		at   time.Time
		text string
	}
	lines := make(chan line, 1024)
	go func() {
		body := bufio.NewReader(res.Body)
		for {
			l, err := body.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			lines <- line{time.Now(), l}
		}
	}()
	waitFor(t, "parked", func() bool { p, _ := parkedCount(srv); return p == 1 })
	// Events every 100 ms for 2.5 s: past the first timer's due time (1.5 s after parking).
	busyUntil := time.Now().Add(2500 * time.Millisecond)
	sent := 0
	for time.Now().Before(busyUntil) {
		expect(t, do(t, "POST", s, fmt.Sprintf("e%d\n", sent), "Content-Type", "text/plain"), 204, "")
		sent++
		time.Sleep(100 * time.Millisecond)
	}
	var lastData time.Time
	got := 0
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the answer ended")
			}
			switch {
			case strings.HasPrefix(l.text, "data:e"):
				got++
				lastData = l.at
			case l.text == ":\n":
				if got < sent {
					t.Fatalf("a keep-alive comment after %d of %d events, while the stream was busy", got, sent)
				}
				if quiet := l.at.Sub(lastData); quiet < keepAlive-200*time.Millisecond {
					t.Fatalf("keep-alive comment %v after the last event, the interval is %v", quiet, keepAlive)
				}
				return
			}
		case <-deadline:
			t.Fatalf("no keep-alive comment after the stream went quiet (%d of %d events seen)", got, sent)
		}
	}
}

// The shutdown of the http.Server ends the subscriptions it handed over at once.
func TestSSEShutdownEndsParkedSubscriptions(t *testing.T) {
	eng := engine.NewMemory(0)
	t.Cleanup(func() { eng.Close() })
	srv := New(eng, Config{ClusterID: "c"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	base := "http://" + ln.Addr().String()
	expect(t, do(t, "PUT", base+"/bkt1/sd", "x", "Content-Type", "text/plain"), 201, "")
	c := subscribe(t, base+"/bkt1/sd?offset=-1&live=sse")
	c.nextData(t)
	waitFor(t, "parked", func() bool { p, _ := parkedCount(srv); return p == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c.res.Body)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription outlived the shutdown")
	}
	waitFor(t, "no live readers", func() bool { return srv.live.Load() == 0 })
}

// Over HTTP/1.0 there is no chunked framing to continue: the subscription waits in its
// handler, as before, and still gets appends.
func TestSSEHTTP10WaitsInHandler(t *testing.T) {
	ts := newTestServer(t)
	s := ts.URL + "/bkt1/old"
	expect(t, do(t, "PUT", s, "", "Content-Type", "text/plain"), 201, "")
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /bkt1/old?offset=-1&live=sse HTTP/1.0\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("answer %v %v", err, res)
	}
	rd := streamcore.NewSSEReader(res.Body)
	if ev, err := rd.Next(); err != nil || ev.Type != "control" {
		t.Fatalf("first event %+v %v", ev, err)
	}
	expect(t, do(t, "POST", s, "hello", "Content-Type", "text/plain"), 204, "")
	ev, err := rd.Next()
	if err != nil || ev.Type != "data" || !strings.Contains(string(ev.Data), "hello") {
		t.Fatalf("live event %+v %v", ev, err)
	}
}

// A parked reader whose client closed the connection is found by the sweep, long before
// the keep-alive write (15 s by default, and the first write after the close succeeds).
func TestSSEGoneReaderFoundBySweep(t *testing.T) {
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "c", Limits: Limits{SSEKeepAlive: time.Hour}})
	srv.sse.sweepEvery = 100 * time.Millisecond
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); eng.Close() })
	s := ts.URL + "/bkt1/gone"
	expect(t, do(t, "PUT", s, "x", "Content-Type", "text/plain"), 201, "")
	c := subscribe(t, s+"?offset=-1&live=sse")
	c.nextData(t)
	waitFor(t, "parked", func() bool { p, _ := parkedCount(srv); return p == 1 })
	c.res.Body.Close()
	waitFor(t, "the gone reader's slot freed", func() bool { _, o := parkedCount(srv); return srv.live.Load() == 0 && o == 0 })
}

// A handed-over SSE connection closes after its last chunk, so the answer says
// Connection: close: a client with a pool (a gateway) must not send its next request on
// it as it closes, where a non-idempotent request would meet a reset and fail.
func TestSSEAnswerSaysConnectionClose(t *testing.T) {
	ts := newTestServer(t)
	// One pooled client (the default one) for every request, as a gateway's.
	for i := range 20 {
		s := fmt.Sprintf("%s/bkt1/close-%d", ts.URL, i)
		created := do(t, "PUT", s, "a", "Content-Type", "text/plain")
		expect(t, created, 201, "")
		// The reader at the tail goes live (parked), then the stream closes with a last append.
		sub, err := http.Get(s + "?offset=" + created.h.Get(streamcore.HdrStreamNextOff) + "&live=sse")
		if err != nil || sub.StatusCode != 200 || !sub.Close {
			t.Fatalf("SSE answer: %v %v, Connection: close %v", err, sub, sub != nil && sub.Close)
		}
		expect(t, do(t, "POST", s, "z", "Content-Type", "text/plain", streamcore.HdrStreamClosed, "true"), 204, "")
		body, err := io.ReadAll(sub.Body)
		sub.Body.Close()
		if err != nil || !strings.Contains(string(body), "data:z") || !strings.Contains(string(body), `"streamClosed":true`) {
			t.Fatalf("SSE body %q, %v", body, err)
		}
	}
}
