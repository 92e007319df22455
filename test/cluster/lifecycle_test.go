package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// ctlRun runs `ursula ctl --node ADMIN args...` and returns its stdout; it fails the test
// on a non-zero exit.
func ctlRun(t *testing.T, admin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"ctl", "--node", admin, "--timeout", "2m"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ursula ctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// joiner writes the config of a new node that joins with --join: its own node id and
// ports, no peer list.
func (c *testCluster) joiner(id int) *node {
	t := c.t
	hp, ap, rp := freePort(t), freePort(t), freePort(t)
	cfg := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:%d\"\nadmin_listen = \"127.0.0.1:%d\"\ncluster_listen = \"127.0.0.1:%d\"\ndata_dir = %q\nengine = \"raft\"\n\n[raft]\nnode_id = %d\nheartbeat_timeout_ms = 500\n",
		hp, ap, rp, filepath.Join(c.dir, fmt.Sprintf("node%d", id)), id)
	path := filepath.Join(c.dir, fmt.Sprintf("node%d.toml", id))
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return &node{t: t, id: id, url: fmt.Sprintf("http://127.0.0.1:%d", hp), admin: fmt.Sprintf("http://127.0.0.1:%d", ap), config: path,
		log: filepath.Join(c.dir, fmt.Sprintf("node%d.log", id)), args: []string{"--join", c.nodes[0].url}}
}

// producers appends with idempotent producers through any of the given nodes until stop.
type producers struct {
	mu    sync.Mutex
	nodes []*node
	acked map[string][]string
	count atomic.Int64
	stop  atomic.Bool
	wg    sync.WaitGroup
}

func (p *producers) setNodes(ns []*node) { p.mu.Lock(); p.nodes = ns; p.mu.Unlock() }

func (p *producers) run(ctx context.Context, t *testing.T, cl *client.Client, keys []string) {
	for s, k := range keys {
		for w := range 2 {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				pid := fmt.Sprintf("p-%d-%d", s, w)
				for seq := uint64(0); !p.stop.Load(); seq++ {
					rec := fmt.Sprintf("%s:%d;", pid, seq)
					for i := 0; ; i++ {
						if ctx.Err() != nil {
							return // unknown outcome: not counted as acknowledged
						}
						p.mu.Lock()
						n := p.nodes[i%len(p.nodes)]
						p.mu.Unlock()
						_, err := cl.Append(ctx, n.url+"/life/"+k, []byte(rec), client.AppendOptions{ContentType: "text/plain",
							Producer: &client.ProducerKey{ID: pid, Epoch: 0, Seq: seq}})
						if err == nil {
							break
						}
						time.Sleep(50 * time.Millisecond)
					}
					p.mu.Lock()
					p.acked[k] = append(p.acked[k], rec)
					p.mu.Unlock()
					p.count.Add(1)
				}
			}()
		}
	}
}

// checkAcked: every acknowledged append is on every node once, in producer order.
func (p *producers) checkAcked(t *testing.T, cl *client.Client, keys []string, on []*node) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		lr, err := cl.Read(ctx, on[0].url+"/life/"+k, client.ReadOptions{Offset: "-1", Consistency: "leader", MaxBytes: 8 << 20})
		if err != nil {
			t.Fatalf("leader read %s: %v", k, err)
		}
		for _, n := range on {
			got := converge(t, cl, n.url+"/life/"+k, string(lr.Data))
			for _, rec := range p.acked[k] {
				if c := strings.Count(";"+got, ";"+rec); c != 1 {
					t.Fatalf("node %d %s: acknowledged %q present %d times", n.id, k, rec, c)
				}
			}
			last := map[string]int{}
			for _, part := range strings.Split(strings.TrimSuffix(got, ";"), ";") {
				pid, seqText, _ := strings.Cut(part, ":")
				seq, _ := strconv.Atoi(seqText)
				if prev, ok := last[pid]; ok && seq != prev+1 || !ok && seq != 0 {
					t.Fatalf("node %d %s: producer %s seq %d after %d", n.id, k, pid, seq, last[pid])
				}
				last[pid] = seq
			}
		}
	}
}

