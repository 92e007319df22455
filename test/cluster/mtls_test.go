package cluster

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testcerts"
)

// TestMutualTLSCluster: three processes whose peer traffic runs over mutual TLS with a
// cluster CA elect leaders and commit writes; a fourth process that presents a
// certificate of another CA, while trusting the cluster's own, is refused by the nodes
// (its log shows the nodes' TLS refusal, not its own distrust).
func TestMutualTLSCluster(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "cluster-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certFile, keyFile := ca.Issue(t, "member").Write(t, dir, "member")
	c := newCluster(t, clusterOpts{nodes: 3, groups: 2,
		raft: fmt.Sprintf("tls_ca_file = %q\ntls_cert_file = %q\ntls_key_file = %q\n", caFile, certFile, keyFile)})
	c.startAll()
	n1 := c.nodes[0]
	var res *http.Response
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// A follower answers with a redirect; follow it by hand to the leader.
		res, _, err = httpDo("PUT", n1.url+"/mtls/s1", nil, map[string]string{"Content-Type": "text/plain"})
		if err == nil && res.StatusCode == http.StatusTemporaryRedirect {
			res, _, err = httpDo("PUT", res.Header.Get("Location"), nil, map[string]string{"Content-Type": "text/plain"})
		}
		if err == nil && res.StatusCode == http.StatusCreated || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create over the mTLS cluster: %v %v", err, res)
	}

	// The fourth process: node 4 of a four-voter peer list, certificate from a rogue CA,
	// trusting both CAs so that any refusal it logs is the cluster's.
	rogue := testcerts.NewCA(t, "rogue-ca")
	rc, rk := rogue.Issue(t, "node-4").Write(t, dir, "rogue")
	both := filepath.Join(dir, "both.crt")
	os.WriteFile(both, append(append([]byte{}, ca.CertPEM...), rogue.CertPEM...), 0o644)
	// An admin port of its own: the default (the client port + 1) may be another
	// process's, and a node that cannot bind it exits before it asks for a vote.
	httpPort, raftPort, adminPort := freePort(t), freePort(t), freePort(t)
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = \"127.0.0.1:%d\"\nadmin_listen = \"127.0.0.1:%d\"\ndata_dir = %q\ncluster_listen = \"127.0.0.1:%d\"\n", httpPort, adminPort, filepath.Join(dir, "node4"), raftPort)
	fmt.Fprintf(&b, "[raft]\nnode_id = 4\ngroup_count = 2\ninit_membership_per_group = true\ntls_ca_file = %q\ntls_cert_file = %q\ntls_key_file = %q\n", both, rc, rk)
	for j, p := range c.raftPorts {
		fmt.Fprintf(&b, "[[raft.peers]]\nnode_id = %d\nurl = %q\nraft_addr = \"127.0.0.1:%d\"\n", j+1, c.nodes[j].url, p)
	}
	fmt.Fprintf(&b, "[[raft.peers]]\nnode_id = 4\nurl = \"http://127.0.0.1:%d\"\nraft_addr = \"127.0.0.1:%d\"\n", httpPort, raftPort)
	cfg := filepath.Join(dir, "node4.toml")
	os.WriteFile(cfg, []byte(b.String()), 0o644)
	n4 := &node{t: t, id: 4, url: fmt.Sprintf("http://127.0.0.1:%d", httpPort), config: cfg, log: filepath.Join(dir, "node4.log")}
	n4.start()
	defer n4.kill()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lg, _ := os.ReadFile(n4.log)
		if strings.Contains(string(lg), "remote error: tls") {
			break
		}
		if strings.Contains(string(lg), "granted") || time.Now().After(deadline) {
			t.Fatalf("the rogue node was not refused by the cluster; its log:\n%s", tail(string(lg), 3000))
		}
	}
	// The cluster still serves.
	res, _, err = httpDo("GET", n1.url+"/__ursula/ready", nil, nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("cluster after the rogue: %v %v", err, res)
	}
}
