//go:build linux

package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// The read-ahead hands out exactly the bytes sent, in order, through reads smaller than
// what arrived, keeps what did not fit for the next read, and holds no spill once drained.
func TestReadAheadBytesInOrder(t *testing.T) {
	client, srvConn := tcpPair(t)
	lc := &limitedConn{Conn: srvConn, l: &ConnLimitListener{max: 1}} // as the listener wraps it
	ra := newReadAhead(lc)
	if ra == nil {
		t.Fatal("no read-ahead over a plain TCP connection")
	}
	a := ra.(*readAhead)
	srvConn.SetReadDeadline(time.Now().Add(20 * time.Second)) // a lost byte fails, not hangs
	sent := make([]byte, 4096+300)                            // a request head and a 4 KiB body, in one write
	for i := range sent {
		sent[i] = byte(i * 7)
	}
	if _, err := client.Write(sent); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 4096)
	for len(got) < len(sent) {
		n, err := ra.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("bytes differ from those sent")
	}
	if a.spill != nil {
		t.Fatal("the spill is still held after every byte was read")
	}
	// A big read goes straight to the caller's buffer.
	big := make([]byte, 3*spillSize)
	if _, err := client.Write(big[:spillSize+10]); err != nil {
		t.Fatal(err)
	}
	total := 0
	for total < spillSize+10 {
		n, err := ra.Read(big)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != spillSize+10 || a.spill != nil {
		t.Fatalf("read %d bytes (spill held: %v)", total, a.spill != nil)
	}
}

// A read-ahead read keeps the connection's deadline and end-of-stream answers.
func TestReadAheadDeadlineAndEOF(t *testing.T) {
	client, srvConn := tcpPair(t)
	ra := newReadAhead(srvConn)
	srvConn.SetReadDeadline(time.Now().Add(-time.Second))
	_, err := ra.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	srvConn.SetReadDeadline(time.Time{})
	client.Write([]byte("last"))
	client.Close()
	got, err := io.ReadAll(ra)
	if err != nil || string(got) != "last" {
		t.Fatalf("read %q, %v; want the last bytes then io.EOF", got, err)
	}
	if n, err := ra.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("after the end: %d, %v; want 0, io.EOF", n, err)
	}
}

// newWrappedServer serves srv over loopback as the node does: the connection limit and
// the JSON refusals around net/http, so plain TCP connections are read ahead.
func newWrappedServer(t *testing.T, srv http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	go hs.Serve(JSONRefusals(hs, LimitConnections(ln, 100)))
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

// Requests pipelined in one write (the next request's bytes waiting in the spill while
// the first is answered) are each answered, in order, on a read-ahead connection.
func TestReadAheadPipelinedRequests(t *testing.T) {
	eng := engine.NewMemory(0)
	t.Cleanup(func() { eng.Close() })
	addr := newWrappedServer(t, New(eng, Config{ClusterID: "c"}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := strings.Repeat("y", 4096)
	var req bytes.Buffer
	req.WriteString("PUT /bkt1/s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
	for _, seq := range []string{"0", "1", "2"} {
		req.WriteString("POST /bkt1/s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 4096\r\n" +
			"Producer-Id: p\r\nProducer-Epoch: 0\r\nProducer-Seq: " + seq + "\r\n\r\n" + body)
	}
	req.WriteString("GET /bkt1/s?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for i, want := range []int{201, 200, 200, 200, 200} {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Fatalf("answer %d: %d, want %d: %s", i, res.StatusCode, want, b)
		}
		if i == 4 && string(b) != body+body+body {
			t.Fatalf("stream holds %d bytes, want the 3 bodies", len(b))
		}
	}
}

// While its connection is marked short (an append is being answered), the library's
// background read, the only 1-byte read it makes, ends at once: with nothing read ahead it
// returns no byte and no error instead of waiting, and a byte already read ahead is
// returned as usual. Unmarked, the same read waits for data (here, until its deadline).
func TestShortConnBackgroundRead(t *testing.T) {
	client, s := tcpPair(t)
	rc := &refusalConn{Conn: s, ra: newReadAhead(s)}
	if rc.ra == nil {
		t.Fatal("no read-ahead for a loopback TCP connection")
	}
	one := make([]byte, 1)
	rc.short.Store(true)
	s.SetReadDeadline(time.Now().Add(5 * time.Second)) // a wait ends in a timeout error
	if n, err := rc.Read(one); n != 0 || err != nil {
		t.Fatalf("marked, empty socket: read %d, %v; want 0, nil at once", n, err)
	}
	if _, err := client.Write([]byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	rc.short.Store(false)
	two := make([]byte, 2)
	if n, err := io.ReadFull(rc, two); n != 2 || err != nil || string(two) != "ab" {
		t.Fatalf("read %q, %v", two[:n], err)
	}
	if b := rc.ra.Buffered(); b == 0 {
		t.Skip("the kernel handed over the first two bytes alone; nothing read ahead to test")
	}
	rc.short.Store(true)
	if n, err := rc.Read(one); n != 1 || err != nil || one[0] != 'c' {
		t.Fatalf("marked, byte read ahead: read %d %q, %v; want the next byte", n, one[:n], err)
	}
	rc.short.Store(false)
	rest := make([]byte, 3)
	if n, err := io.ReadFull(rc, rest); err != nil || string(rest) != "def" {
		t.Fatalf("read %q, %v", rest[:n], err)
	}
	s.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var ne net.Error
	if n, err := rc.Read(one); n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("unmarked, empty socket: read %d, %v; want a wait ending in a timeout", n, err)
	}
}

// An append marks its connection only until its answer is written: a long-poll on the
// same keep-alive connection right after it still notices that its client went away (the
// library learns that from its background read), long before its own timeout.
func TestAppendMarkEndsWithItsAnswer(t *testing.T) {
	eng := engine.NewMemory(0)
	t.Cleanup(func() { eng.Close() })
	srv := New(eng, Config{ClusterID: "c"})
	addr := newWrappedServer(t, srv)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	exchange := func(req string, want int) {
		t.Helper()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Fatalf("%d, want %d: %s", res.StatusCode, want, b)
		}
	}
	exchange("PUT /bkt1/s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n", 201)
	for seq := range 3 {
		exchange(fmt.Sprintf("POST /bkt1/s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"+
			"Producer-Id: p\r\nProducer-Epoch: 0\r\nProducer-Seq: %d\r\n\r\nhello", seq), 200)
	}
	// A long-poll at the tail, with the longest timeout the protocol allows (60 s).
	if _, err := io.WriteString(c, "GET /bkt1/s?offset=now&live=long-poll&timeout_ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitLive := func(want int64, within time.Duration) {
		t.Helper()
		end := time.Now().Add(within)
		for srv.live.Load() != want {
			if time.Now().After(end) {
				t.Fatalf("live readers %d, want %d after %v", srv.live.Load(), want, within)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitLive(1, 10*time.Second)
	c.Close()
	waitLive(0, 20*time.Second) // a mark left on the connection: only the 60 s timeout ends it
}