func createStreams(t *testing.T, ctx context.Context, cl *client.Client, c *testCluster, keys []string) {
	for _, k := range keys {
		if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
			return cl.Create(ctx, n.url+"/life/"+k, client.CreateOptions{ContentType: "text/plain"})
		}); err != nil {
			t.Fatalf("create %s: %v", k, err)
		}
	}
}

// TestReplaceNode: 3 voters under producer load. Node 3 is killed and its data wiped; a new
// node 4 joins with --join and is added with `ursula ctl members add`, node 3 is removed
// with `ursula ctl members remove`, then the leader of the busiest group is killed once
// more. Every acknowledged append is on nodes 1, 2 and 4, once and in order; the
// membership survives a restart of node 4.
func TestReplaceNode(t *testing.T) {
	const groups = 4
	c := newCluster(t, clusterOpts{nodes: 3, groups: groups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl, err := client.New("", client.WithTimeouts(5*time.Second, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"s0", "s1", "s2", "s3"}
	createStreams(t, ctx, cl, c, keys)
	p := &producers{acked: map[string][]string{}}
	p.setNodes(c.nodes)
	p.run(ctx, t, cl, keys)
	waitAcks := func(n int64) {
		for target := p.count.Load() + n; p.count.Load() < target; time.Sleep(20 * time.Millisecond) {
			if ctx.Err() != nil {
				t.Fatal("producers stalled")
			}
		}
	}
	waitAcks(50)

	n3 := c.nodes[2]
	n3.kill()
	if err := os.RemoveAll(filepath.Join(c.dir, "node3")); err != nil {
		t.Fatal(err)
	}
	p.setNodes(c.nodes[:2])
	waitAcks(50)

	n4 := c.joiner(4)
	n4.start()
	c.nodes = append(c.nodes, n4)      // cleanup kills it
	n4.waitListening(30 * time.Second) // it is not ready before it is added
	out := ctlRun(t, c.nodes[0].admin, "members", "add", "4", n4.url)
	t.Logf("members add: %s", strings.TrimSpace(out))
	out = ctlRun(t, c.nodes[1].admin, "members", "remove", "3")
	t.Logf("members remove: %s", strings.TrimSpace(out))
	n4.waitReady(60 * time.Second)
	live := []*node{c.nodes[0], c.nodes[1], n4}
	p.setNodes(live)

	var m struct {
		Nodes []struct {
			NodeID      uint64 `json:"node_id"`
			URL         string `json:"url"`
			VoterGroups int    `json:"voter_groups"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(ctlRun(t, c.nodes[0].admin, "--json", "members", "list")), &m); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range m.Nodes {
		ids = append(ids, fmt.Sprintf("%d:%d", n.NodeID, n.VoterGroups))
	}
	sort.Strings(ids)
	if want := fmt.Sprintf("[1:%d 2:%d 4:%d]", groups, groups, groups); fmt.Sprint(ids) != want {
		t.Fatalf("members after the replacement: %v, want %s", ids, want)
	}
	waitAcks(50)

	// Kill the leader of the busiest stream group once more, and restart it.
	st, err := n4.status()
	if err != nil {
		t.Fatal(err)
	}
	leader, _ := strconv.Atoi(st.Groups[groupOfN("life/s0", groups)].LeaderID)
	var victim *node
	for _, n := range live {
		if n.id == leader {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("leader %d of the stream's group is not a live member", leader)
	}
	t.Logf("killing leader node %d", victim.id)
	victim.kill()
	waitAcks(50)
	victim.start()
	for _, n := range live {
		n.waitReady(60 * time.Second)
	}
	waitAcks(20)
	p.stop.Store(true)
	p.wg.Wait()
	t.Logf("%d acknowledged appends", p.count.Load())
	p.checkAcked(t, cl, keys, live)
}

func groupOfN(key string, n uint64) uint64 { return fnvGroup(key, n) }

// waitListening waits until the node answers on its client listener (ready or not).
func (n *node) waitListening(d time.Duration) {
	n.t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if res, _, err := httpDo("GET", n.url+"/__ursula/metrics", nil, nil); err == nil && res.StatusCode == 200 {
			return
		}
	}
	b, _ := os.ReadFile(n.log)
	n.t.Fatalf("node %d does not listen; log tail:\n%s", n.id, tail(string(b), 3000))
}

// TestRecoveryGateAfterLostTail: a node stops uncleanly and loses the unsynced tail of its
// journal (fsync=never plus truncation of its newest segment while it is down, as a host
// crash would). Restarted next to one other survivor, it refuses every vote, so no group
// elects a leader with two of three nodes; its readiness says recovery_gate_closed. Once
// the third node returns, it catches up, its gates open and every acknowledged write is on
// every node.
func TestRecoveryGateAfterLostTail(t *testing.T) {
	const groups = 2
	c := newCluster(t, clusterOpts{nodes: 3, groups: groups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := client.New("", client.WithTimeouts(5*time.Second, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"g0", "g1", "g2", "g3"}
	createStreams(t, ctx, cl, c, keys)
	p := &producers{acked: map[string][]string{}}
	p.setNodes(c.nodes)
	p.run(ctx, t, cl, keys)
	for p.count.Load() < 300 {
		time.Sleep(20 * time.Millisecond)
	}
	p.stop.Store(true)
	p.wg.Wait()

	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	n3.kill()
	segs, _ := filepath.Glob(filepath.Join(c.dir, "node3", "wal", "*.seg"))
	if len(segs) == 0 {
		segs, _ = filepath.Glob(filepath.Join(c.dir, "node3", "wal", "*", "*.seg"))
	}
	sort.Strings(segs)
	if len(segs) == 0 {
		t.Fatal("no journal segment for node 3")
	}
	last := segs[len(segs)-1]
	fi, err := os.Stat(last)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(last, fi.Size()*2/3); err != nil {
		t.Fatal(err)
	}
	t.Logf("truncated %s from %d to %d bytes", filepath.Base(last), fi.Size(), fi.Size()*2/3)
	n2.kill()
	// Alone, node 1 steps down in every group (a gated node may follow a live leader and
	// catch up from it: that is the way out of the gate, not what this test looks at).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, err := n1.status(); err == nil && st.Leading == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node 1 still leads alone")
		}
	}
	n3.start()
	// Node 1 campaigns; node 3 refuses its votes in every group.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var rec struct {
			Groups []struct {
				Gate         string `json:"recovery_gate"`
				RefusedVotes uint64 `json:"gate_refused_votes"`
			} `json:"groups"`
		}
		res, body, err := httpDo("GET", n3.admin+"/__ursula/recovery", nil, nil)
		refusedAll := err == nil && res.StatusCode == 200 && json.Unmarshal(body, &rec) == nil && len(rec.Groups) == groups
		for _, g := range rec.Groups {
			if g.Gate != "closed" {
				t.Fatalf("node 3's gate opened without a leader: %s", body)
			}
			refusedAll = refusedAll && g.RefusedVotes > 0
		}
		if refusedAll {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 refused no votes: %v %s", err, body)
		}
	}
	if st, err := n1.status(); err != nil || st.Leading != 0 {
		t.Fatalf("node 1 leads %d groups with only a gated node 3 beside it (%v)", st.Leading, err)
	}
	res, body, err := httpDo("GET", n3.url+"/__ursula/ready", nil, nil)
	if err != nil || res.StatusCode != 503 || !strings.Contains(string(body), "recovery_gate_closed") {
		t.Fatalf("node 3 readiness while gated: %v %v %s", err, res, body)
	}
	n2.start()
	for _, n := range c.nodes {
		n.waitReady(60 * time.Second)
	}
	p.checkAcked(t, cl, keys, c.nodes)
}
