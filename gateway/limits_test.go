package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// A sender that stalls within its body gets 408 BODY_TOO_SLOW, nothing reaches the node,
// and other clients are served meanwhile.
func TestGatewaySlowBodyTooSlow(t *testing.T) {
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) {})
	_, gw := startGateway(t, Config{BodyIdleTimeout: 300 * time.Millisecond, BodyMinRate: -1}, node.URL)
	c, err := net.Dial("tcp", strings.TrimPrefix(gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /b/s HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nabc")
	if res, _ := do(t, "POST", gw+"/b/s", "", []byte("fast")); res.StatusCode != 200 {
		t.Fatalf("a fast client next to the slow one: %d", res.StatusCode)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusRequestTimeout || !bytes.Contains(b, []byte(streamcore.CodeBodyTooSlow)) || !marked(res) {
		t.Fatalf("slow body: %d %v %s", res.StatusCode, res.Header, b)
	}
	if n := len(node.requests()); n != 1 {
		t.Fatalf("node saw %d requests, want only the fast one", n)
	}
}

// An upstream that takes a request and never answers gets the client a 504
// UPSTREAM_TIMEOUT (unmarked: the write may have been applied); live reads are exempt.
func TestGatewayUpstreamResponseHeaderTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }() // read nothing, answer nothing
		}
	}()
	_, gw := startGateway(t, Config{UpstreamResponseHeaderTimeout: 300 * time.Millisecond}, "http://"+ln.Addr().String())
	res, b := do(t, "POST", gw+"/b/s", "", []byte("x"))
	if res.StatusCode != http.StatusGatewayTimeout || !bytes.Contains(b, []byte(CodeUpstreamTimeout)) ||
		res.Header.Get(streamcore.HdrNotApplied) != "" || res.Header.Get(streamcore.HdrNotAppliedChecked) != "1" {
		t.Fatalf("silent upstream: %d %v %s", res.StatusCode, res.Header, b)
	}
	// A long-poll waits for data by design: still waiting when the client gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", gw+"/b/s?offset=-1&live=long-poll", nil)
	res, err = http.DefaultClient.Do(req)
	if err == nil {
		res.Body.Close()
		t.Fatalf("live read answered %d; want it still waiting", res.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

// A client that stops reading an answer is disconnected after WriteTimeout, and the
// upstream exchange ends with it instead of waiting on the client.
func TestGatewayWriteTimeout(t *testing.T) {
	ended := make(chan error, 1)
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for range 256 {
			if _, err := w.Write(chunk); err != nil {
				ended <- err
				return
			}
		}
		ended <- nil
	})
	_, gw := startGateway(t, Config{WriteTimeout: 300 * time.Millisecond}, node.URL)
	c, err := net.Dial("tcp", strings.TrimPrefix(gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /b/s?offset=-1 HTTP/1.1\r\nHost: gw\r\n\r\n") // and never read
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the node sent 256 MiB to a client that reads nothing")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the gateway still relays to a client that stopped reading")
	}
}

// A chunked body cut before its last chunk (its reader ends in io.ErrUnexpectedEOF) is
// refused, not taken for the whole body: forwarded, the node would append the part that
// came. (Over a real connection the cut also cancels the request's context, which stops
// the forward today; the body read must not depend on that.)
func TestGatewayCutChunkedBodyRefused(t *testing.T) {
	g, _ := startGateway(t, Config{}, newFakeNode(t, func(w http.ResponseWriter, r *http.Request) {}).URL)
	for _, n := range []int{10, bodyStep, bodyStep + 5, 3 * bodyStep} {
		r := httptest.NewRequest("POST", "/b/s", io.MultiReader(bytes.NewReader(make([]byte, n)), cutReader{}))
		r.ContentLength = -1
		body, charged, e := g.readBody(r, 1<<30, 1<<30)
		g.bodyUsed.Add(-charged)
		if e == nil || e.Status != http.StatusBadRequest {
			t.Fatalf("a chunked body cut after %d bytes: %d bytes read, refusal %v", n, len(body), e)
		}
	}
}

type cutReader struct{}

func (cutReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
