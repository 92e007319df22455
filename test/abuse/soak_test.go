package abuse

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestSoakIdleConnections (make soak): 10,000 keep-alive connections that send one request
// and go silent. The node keeps serving, and the idle timeout gives their descriptors back.
func TestSoakIdleConnections(t *testing.T) {
	if !soak() {
		t.Skip("a soak: URSULA_SOAK=1 (make soak)")
	}
	n := start(t, t.TempDir(), "idle_timeout = \"5s\"\nmax_connections = 12000\nmax_live_readers = 100")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 10000; i++ {
		c, err := net.Dial("tcp", n.addr)
		if err != nil {
			t.Fatalf("connection %d: %v (raise the test's descriptor limit)", i, err)
		}
		c.Write([]byte("GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n"))
		conns = append(conns, c)
	}
	n.served(t, "soak-idle")
	for i := 0; n.fds(t) > 1000; i++ {
		if i == 600 {
			t.Fatalf("%d descriptors still open long after the idle timeout", n.fds(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.alive(t)
	n.served(t, "soak-idle-after")
}

// TestSoakSlowLoris (make soak): 1,000 connections that never finish their headers are all
// closed by the header timeout while a normal client is served.
func TestSoakSlowLoris(t *testing.T) {
	if !soak() {
		t.Skip("a soak: URSULA_SOAK=1 (make soak)")
	}
	n := start(t, t.TempDir(), `read_header_timeout = "3s"`)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 1000; i++ {
		conns = append(conns, rawConn(t, n.addr, "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX-Slow: "))
	}
	n.served(t, "soak-loris")
	for _, c := range conns {
		closedByServer(t, c, "headers never finished")
	}
	n.alive(t)
}

// TestSoakIdleStreamRSS (make soak): the resident memory 20,000 idle streams add to a real
// process, created over HTTP, on both engines (reported; fails only far above the 2 KB goal).
func TestSoakIdleStreamRSS(t *testing.T) {
	if !soak() {
		t.Skip("a soak: URSULA_SOAK=1 (make soak)")
	}
	const streams = 20000
	for _, eng := range []string{"memory", "raft"} {
		t.Run(eng, func(t *testing.T) {
			n := startConfig(t, t.TempDir(), "[server]\nengine = \""+eng+"\"\n[limits]\nfree_memory_interval = \"1s\"\nfree_memory_min_bytes = 1048576\n")
			n.served(t, "warm")
			time.Sleep(2 * time.Second)
			before := n.rssBytes(t)
			var wg sync.WaitGroup
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := w; i < streams; i += 16 {
						req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/idle-%d/s%06d", n.url, i%8, i), nil)
						req.Header.Set("Content-Type", "application/octet-stream")
						res, err := client.Do(req)
						if err != nil {
							t.Errorf("create %d: %v", i, err)
							return
						}
						io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != 201 {
							t.Errorf("create %d: %d", i, res.StatusCode)
							return
						}
					}
				}(w)
			}
			wg.Wait()
			time.Sleep(3 * time.Second) // the periodic return settles the heap
			after := n.rssBytes(t)
			per := float64(after-before) / streams
			t.Logf("%s engine: RSS %d MiB before, %d MiB with %d idle streams: %.0f bytes per stream", eng, before>>20, after>>20, streams, per)
			if per > 8<<10 {
				t.Fatalf("an idle stream costs %.0f bytes of RSS", per)
			}
		})
	}
}
