package cluster

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestKill9KeepsAcknowledgedAppends: one node on the raft engine (single voter, node log
// with fsync=never, raft snapshots forced often). Concurrent writers append; the process is
// SIGKILLed while they run, restarted, and every append acknowledged before the kill reads
// back exactly once, in each writer's order. A process crash loses nothing under
// fsync=never: written pages live in the kernel's page cache. Two rounds, so the second
// restart also recovers what the first one replayed.
func TestKill9KeepsAcknowledgedAppends(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 1, groups: 8, raft: "snapshot_threshold = 200\ntrailing_logs = 50"})
	n := c.nodes[0]
	n.start()
	n.waitReady(20 * time.Second)
	const streams, writers = 4, 3
	for s := range streams {
		res, _, err := httpDo(http.MethodPut, fmt.Sprintf("%s/killnine/stream%d", n.url, s), nil, map[string]string{"Content-Type": "text/plain"})
		if err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("create: %v %v", err, res)
		}
	}
	var mu sync.Mutex
	acked := map[string][]string{} // stream -> acknowledged records, in ack order per writer
	next := map[[2]int]int{}
	for round := range 2 {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for s := range streams {
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						i := next[[2]int{s, w}]
						mu.Unlock()
						rec := fmt.Sprintf("w%d-%d;", w, i)
						res, _, err := httpDo(http.MethodPost, fmt.Sprintf("%s/killnine/stream%d", n.url, s), []byte(rec), map[string]string{"Content-Type": "text/plain"})
						if err != nil {
							return // the process died: outcome unknown, not counted
						}
						if res.StatusCode == http.StatusNoContent {
							mu.Lock()
							acked[fmt.Sprintf("stream%d", s)] = append(acked[fmt.Sprintf("stream%d", s)], rec)
							next[[2]int{s, w}] = i + 1
							mu.Unlock()
						}
					}
				}()
			}
		}
		time.Sleep(1500 * time.Millisecond)
		n.kill()
		close(stop)
		wg.Wait()
		n.start()
		n.waitReady(30 * time.Second)
		total := 0
		for s := range streams {
			key := fmt.Sprintf("stream%d", s)
			res, body, err := httpDo(http.MethodGet, fmt.Sprintf("%s/killnine/%s?offset=-1", n.url, key), nil, nil)
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("round %d read %s: %v %v", round, key, err, res)
			}
			got := string(body)
			mu.Lock()
			recs := acked[key]
			mu.Unlock()
			total += len(recs)
			for _, rec := range recs {
				if k := strings.Count(got, rec); k != 1 {
					t.Fatalf("round %d %s: acknowledged %q present %d times", round, key, rec, k)
				}
			}
			// Per writer, records appear in sequence order with no gaps before the last ack.
			for w := range writers {
				last := -1
				for _, part := range strings.Split(got, ";") {
					var ww, i int
					if _, err := fmt.Sscanf(part, "w%d-%d", &ww, &i); err == nil && ww == w {
						if i != last+1 {
							t.Fatalf("round %d %s writer %d: record %d after %d", round, key, w, i, last)
						}
						last = i
					}
				}
				// An unacknowledged write may have applied (its answer was lost): the next
				// round's writer continues after it.
				mu.Lock()
				if last+1 > next[[2]int{s, w}] {
					next[[2]int{s, w}] = last + 1
				}
				mu.Unlock()
			}
		}
		if total < 20 {
			t.Fatalf("round %d: only %d appends acknowledged; the test proves little", round, total)
		}
		t.Logf("round %d: %d acknowledged appends survived kill -9", round, total)
	}
}
