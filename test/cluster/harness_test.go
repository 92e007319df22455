// Package cluster holds end-to-end tests of the raft engine with real processes: the
// ursula binary is built with `go build`, started, killed with SIGKILL and restarted;
// clients talk real HTTP. See cluster.sh for a manual 3-node loopback cluster.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ursula-cluster-test-")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "ursula")
	out, err := exec.Command("go", "build", "-o", binPath, "../../cmd/ursula").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build ursula: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// node is one ursula process.
type node struct {
	t      *testing.T
	id     int
	url    string // client listener
	admin  string // admin listener
	config string
	log    string
	args   []string // extra server flags
	dir    string   // working directory ("" = the test's)
	env    []string // extra environment variables (NAME=value)
	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
}

func (n *node) start() {
	n.t.Helper()
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(binPath, append([]string{"server", "--config", n.config}, n.args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = n.dir
	if len(n.env) > 0 {
		cmd.Env = append(os.Environ(), n.env...)
	}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
}

// kill sends SIGKILL (no graceful anything) and waits for the exit.
func (n *node) kill() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

func (n *node) waitReady(d time.Duration) {
	n.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		res, err := http.Get(n.url + "/__ursula/ready")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(n.log)
	n.t.Fatalf("node %d not ready after %v; log tail:\n%s", n.id, d, tail(string(b), 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

type groupStatus struct {
	Group    uint64 `json:"group"`
	State    string `json:"state"`
	LeaderID string `json:"leader_id"`
}

type raftStatus struct {
	NodeID     uint64        `json:"node_id"`
	GroupCount int           `json:"group_count"`
	Leading    int           `json:"leading"`
	Groups     []groupStatus `json:"groups"`
}

func (n *node) status() (raftStatus, error) {
	var st raftStatus
	res, err := http.Get(n.admin + "/__ursula/raft/status")
	if err != nil {
		return st, err
	}
	defer res.Body.Close()
	return st, json.NewDecoder(res.Body).Decode(&st)
}

// testCluster is a set of nodes sharing one config scheme.
type testCluster struct {
	t         *testing.T
	dir       string
	nodes     []*node
	raftPorts []int // each node's cluster listener
}

// clusterOpts shape the generated configs.
type clusterOpts struct {
	nodes  int
	groups int
	raft   string // extra [raft] lines
	extra  string // appended to every config (further sections: [storage.cold])
	// raftAddr returns the raft_addr node `self` uses to reach node `peer`, whose cluster
	// listener is on peerPort (a proxy in between, listening on listenPort: a port chosen
	// with the nodes' own, so that no node is given the proxy's port, nor the proxy a
	// node's); nil: the listener itself.
	raftAddr func(self, peer, peerPort, listenPort int) string
}

func newCluster(t *testing.T, o clusterOpts) *testCluster {
	t.Helper()
	dir := t.TempDir()
	c := &testCluster{t: t, dir: dir}
	httpPorts := make([]int, o.nodes)
	adminPorts := make([]int, o.nodes)
	raftPorts := make([]int, o.nodes)
	used := map[int]bool{}
	distinct := func() int { // a port just closed may be handed out again
		for {
			if p := freePort(t); !used[p] {
				used[p] = true
				return p
			}
		}
	}
	for i := range o.nodes {
		httpPorts[i], raftPorts[i], adminPorts[i] = distinct(), distinct(), distinct()
	}
	c.raftPorts = raftPorts
	for i := range o.nodes {
		var b strings.Builder
		fmt.Fprintf(&b, "[server]\nadmin_listen = \"127.0.0.1:%d\"\n", adminPorts[i])
		fmt.Fprintf(&b, "listen = \"127.0.0.1:%d\"\ndata_dir = %q\ncluster_id = \"test-cluster\"\nengine = \"raft\"\n", httpPorts[i], filepath.Join(dir, fmt.Sprintf("node%d", i+1)))
		if o.nodes > 1 {
			fmt.Fprintf(&b, "cluster_listen = \"127.0.0.1:%d\"\n", raftPorts[i])
		}
		fmt.Fprintf(&b, "\n[raft]\nnode_id = %d\ngroup_count = %d\ninit_membership_per_group = true\n%s\n", i+1, o.groups, o.raft)
		if o.nodes > 1 {
			for j := range o.nodes {
				addr := fmt.Sprintf("127.0.0.1:%d", raftPorts[j])
				if o.raftAddr != nil && i != j {
					addr = o.raftAddr(i, j, raftPorts[j], distinct())
				}
				fmt.Fprintf(&b, "\n[[raft.peers]]\nnode_id = %d\nurl = \"http://127.0.0.1:%d\"\nraft_addr = %q\n", j+1, httpPorts[j], addr)
			}
		}
		b.WriteString("\n" + o.extra + "\n")
		cfg := filepath.Join(dir, fmt.Sprintf("node%d.toml", i+1))
		if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &node{t: t, id: i + 1, url: fmt.Sprintf("http://127.0.0.1:%d", httpPorts[i]), admin: fmt.Sprintf("http://127.0.0.1:%d", adminPorts[i]), config: cfg, log: filepath.Join(dir, fmt.Sprintf("node%d.log", i+1))})
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.kill()
		}
		if t.Failed() {
			for _, n := range c.nodes {
				b, _ := os.ReadFile(n.log)
				t.Logf("node %d log tail:\n%s", n.id, tail(string(b), 2000))
			}
		}
	})
	return c
}

func (c *testCluster) startAll() {
	for _, n := range c.nodes {
		n.start()
	}
	for _, n := range c.nodes {
		n.waitReady(30 * time.Second)
	}
}

// leaderOf returns the node id leading group (0 if the nodes disagree or none is known).
func (c *testCluster) leaderOf(group uint64, from *node) int {
	st, err := from.status()
	if err != nil || int(group) >= len(st.Groups) {
		return 0
	}
	var id int
	fmt.Sscan(st.Groups[group].LeaderID, &id)
	return id
}

// hdrIncarnation pins an admin mutation to one run of the node's process.
const hdrIncarnation = "X-Ursula-Process-Incarnation"

// processIncarnation reads the process_incarnation of the node whose admin plane is at base.
func processIncarnation(base string) (string, error) {
	res, b, err := httpDo(http.MethodGet, base+"/__ursula/metrics", nil, nil)
	if err != nil {
		return "", err
	}
	var m struct {
		Incarnation string `json:"process_incarnation"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &m) != nil || m.Incarnation == "" {
		return "", fmt.Errorf("metrics of %s: %d %s", base, res.StatusCode, b)
	}
	return m.Incarnation, nil
}

func httpDo(method, url string, body []byte, hdr map[string]string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if strings.Contains(url, "/__ursula/") {
		req.Header.Set("X-Ursula-Admin", "1") // admin mutations must be explicit
		if _, pinned := hdr[hdrIncarnation]; !pinned && method != http.MethodGet && method != http.MethodHead {
			// and pinned to the process the node runs now, read from its metrics
			// (a map entry, even an empty one, is the test's own choice).
			inc, err := processIncarnation(req.URL.Scheme + "://" + req.URL.Host)
			if err != nil {
				return nil, nil, err
			}
			req.Header.Set(hdrIncarnation, inc)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req = req.WithContext(ctx)
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := cl.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, b, err
}
