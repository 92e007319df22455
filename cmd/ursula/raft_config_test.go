package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRaftConfigRefusals: invalid [raft] settings stop the server before it serves.
func TestRaftConfigRefusals(t *testing.T) {
	peers := `
[[raft.peers]]
node_id = 1
url = "http://127.0.0.1:1"
raft_addr = "127.0.0.1:2"
[[raft.peers]]
node_id = 2
url = "http://127.0.0.1:3"
raft_addr = "127.0.0.1:4"
`
	cases := []struct{ name, cfg, args, want string }{
		{"no node id with peers", "[raft]\n" + peers, "", "raft.node_id must be non-zero"},
		{"self not a peer", "[raft]\nnode_id = 3\n" + peers, "", "raft.peers must include this node"},
		{"--node-id picks self", "[raft]\nnode_id = 1\n" + peers, "--node-id 7", "raft.peers must include this node (node_id 7)"},
		{"bad fsync", "[raft.wal]\nfsync = \"sometimes\"\n", "", "raft.wal.fsync"},
		{"peer without url", "[raft]\nnode_id = 1\n[[raft.peers]]\nnode_id = 1\nurl = \"http://x\"\n[[raft.peers]]\nnode_id = 2\nraft_addr = \"127.0.0.1:2\"\n", "", "node 2 needs url"},
		{"peer url not a URL", "[raft]\nnode_id = 1\n[[raft.peers]]\nnode_id = 1\nurl = \"http://x\"\n[[raft.peers]]\nnode_id = 2\nurl = \"10.0.0.2:4437\"\n", "", "node 2 needs url"},
		{"cluster_listen without raft_addr", "[server]\ncluster_listen = \"127.0.0.1:0\"\n[raft]\nnode_id = 1\n[[raft.peers]]\nnode_id = 1\nurl = \"http://127.0.0.1:1\"\n[[raft.peers]]\nnode_id = 2\nurl = \"http://127.0.0.1:3\"\n", "", "gives node 1 no raft_addr"},
		{"unknown engine", "", "--engine rocks", `engine "rocks" is not available`},
		{"unknown raft key", "[raft]\ngroups = 3\n", "", "unknown keys: raft.groups"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "c.toml")
			os.WriteFile(cfg, []byte(c.cfg), 0o644)
			args := []string{"server", "--config", cfg, "--listen", "127.0.0.1:0", "--data", dir}
			if c.args != "" {
				args = append(args, strings.Fields(c.args)...)
			}
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errb.String(), c.want)
			}
		})
	}
}

// TestGroupCountIsFixed: the group count is recorded on first start; another count later
// is refused (streams are placed by hash mod the count).
func TestGroupCountIsFixed(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	os.MkdirAll(filepath.Join(dir, "raft"), 0o755)
	os.WriteFile(filepath.Join(dir, "raft", "group_count"), []byte("8\n"), 0o644)
	os.WriteFile(cfg, []byte("[raft]\ngroup_count = 4\n"), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"server", "--config", cfg, "--listen", "127.0.0.1:0", "--data", dir}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "cannot change") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}
