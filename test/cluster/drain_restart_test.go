package cluster

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

type drainStatus struct {
	DrainMark bool `json:"drain_mark"`
	Leading   int  `json:"leading"`
}

func (n *node) drainStatus() (drainStatus, error) {
	var st drainStatus
	res, err := http.Get(n.admin + "/__ursula/raft/status")
	if err != nil {
		return st, err
	}
	defer res.Body.Close()
	return st, json.NewDecoder(res.Body).Decode(&st)
}

func waitFor(t *testing.T, what string, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The drain mark survives a kill -9 and a restart (the node comes back drained and leads
// nothing), undrain clears it and the balancer gives the node leaderships again. A node
// removed while it was down learns it when it comes back: it answers ready 503 "removed",
// and refuses to start as a member again.
func TestDrainMarkRestartAndRemovedWhileDown(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: 4, raft: "heartbeat_timeout_ms = 500\nleader_balance_interval = \"1s\""})
	c.startAll()
	n2, n3 := c.nodes[1], c.nodes[2]
	ctlRun(t, n2.admin, "drain")
	waitFor(t, "node 2 to lead nothing", 30*time.Second, func() bool {
		st, err := n2.drainStatus()
		return err == nil && st.DrainMark && st.Leading == 0
	})
	n2.kill()
	n2.start()
	n2.waitReady(60 * time.Second)
	st, err := n2.drainStatus()
	if err != nil || !st.DrainMark {
		t.Fatalf("the drain mark did not survive the restart: %+v %v", st, err)
	}
	waitFor(t, "the restarted drained node to lead nothing", 30*time.Second, func() bool {
		st, err := n2.drainStatus()
		return err == nil && st.Leading == 0
	})
	ctlRun(t, n2.admin, "undrain")
	waitFor(t, "the balancer to give node 2 a leadership", 60*time.Second, func() bool {
		st, err := n2.drainStatus()
		return err == nil && !st.DrainMark && st.Leading > 0
	})

	// Removal while down.
	n3.kill()
	ctlRun(t, c.nodes[0].admin, "members", "remove", "3")
	n3.start()
	waitFor(t, "node 3 to report its removal", 60*time.Second, func() bool {
		res, err := http.Get(n3.url + "/__ursula/ready")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		var r struct {
			Reason string `json:"reason"`
		}
		json.NewDecoder(res.Body).Decode(&r)
		return res.StatusCode == http.StatusServiceUnavailable && r.Reason == "removed"
	})
	n3.kill()
	n3.start()
	n3.mu.Lock()
	done := n3.done
	n3.mu.Unlock()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a removed node started again as a member")
	}
	b, _ := os.ReadFile(n3.log)
	if !strings.Contains(string(b), "cannot start as a member again") {
		t.Fatalf("no clear refusal in the log:\n%s", tail(string(b), 1500))
	}
	for _, n := range c.nodes[:2] {
		n.waitReady(30 * time.Second)
	}
}
