package server

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// TestColdReadShort: a catch-up read that starts in the cold tier answers at most
// Limits.ColdReadBytes, with the Stream-Next-Offset to read on from, and reading on
// returns every byte.
func TestColdReadShort(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 256 << 10, hotCap: 8 << 20})
	env.create("/bkt1/short", "application/octet-stream")
	const total = 3<<20 + 777
	env.appendAll("/bkt1/short", 0, total, 500_000)
	if err := env.srv.FlushCold(false); err != nil {
		t.Fatal(err)
	}
	if hs := env.hotStart("bkt1/short"); hs < 2<<20 {
		t.Fatalf("hot start %d after a flush", hs)
	}
	res, body := coldDo(t, "GET", env.url("/bkt1/short?offset=-1"), nil)
	if res.StatusCode != 200 || len(body) != DefaultColdReadBytes || res.Header.Get(streamcore.HdrStreamUpToDate) != "" {
		t.Fatalf("first cold read: %d, %d bytes (want a short read of %d)", res.StatusCode, len(body), DefaultColdReadBytes)
	}
	env.readFrom("/bkt1/short", "-1", 0, total)
}

// TestColdReadBudget: cold bytes held for a reader that does not read count against the
// node-wide budget; past it a cold read gets 503 COLD_READ_BACKPRESSURE with Retry-After,
// and once the stalled reader is gone cold reads are served again.
func TestColdReadBudget(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 1 << 20, hotCap: 64 << 20})
	// Answers (8 MiB, the read cap) bigger than the loopback socket buffers, so a reader
	// that does not read keeps its handler writing, and a budget that one such answer fills.
	env.srv.cfg.Limits.ColdReadBytes = streamcore.MaxReadBytes
	env.srv.coldReads = newColdBudget(streamcore.MaxReadBytes)
	env.create("/bkt1/budget", "application/octet-stream")
	const total = 20 << 20
	env.appendAll("/bkt1/budget", 0, total, 4<<20)
	if err := env.srv.FlushCold(false); err != nil {
		t.Fatal(err)
	}
	if hs := env.hotStart("bkt1/budget"); hs < 16<<20 {
		t.Fatalf("hot start %d after a flush", hs)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(env.ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	if _, err := c.Write([]byte("GET /bkt1/budget?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// Wait (bounded) until the stalled reader holds its cold bytes.
	for i := 0; env.srv.coldReads.inUse() == 0; i++ {
		if i == 400 {
			t.Fatal("the stalled read never took cold bytes")
		}
		time.Sleep(25 * time.Millisecond)
	}
	res, body := coldDo(t, "GET", env.url("/bkt1/budget?offset="+streamcore.FormatOffset(0)+"&max_bytes=1000"), nil)
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" || !strings.Contains(string(body), CodeColdReadBackpressure) {
		t.Fatalf("cold read past the budget: %d %v %s", res.StatusCode, res.Header, body)
	}
	// Hot reads do not need the budget.
	env.create("/bkt1/hot", "application/octet-stream")
	env.appendAll("/bkt1/hot", 0, 10, 10)
	if res, body := coldDo(t, "GET", env.url("/bkt1/hot?offset=-1"), nil); res.StatusCode != 200 || len(body) != 10 {
		t.Fatalf("hot read while the budget is full: %d %d", res.StatusCode, len(body))
	}
	c.Close()
	c = nil
	for i := 0; ; i++ {
		res, body = coldDo(t, "GET", env.url("/bkt1/budget?offset="+streamcore.FormatOffset(0)+"&max_bytes=1000"), nil)
		if res.StatusCode == 200 && len(body) == 1000 {
			break
		}
		if i == 100 {
			t.Fatalf("cold reads not served after the stalled reader left: %d %s", res.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
