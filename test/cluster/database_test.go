package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

// nodeListURL is the multi-node URL of a stream on the given nodes, in that order.
func nodeListURL(nodes []*node, path string) string {
	hosts := make([]string, len(nodes))
	for i, n := range nodes {
		hosts[i] = strings.TrimPrefix(n.url, "http://")
	}
	return "http://" + strings.Join(hosts, ",") + "/" + path
}

// TestDatabaseSurvivesLeaderKill: an owner opened with vfs.Open on a URL naming all three
// nodes keeps committing across a SIGKILL of its stream's leader (after the election), no
// acknowledged commit is lost, and its rows equal a rebuild from the stream. Opened again
// with the nodes in another order, it is the same database.
func TestDatabaseSurvivesLeaderKill(t *testing.T) {
	const groups = 2
	c := newCluster(t, clusterOpts{nodes: 3, groups: groups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	key := "clusterdb/owner"
	g := fnvGroup(key, groups)
	url := nodeListURL(c.nodes, key)
	path := filepath.Join(t.TempDir(), "owner.db")
	db, err := vfs.Open(url, vfs.Options{Path: path})
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	defer func() { db.Close() }()
	if _, err := db.Exec(`CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)`); err != nil {
		t.Fatal(err)
	}
	var acked []int
	insert := func(i int) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO t(id, v) VALUES (?, ?)`, i, fmt.Sprintf("row %d", i)); err != nil {
			var ve *vfs.Error
			errors.As(err, &ve)
			t.Fatalf("commit %d: %v (%+v)", i, err, ve)
		}
		acked = append(acked, i)
	}
	for i := range 50 {
		insert(i)
	}
	leader := 0
	for deadline := time.Now().Add(10 * time.Second); leader == 0; time.Sleep(50 * time.Millisecond) {
		if leader = c.leaderOf(g, c.nodes[0]); leader == 0 && time.Now().After(deadline) {
			t.Fatal("no leader of the stream's group")
		}
	}
	c.nodes[leader-1].kill()
	killedAt := time.Now()
	insert(50) // waits out the election
	t.Logf("node %d (the leader) killed; the next commit took %v", leader, time.Since(killedAt))
	for i := 51; i < 100; i++ {
		insert(i)
	}
	if st, err := vfs.Status(path); err != nil || st.Poisoned || st.Fenced {
		t.Fatalf("status after the failover: %+v %v", st, err)
	}

	// The owner's rows are the acknowledged ones, and so are a rebuild's from the stream.
	want := fmt.Sprint(acked)
	if got := ids(t, db); got != want {
		t.Fatalf("owner holds %s, acknowledged %s", got, want)
	}
	cl, err := client.New("")
	if err != nil {
		t.Fatal(err)
	}
	rebuilt := filepath.Join(t.TempDir(), "rebuilt.db")
	if _, err := replicator.Restore(context.Background(), cl, url, rebuilt, 0, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatalf("rebuild from the stream: %v", err)
	}
	rdb, err := sql.Open("sqlite3", "file:"+rebuilt+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if got := ids(t, rdb); got != want {
		t.Fatalf("the stream holds %s, acknowledged %s", got, want)
	}

	// The same nodes in another order name the same database: it resumes, no other_stream.
	db.Close()
	reversed := nodeListURL([]*node{c.nodes[2], c.nodes[1], c.nodes[0]}, key)
	if db, err = vfs.Open(reversed, vfs.Options{Path: path}); err != nil {
		t.Fatalf("reopen as %s: %v", reversed, err)
	}
	insert(100)
	if got, want := ids(t, db), fmt.Sprint(acked); got != want {
		t.Fatalf("reopened owner holds %s, acknowledged %s", got, want)
	}
}

// TestDatabaseRefusesMixedClusters: a URL naming nodes of two clusters is refused with
// invalid_url before anything is written.
func TestDatabaseRefusesMixedClusters(t *testing.T) {
	a := newCluster(t, clusterOpts{nodes: 1, groups: 1})
	b := newCluster(t, clusterOpts{nodes: 1, groups: 1})
	b.nodes[0].config = rewriteClusterID(t, b.nodes[0].config, "other-cluster")
	a.startAll()
	b.startAll()
	url := nodeListURL([]*node{a.nodes[0], b.nodes[0]}, "clusterdb/mixed")
	_, err := vfs.Open(url, vfs.Options{Path: filepath.Join(t.TempDir(), "mixed.db")})
	var ve *vfs.Error
	if !errors.As(err, &ve) || ve.Kind != replicator.KindInvalidURL {
		t.Fatalf("open over two clusters: %v, want invalid_url", err)
	}
	for _, n := range []*node{a.nodes[0], b.nodes[0]} {
		if res, _, err := httpDo("HEAD", n.url+"/clusterdb/mixed", nil, nil); err != nil || res.StatusCode != 404 {
			t.Fatalf("%s holds the stream after a refused open: %v %v", n.url, err, res)
		}
	}
}

// ids lists the ids of table t in order.
func ids(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT id FROM t ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(out)
}

// rewriteClusterID gives a node's config another cluster_id.
func rewriteClusterID(t *testing.T, config, id string) string {
	t.Helper()
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), `cluster_id = "test-cluster"`, fmt.Sprintf("cluster_id = %q", id), 1)
	if err := os.WriteFile(config, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}
