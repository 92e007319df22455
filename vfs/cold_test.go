package vfs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/client"
	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/coldtier/store/s3test"
	"github.com/ursula-go/ursula/internal/racetest"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// TestDatabaseOnColdTier: a 200 MB database (50 MB under -race) written through the VFS
// to a server whose cold tier is a real S3 server (versitygw): the log is flushed to
// chunk objects, the snapshot body (over 1 MiB) is stored as an object, and a fresh host
// rebuilds a file page-identical to the owner's from the snapshot in S3 plus the tail.
func TestDatabaseOnColdTier(t *testing.T) {
	if testing.Short() {
		t.Skip("long run")
	}
	dbMB := 200
	if racetest.Enabled {
		dbMB = 50
	}
	base, store := s3ColdServer(t, "vfs-cold", 1<<20)

	url := base + "/colddb/big"
	ownerPath := filepath.Join(t.TempDir(), "owner.db")
	owner, err := Open(url, Options{Path: ownerPath})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	mustExec(t, owner, `CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)`)
	// Rows of 4 KB, mostly compressible, 20 MB per transaction (about 1.5 MB of frame).
	start := time.Now()
	for i := 0; i < dbMB/20; i++ {
		mustExec(t, owner, `WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM s WHERE i < 5000) INSERT INTO t(v) SELECT randomblob(300) || zeroblob(3700) FROM s`)
	}
	t.Logf("wrote %d MB in %v", dbMB, time.Since(start).Round(time.Millisecond))

	// A snapshot is due once the log passes the database size: keep writing until one
	// is published.
	c, _ := client.New("")
	deadline := time.Now().Add(240 * time.Second) // a snapshot upload on a loaded machine is slow
	for {
		info, err := c.Head(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		if info.SnapshotOffset != "" && info.SnapshotOffset != "-1" {
			break
		}
		if time.Now().After(deadline) {
			st, _ := Status(ownerPath)
			t.Fatalf("no snapshot: %+v", st)
		}
		// 4 MB of incompressible log per commit over the same 1000 rows, so the log
		// outgrows the database while the snapshot stays compressible.
		mustExec(t, owner, `UPDATE t SET v = randomblob(4000) WHERE id <= 1000`)
	}
	var chunks, snaps int
	store.List(context.Background(), "", func(o coldstore.ObjectInfo) bool {
		switch {
		case strings.Contains(o.Key, "/c/"):
			chunks++
		case strings.Contains(o.Key, "/s/"):
			snaps++
		}
		return true
	})
	if chunks == 0 || snaps == 0 {
		t.Fatalf("cold objects: %d chunks, %d snapshot bodies", chunks, snaps)
	}

	fresh := filepath.Join(t.TempDir(), "fresh.db")
	t0 := time.Now()
	img, err := replicator.Restore(context.Background(), c, url, fresh, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d chunk objects, %d snapshot bodies; fresh-host rebuild of %d MB in %v (%d commits after the snapshot)",
		chunks, snaps, int64(img.DBPages)*int64(img.PageSize)>>20, time.Since(t0).Round(time.Millisecond), img.Commits)
	want := checkpointedImage(t, owner, ownerPath)
	if got, _ := os.ReadFile(fresh); !bytes.Equal(got, want) {
		t.Fatalf("the rebuilt file (%d bytes) differs from the owner's (%d bytes)", len(got), len(want))
	}
}

// s3ColdServer starts a real server (memory engine) whose cold tier is a versitygw S3
// bucket under prefix, flushing in chunks of flushSize; it returns its URL and the store.
func s3ColdServer(tb testing.TB, prefix string, flushSize int64) (string, coldstore.Store) {
	tb.Helper()
	gw := s3test.Start(tb)
	store, err := coldstore.NewS3(context.Background(), gw.Config(prefix))
	if err != nil {
		tb.Fatal(err)
	}
	cfg := testserver.DefaultColdConfig("s3", flushSize)
	cfg.S3 = gw.Config(prefix)
	return testserver.Start(tb, testserver.Options{ClusterID: prefix, Cold: store, ColdConfig: &cfg}).URL, store
}
