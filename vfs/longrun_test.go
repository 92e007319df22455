package vfs

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/racetest"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// TestSnapshotRetentionLongRun: an owner writes at least 100 MB of log (20 MB under the
// race detector) into a database of a few MB while snapshots and retention cycle; a
// follower that lags (its reads wait behind a long read transaction) and a fresh host
// both end with files page-identical to the owner's, and the stream no longer holds the
// early log (retention moved), so the rebuild came from a snapshot plus the tail
// (checklist-vfs P, T36, T40).
func TestSnapshotRetentionLongRun(t *testing.T) {
	if testing.Short() {
		t.Skip("long run")
	}
	logTarget := uint64(100 << 20)
	if racetest.Enabled {
		logTarget = 20 << 20
	}
	t.Setenv("URSULA_VFS_SNAPSHOT_MIN_BYTES", fmt.Sprint(2<<20))
	base := startServer(t)
	url := base + "/longrun/db"
	dir := t.TempDir()
	ownerPath := filepath.Join(dir, "owner.db")
	owner, err := Open(url, Options{Path: ownerPath})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	mustExec(t, owner, `CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)`)
	mustExec(t, owner, `WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM s WHERE i < 1000) INSERT INTO t SELECT i, randomblob(3000) FROM s`)

	follower, err := Open(url, Options{Path: filepath.Join(dir, "follower.db"), Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	// The follower lags: a read transaction holds it back for a while.
	lag, err := follower.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var before int
	lag.QueryRow(`SELECT count(*) FROM t`).Scan(&before)
	defer func() {
		if lag != nil {
			lag.Rollback()
		}
	}()

	start := time.Now()
	for i := 0; ; i++ {
		// Rewrite 100 random rows: each commit is ~300 KB of pages over a ~3 MB database.
		if _, err := owner.Exec(`UPDATE t SET v = randomblob(3000) WHERE id IN (SELECT abs(random()) % 1000 + 1 FROM t LIMIT 100)`); err != nil {
			t.Fatal(err)
		}
		st, _ := Status(ownerPath)
		if r, err := streamcore.ParseOffset(st.Retained); lag != nil && err == nil && r > logTarget/4 {
			lag.Rollback() // the follower catches up from here, from behind retention
			lag = nil
		}
		if st.Offset >= logTarget {
			break
		}
	}
	st, _ := Status(ownerPath)
	t.Logf("%d MB of log in %v; snapshot %s, retained %s, snapshot failures %d (%s)", st.Offset>>20, time.Since(start).Round(time.Millisecond), st.Snapshot, st.Retained, st.SnapshotFailures, st.SnapshotError)

	c, _ := client.New("")
	deadline := time.Now().Add(60 * time.Second)
	var info *client.StreamInfo
	for {
		info, err = c.Head(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		if info.RetainedOffset != "" {
			if r, _ := streamcore.ParseOffset(info.RetainedOffset); r > logTarget/2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention did not move past half the log: %+v", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Early log is gone.
	if _, err := c.Read(context.Background(), url, client.ReadOptions{Offset: streamcore.FormatOffset(0), MaxBytes: 10}); err == nil {
		t.Error("the start of the log is still readable after retention moved")
	}

	// A fresh host rebuilds from the latest snapshot plus the tail.
	fresh := filepath.Join(t.TempDir(), "fresh.db")
	img, err := replicator.Restore(context.Background(), c, url, fresh, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	ownerImage := checkpointedImage(t, owner, ownerPath)
	if got, _ := os.ReadFile(fresh); !bytes.Equal(got, ownerImage) {
		t.Fatalf("the fresh host's file (%d bytes, %d commits replayed) differs from the owner's (%d bytes)", len(got), img.Commits, len(ownerImage))
	}
	// The follower catches up to the same content.
	want := tableDigest(t, owner)
	for deadline := time.Now().Add(60 * time.Second); ; {
		if got := tableDigest(t, follower); got == want {
			fs, _ := FollowStatus(filepath.Join(dir, "follower.db"))
			t.Logf("follower converged after %d rebuilds", fs.Rebuilds)
			break
		}
		if time.Now().After(deadline) {
			fs, _ := FollowStatus(filepath.Join(dir, "follower.db"))
			t.Fatalf("the follower did not converge: %+v", fs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkpointedImage is the owner's database file after a full checkpoint.
func checkpointedImage(t *testing.T, db *sql.DB, path string) []byte {
	t.Helper()
	if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tableDigest(t *testing.T, db *sql.DB) string {
	t.Helper()
	var n int
	var h string
	if err := db.QueryRow(`SELECT count(*), coalesce(sum(length(v)), 0) || ':' || coalesce(group_concat(hex(substr(v, 1, 4)), ''), '') FROM (SELECT v FROM t ORDER BY id)`).Scan(&n, &h); err != nil {
		return err.Error()
	}
	return fmt.Sprint(n, h)
}
