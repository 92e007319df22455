package cluster

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// specClusterConfig is the spec's 3-node example (Deploy a Cluster, bare metal): one
// port per node, [[raft.peers]] with node_id and url only, started with
// `ursula --config FILE --node-id N`. Changed for a loopback test: addresses and ports
// (the example's nodes share one file on three hosts; here each listens on its own port),
// the WAL path, and the cold store (the example's S3 bucket is swapped for an fs
// directory the three nodes share; no traffic leaves the machine).
const specClusterConfig = `[server]
listen = "127.0.0.1:%[6]d"

[raft]
group_count = 256
init_membership_per_group = true

[raft.wal]
path = %[4]q

[storage.cold]
backend = "fs"
root = "ursula-prod"
dir = %[5]q

[[raft.peers]]
node_id = 1
url = "http://127.0.0.1:%[1]d"

[[raft.peers]]
node_id = 2
url = "http://127.0.0.1:%[2]d"

[[raft.peers]]
node_id = 3
url = "http://127.0.0.1:%[3]d"
`

// portPair finds a free port whose successor is free too (the admin listener defaults to
// the client port + 1).
func portPair(t *testing.T, used map[int]bool) int {
	for range 100 {
		p := freePort(t)
		if used[p] || used[p+1] {
			continue
		}
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1)); err == nil {
			ln.Close()
			used[p], used[p+1] = true, true
			return p
		}
	}
	t.Fatal("no free pair of ports")
	return 0
}

// TestSpecThreeNodeConfig: three processes started from the spec's example config (only
// addresses, ports and paths changed) form a cluster whose Raft rides on the client
// listeners, replicate writes, and keep every acknowledged append across a kill -9 of
// the stream's leader. (256 groups as in the example: about a minute on a loaded machine.)
func TestSpecThreeNodeConfig(t *testing.T) {
	dir := t.TempDir()
	used := map[int]bool{}
	var ports []int
	for range 3 {
		ports = append(ports, portPair(t, used))
	}
	cold := filepath.Join(dir, "cold")
	var nodes []*node
	for i := range 3 {
		nd := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(nd, "ursula.toml")
		body := fmt.Sprintf(specClusterConfig, ports[0], ports[1], ports[2], filepath.Join(nd, "wal"), cold, ports[i])
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, &node{t: t, id: i + 1, dir: nd, config: cfg, log: filepath.Join(nd, "log"),
			url: fmt.Sprintf("http://127.0.0.1:%d", ports[i]), admin: fmt.Sprintf("http://127.0.0.1:%d", ports[i]+1),
			args: []string{"--node-id", fmt.Sprint(i + 1)}})
	}
	c := &testCluster{t: t, dir: dir, nodes: nodes}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.kill()
		}
		if t.Failed() {
			for _, n := range nodes {
				b, _ := os.ReadFile(n.log)
				t.Logf("node %d log tail:\n%s", n.id, tail(string(b), 2000))
			}
		}
	})
	for _, n := range nodes {
		n.start()
	}
	for _, n := range nodes {
		n.waitReady(90 * time.Second)
	}
	if b, _ := os.ReadFile(nodes[0].log); !strings.Contains(string(b), "voters=3") {
		t.Fatalf("node 1 did not start as one of 3 voters:\n%s", tail(string(b), 2000))
	}

	key := "spec/s1"
	g := fnvGroup(key, 256)
	leaderOf := func(from []*node) *node {
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			for _, n := range from {
				if id := c.leaderOf(g, n); id != 0 {
					for _, m := range from {
						if m.id == id {
							return m
						}
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("no leader of group %d among the live nodes", g)
		return nil
	}
	L := leaderOf(nodes)
	if res, b := follow(t, http.MethodPut, L.url+"/"+key, nil, "Content-Type", "text/plain"); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	var want strings.Builder
	add := func(base string, i int) {
		rec := fmt.Sprintf("rec %d;", i)
		if res, b := follow(t, http.MethodPost, base+"/"+key, []byte(rec), "Content-Type", "text/plain"); res.StatusCode != http.StatusNoContent {
			t.Fatalf("append %d: %d %s", i, res.StatusCode, b)
		}
		want.WriteString(rec)
	}
	for i := range 20 {
		add(L.url, i)
	}
	var live []*node
	for _, n := range nodes {
		if n != L {
			live = append(live, n)
		}
	}
	L.kill()
	NL := leaderOf(live)
	for i := 20; i < 30; i++ {
		add(NL.url, i)
	}
	for _, n := range live {
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := readFrom(n.url+"/"+key, "-1")
			if err == nil && string(got) == want.String() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d after the leader's kill -9: %v %q, want %q", n.id, err, got, want.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
