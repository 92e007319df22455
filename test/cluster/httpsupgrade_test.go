package cluster

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testcerts"
	"github.com/ursula-go/ursula/tlsfiles"
)

// TestRaftUpgradeOverHTTPS: three processes serve clients over HTTPS and carry Raft on
// that same listener (the upgrade route, no cluster listener), with mutual TLS between
// peers inside the upgraded connections. TLS is terminated in the node's own listener,
// under the JSON refusals wrapper, so the upgrade hijacks a wrapped TLS connection: the
// nodes elect leaders and commit a write that every node then serves.
func TestRaftUpgradeOverHTTPS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "cluster-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certFile, keyFile := ca.Issue(t, "member").Write(t, dir, "member")
	pool, err := tlsfiles.LoadCAPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsfiles.ClientConfig(pool, nil)},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	const n = 3
	ports := make([]int, n)
	admins := make([]int, n)
	used := map[int]bool{}
	for i := range n {
		for _, p := range []*int{&ports[i], &admins[i]} {
			for *p = freePort(t); used[*p]; *p = freePort(t) {
			}
			used[*p] = true
		}
	}
	var nodes []*node
	for i := range n {
		var b strings.Builder
		fmt.Fprintf(&b, "[server]\nlisten = \"127.0.0.1:%d\"\nadmin_listen = \"127.0.0.1:%d\"\ndata_dir = %q\ncluster_id = \"https-upgrade\"\nengine = \"raft\"\ntls_cert_file = %q\ntls_key_file = %q\n",
			ports[i], admins[i], filepath.Join(dir, fmt.Sprintf("node%d", i+1)), certFile, keyFile)
		fmt.Fprintf(&b, "\n[raft]\nnode_id = %d\ngroup_count = 2\ninit_membership_per_group = true\nheartbeat_timeout_ms = 500\ntls_ca_file = %q\ntls_cert_file = %q\ntls_key_file = %q\n",
			i+1, caFile, certFile, keyFile)
		for j := range n {
			fmt.Fprintf(&b, "\n[[raft.peers]]\nnode_id = %d\nurl = \"https://127.0.0.1:%d\"\n", j+1, ports[j])
		}
		cfg := filepath.Join(dir, fmt.Sprintf("node%d.toml", i+1))
		if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		nd := &node{t: t, id: i + 1, url: fmt.Sprintf("https://127.0.0.1:%d", ports[i]), config: cfg, log: filepath.Join(dir, fmt.Sprintf("node%d.log", i+1))}
		nodes = append(nodes, nd)
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.kill()
		}
		if t.Failed() {
			for _, nd := range nodes {
				b, _ := os.ReadFile(nd.log)
				t.Logf("node %d log tail:\n%s", nd.id, tail(string(b), 2000))
			}
		}
	})
	for _, nd := range nodes {
		nd.start()
	}
	do := func(method, u string, body []byte) (*http.Response, []byte, error) {
		req, err := http.NewRequest(method, u, bytes.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		if method != "GET" {
			req.Header.Set("Content-Type", "text/plain")
		}
		res, err := cl.Do(req)
		if err != nil {
			return nil, nil, err
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res, b, nil
	}
	// Ready means every group has a leader: Raft ran over the upgraded HTTPS connections.
	for _, nd := range nodes {
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if res, _, err := do("GET", nd.url+"/__ursula/ready", nil); err == nil && res.StatusCode == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d not ready over https", nd.id)
			}
		}
	}
	// A write through any node (following the 307 to the leader by hand), then read on all.
	write := func(method, u string, body []byte, want int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			res, b, err := do(method, u, body)
			if err == nil && res.StatusCode == http.StatusTemporaryRedirect {
				res, b, err = do(method, res.Header.Get("Location"), body)
			}
			if err == nil && res.StatusCode == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s: %v %v %s", method, u, err, res, b)
			}
		}
	}
	write("PUT", nodes[0].url+"/https/s1", nil, http.StatusCreated)
	write("POST", nodes[0].url+"/https/s1", []byte("over the upgrade"), http.StatusNoContent)
	for _, nd := range nodes {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			res, b, err := do("GET", nd.url+"/https/s1?offset=-1", nil)
			if err == nil && res.StatusCode == 200 && string(b) == "over the upgrade" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never served the write: %v %v %s", nd.id, err, res, b)
			}
		}
	}
}
