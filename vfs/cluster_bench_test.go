package vfs

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"
)

// BenchmarkCommitCluster: commit latency of a database whose URL names the three nodes of
// a loopback cluster (ursula processes on the raft engine, one group), with the stream's
// leader first in the list (leader-local) or last (leader-remote: the first commit goes
// to a follower, which names the leader, and the client keeps sending there).
//
//	go test -run '^$' -bench '^BenchmarkCommitCluster$' -benchtime 2000x ./vfs   (make bench)
func BenchmarkCommitCluster(b *testing.B) {
	quiet(b)
	nodes, admins := startLoopbackCluster(b)
	leader := nodes[clusterLeader(b, admins[0])]
	var followers []string
	for _, n := range nodes {
		if n != leader {
			followers = append(followers, n)
		}
	}
	orders := map[string][]string{
		"leader-local":  append([]string{leader}, followers...),
		"leader-remote": append(append([]string{}, followers...), leader),
	}
	for _, name := range []string{"leader-local", "leader-remote"} {
		b.Run(name, func(b *testing.B) {
			n := 0
			commitWorkloads(b, func(b *testing.B) *sql.DB {
				n++
				url := "http://" + strings.Join(orders[name], ",") + fmt.Sprintf("/bench/%s-%d", name, n)
				db, err := Open(url, Options{Path: filepath.Join(b.TempDir(), "r.db")})
				if err != nil {
					b.Fatal(err)
				}
				return withTable(b, db)
			})
		})
	}
}

// startLoopbackCluster builds cmd/ursula and runs three nodes of one cluster on loopback
// until the benchmark ends; it returns the host:port of their client and admin listeners.
func startLoopbackCluster(b *testing.B) (nodes, admins []string) {
	dir := b.TempDir()
	bin := testserver.BuildUrsula(b, dir)
	var httpAddrs, raftAddrs, adminAddrs []string
	var held []net.Listener // until all nine are picked, so no port repeats
	for range 9 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, ln)
		switch {
		case len(httpAddrs) < 3:
			httpAddrs = append(httpAddrs, ln.Addr().String())
		case len(raftAddrs) < 3:
			raftAddrs = append(raftAddrs, ln.Addr().String())
		default:
			adminAddrs = append(adminAddrs, ln.Addr().String())
		}
	}
	var peers strings.Builder
	for i := range 3 {
		fmt.Fprintf(&peers, "\n[[raft.peers]]\nnode_id = %d\nurl = \"http://%s\"\nraft_addr = %q\n", i+1, httpAddrs[i], raftAddrs[i])
	}
	var cmds []*exec.Cmd
	b.Cleanup(func() {
		for _, cmd := range cmds {
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
		}
	})
	for i := range 3 {
		cfg := fmt.Sprintf("[server]\nlisten = %q\nadmin_listen = %q\ndata_dir = %q\ncluster_id = \"bench-cluster\"\nengine = \"raft\"\ncluster_listen = %q\n\n[raft]\nnode_id = %d\ngroup_count = 1\ninit_membership_per_group = true\n%s",
			httpAddrs[i], adminAddrs[i], filepath.Join(dir, fmt.Sprintf("node%d", i+1)), raftAddrs[i], i+1, peers.String())
		path := filepath.Join(dir, fmt.Sprintf("node%d.toml", i+1))
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, "server", "--config", path)
		cmds = append(cmds, cmd)
	}
	// The ports are free again only now; each node binds its own at once.
	for _, ln := range held {
		ln.Close()
	}
	for _, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
	}
	for _, a := range httpAddrs {
		testserver.WaitReady(b, a)
	}
	return httpAddrs, adminAddrs
}

// clusterLeader is the index of the node that leads group 0, as the node whose admin
// listener is at reports it.
func clusterLeader(b *testing.B, at string) int {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		res, err := http.Get("http://" + at + "/__ursula/raft/status")
		if err != nil {
			continue
		}
		var st struct {
			Groups []struct {
				LeaderID string `json:"leader_id"`
			} `json:"groups"`
		}
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		var id int
		if err == nil && len(st.Groups) > 0 {
			fmt.Sscan(st.Groups[0].LeaderID, &id)
		}
		if id >= 1 && id <= 3 {
			return id - 1
		}
	}
	b.Fatal("no leader of group 0")
	return 0
}
