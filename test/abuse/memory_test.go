package abuse

import (
	"bytes"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// soak reports whether the long variants run (make soak).
func soak() bool { return os.Getenv("URSULA_SOAK") == "1" }

// burst sends conns concurrent bodies of size bytes each that the node holds whole at once
// (each withholds its last byte until all the others are sent) and then refuses (a JSON
// string never closed, on a JSON stream): the heap grows and shrinks, storing nothing.
func burst(t *testing.T, n *node, conns, size int) {
	t.Helper()
	body := append([]byte(`["`), bytes.Repeat([]byte("x"), size-3)...)
	var sent, wg sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < conns; i++ {
		wg.Add(1)
		sent.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", n.addr)
			if err != nil {
				sent.Done()
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			c.Write([]byte("POST /abuse/burst HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
				strconv.Itoa(size) + "\r\n\r\n"))
			c.Write(body)
			sent.Done()
			<-release
			c.Write([]byte(","))
			var buf [4096]byte
			for {
				if _, err := c.Read(buf[:]); err != nil {
					return
				}
			}
		}()
	}
	sent.Wait()
	time.Sleep(500 * time.Millisecond) // the node reads what was sent
	close(release)
	wg.Wait()
}

// rssAfterBurst runs a burst against a fresh node with the given free_memory_interval and
// returns RSS before, at the end of the burst, and after idle seconds (polled: it returns
// early once RSS is under target).
func rssAfterBurst(t *testing.T, interval string, idle time.Duration, target int64) (before, peak, after int64) {
	n := start(t, t.TempDir(), `free_memory_interval = "`+interval+`"`+"\nfree_memory_min_bytes = 16777216\n[storage.cold]\nbackend = \"none\"")
	if res, b := do(t, "PUT", n.url+"/abuse/burst", nil, "Content-Type", "application/json"); res.StatusCode/100 != 2 {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	before = n.rssBytes(t)
	conns, size := 300, 1<<20
	if soak() {
		conns, size = 1000, 4<<20
	}
	burst(t, n, conns, size)
	peak = n.rssBytes(t)
	deadline := time.Now().Add(idle)
	for {
		after = n.rssBytes(t)
		if after < target || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	n.alive(t)
	n.served(t, "after-burst")
	return before, peak, after
}

// TestMemoryReturnsAfterBurst: after a burst of 300 connections with 1 MiB bodies, the
// node gives the memory back to the OS within seconds (free_memory_interval), where the
// runtime alone keeps most of it for minutes.
func TestMemoryReturnsAfterBurst(t *testing.T) {
	const bound = 160 << 20
	b, p, a := rssAfterBurst(t, "1s", 20*time.Second, bound)
	t.Logf("free_memory_interval 1s: RSS before %d MiB, after the burst %d MiB, idle %d MiB", b>>20, p>>20, a>>20)
	if a >= bound {
		t.Fatalf("RSS stayed at %d MiB after the burst (bound %d MiB)", a>>20, bound>>20)
	}
	if !soak() {
		return
	}
	// The comparison (make soak): the same burst with the periodic return off.
	ob, op, oa := rssAfterBurst(t, "off", 5*time.Second, 0)
	t.Logf("free_memory_interval off: RSS before %d MiB, after the burst %d MiB, after 5 s idle %d MiB", ob>>20, op>>20, oa>>20)
}
