package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// TestApplyFailureRealProcesses (checklist-ops I): on 3 real nodes, node 3 restarts with
// the test-only fault URSULA_TEST_APPLY_FAULT armed on the next entry of one group. That
// group stops on node 3 only: its stream answers 503 APPLY_STOPPED there, the stream of
// the other group keeps serving on node 3, and the group keeps taking appends through
// the other nodes. `ursula ctl status` shows the stop, `ursula ctl restart-group` resumes
// the group (the fault fires once), and node 3's copy of the stream then equals the
// leader's: no entry was skipped.
func TestApplyFailureRealProcesses(t *testing.T) {
	const groups = 2
	c := newCluster(t, clusterOpts{nodes: 3, groups: groups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := client.New("", client.WithTimeouts(5*time.Second, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a, b := "afault/a", "afault/b0"
	ga := fnvGroup(a, groups)
	for i := 1; fnvGroup(b, groups) == ga; i++ {
		b = fmt.Sprintf("afault/b%d", i)
	}
	seq := map[string]uint64{}
	appendTo := func(key, rec string) {
		t.Helper()
		s := seq[key]
		seq[key]++
		if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
			return cl.Append(ctx, n.url+"/"+key, []byte(rec), client.AppendOptions{ContentType: "text/plain",
				Producer: &client.ProducerKey{ID: "af", Epoch: 0, Seq: s}})
		}); err != nil {
			t.Fatalf("append %s to %s: %v", rec, key, err)
		}
	}
	for _, k := range []string{a, b} {
		if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
			return cl.Create(ctx, n.url+"/"+k, client.CreateOptions{ContentType: "text/plain"})
		}); err != nil {
			t.Fatalf("create %s: %v", k, err)
		}
	}
	appendTo(a, "a0;")
	appendTo(b, "b0;")
	n3 := c.nodes[2]
	converge(t, cl, n3.url+"/"+a, "a0;")
	converge(t, cl, n3.url+"/"+b, "b0;")

	// Node 3 restarts with the fault armed on the first entry of group ga after its log.
	var st struct {
		Groups []struct {
			LastIndex uint64 `json:"last_index"`
		} `json:"groups"`
	}
	res, body, err := httpDo(http.MethodGet, n3.admin+"/__ursula/raft/status", nil, nil)
	if err != nil || res.StatusCode != http.StatusOK || json.Unmarshal(body, &st) != nil || len(st.Groups) != groups {
		t.Fatalf("status of node 3: %v %s", err, body)
	}
	n3.kill()
	n3.env = []string{fmt.Sprintf("URSULA_TEST_APPLY_FAULT=%d:%d:once", ga, st.Groups[ga].LastIndex+1)}
	n3.start()
	n3.waitReady(60 * time.Second)
	appendTo(a, "a1;")

	// The group stops on node 3: its stream answers 503 APPLY_STOPPED there.
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := cl.Read(ctx, n3.url+"/"+a, client.ReadOptions{Offset: "-1"})
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status == http.StatusServiceUnavailable && ce.Code == "APPLY_STOPPED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 did not stop group %d: last read %v", ga, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The other group keeps serving on node 3, and group ga on the other nodes.
	if rr, err := cl.Read(ctx, n3.url+"/"+b, client.ReadOptions{Offset: "-1"}); err != nil || string(rr.Data) != "b0;" {
		t.Fatalf("read of the other group on node 3: %v", err)
	}
	if _, err := cl.Append(ctx, n3.url+"/"+b, []byte("b1;"), client.AppendOptions{ContentType: "text/plain",
		Producer: &client.ProducerKey{ID: "af", Epoch: 0, Seq: seq[b]}}); err != nil {
		t.Fatalf("append to the other group through node 3: %v", err)
	}
	seq[b]++
	appendTo(a, "a2;")
	if out := ctlRun(t, n3.admin, "status"); !strings.Contains(out, "STOPPED at") {
		t.Fatalf("ursula ctl status does not show the stopped group:\n%s", out)
	}
	if out := ctlRun(t, n3.admin, "restart-group", fmt.Sprint(ga)); !strings.Contains(out, "resumed") {
		t.Fatalf("restart-group: %s", out)
	}
	appendTo(a, "a3;")
	lr, err := cl.Read(ctx, c.nodes[0].url+"/"+a, client.ReadOptions{Offset: "-1", Consistency: "leader"})
	if err != nil || string(lr.Data) != "a0;a1;a2;a3;" {
		t.Fatalf("leader read: %v", err)
	}
	for _, n := range c.nodes {
		converge(t, cl, n.url+"/"+a, "a0;a1;a2;a3;")
		converge(t, cl, n.url+"/"+b, "b0;b1;")
	}
	if out := ctlRun(t, n3.admin, "status"); strings.Contains(out, "STOPPED at") {
		t.Fatalf("still stopped after the restart:\n%s", out)
	}
}
