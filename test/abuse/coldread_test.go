package abuse

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"
)

// TestColdReadersThatNeverRead: readers of a stream that lies in the cold tier, which
// send their GET and never read the answer, hold a bounded amount of memory: each read
// assembles at most limits.cold_read_size of cold bytes, and all of them together at most
// limits.inflight_cold_read_size (past it, 503 COLD_READ_BACKPRESSURE). Before these
// bounds, 40 such readers of a 16 MiB stream grew the node by about 410 MiB.
func TestColdReadersThatNeverRead(t *testing.T) {
	n := startConfig(t, t.TempDir(), `
[limits]
write_timeout = "5s"
inflight_cold_read_size = 16777216

[storage.cold]
flush_size = "1MiB"
flush_interval = "100ms"
flush_max_hot_age = "1s"
`)
	u := n.url + "/abuse/cold"
	do(t, "PUT", u, nil, "Content-Type", "application/octet-stream")
	block := bytes.Repeat([]byte("z"), 1<<20)
	for i := 0; i < 16; i++ {
		if res, b := do(t, "POST", u, block, "Content-Type", "application/octet-stream"); res.StatusCode/100 != 2 {
			t.Fatalf("append: %d %s", res.StatusCode, b)
		}
	}
	// Wait (bounded) until most of the stream is in the cold tier.
	for i := 0; ; i++ {
		res, _ := do(t, "HEAD", u, nil)
		hot, _ := strconv.ParseInt(res.Header.Get("Stream-Cold-Hot-Start-Offset"), 10, 64)
		if hot >= 12<<20 {
			break
		}
		if i == 300 {
			t.Fatalf("the stream did not reach the cold tier (hot start %d)", hot)
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := n.rssBytes(t)
	// 40 readers at different cold offsets, each asking for the most a read returns.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 40; i++ {
		off := uint64(i) * (300 << 10) % (12 << 20)
		c := rawConn(t, n.addr, "")
		c.(*net.TCPConn).SetReadBuffer(4 << 10)
		fmt.Fprintf(c, "GET /abuse/cold?offset=%020d HTTP/1.1\r\nHost: x\r\n\r\n", off)
		conns = append(conns, c)
	}
	// Wait (bounded) until every reader was answered, into its socket buffers or still
	// held by the node, then measure. Each answer is one cold read of 1 MiB.
	var held int64
	for i := 0; ; i++ {
		_, b := do(t, "GET", n.url+"/__ursula/metrics", nil)
		var m struct {
			Held int64 `json:"cold_read_bytes_held"`
			Read int64 `json:"read_bytes_total"`
		}
		json.Unmarshal(b, &m)
		held = max(held, m.Held)
		if m.Read+m.Held >= 40<<20 {
			break
		}
		if i == 300 {
			t.Fatalf("the stalled readers were not answered: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	during := n.rssBytes(t)
	n.served(t, "cold-during")
	if held > 16<<20 {
		t.Fatalf("stalled readers hold %d cold bytes with a budget of 16 MiB", held)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	n.alive(t)
	t.Logf("RSS before %d MiB, with 40 stalled cold readers %d MiB (%d MiB of cold bytes held)", before>>20, during>>20, held>>20)
	if during-before > 128<<20 {
		t.Fatalf("40 stalled cold readers grew RSS by %d MiB", (during-before)>>20)
	}
	n.served(t, "cold-after")
}
