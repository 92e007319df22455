package vfs

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"
	"github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// These tests run a follower (Options.Follow) against an owner through the real server
// over HTTP, with real SQLite on both sides.

// openPair opens an owner of a new stream with table t, and a follower of it.
func openPair(t *testing.T, name string) (owner, follower *sql.DB, fpath, url string) {
	t.Helper()
	return openPairWith(t, name, Options{})
}

// openPairWith is openPair with the follower opened with fo (Path and Follow set here).
func openPairWith(t *testing.T, name string, fo Options) (owner, follower *sql.DB, fpath, url string) {
	t.Helper()
	url = startServer(t) + "/dbs1/" + name
	dir := t.TempDir()
	owner, err := Open(url, Options{Path: filepath.Join(dir, "owner.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	mustExec(t, owner, `CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)`)
	fpath = filepath.Join(dir, "follower.db")
	fo.Path, fo.Follow = fpath, true
	follower, err = Open(url, fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	return owner, follower, fpath, url
}

// waitCount polls q on db until it returns want, or fails after the deadline.
func waitCount(t *testing.T, db *sql.DB, q string, want int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var n int
		if err := db.QueryRow(q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if n == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s: %d after %v, want %d", q, n, within, want)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func integrityOK(t *testing.T, db *sql.DB) {
	t.Helper()
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check %q %v", ok, err)
	}
}

// TestFollowLive: every commit of the owner shows up on the follower shortly after; the
// follower is read-only and sound, and Status reports it.
func TestFollowLive(t *testing.T) {
	owner, follower, fpath, url := openPair(t, "live")
	if n := count(t, follower, `SELECT count(*) FROM t`); n != 0 {
		t.Fatalf("follower starts with %d rows", n)
	}
	const commits = 100
	lags := make([]time.Duration, 0, commits)  // commit acknowledged -> visible
	total := make([]time.Duration, 0, commits) // commit started -> visible
	for i := 1; i <= commits; i++ {
		start := time.Now()
		mustExec(t, owner, `INSERT INTO t(v) VALUES (?)`, fmt.Sprintf("row %d", i))
		lag := waitCount(t, follower, `SELECT count(*) FROM t`, i, 5*time.Second)
		lags, total = append(lags, lag), append(total, time.Since(start))
	}
	slices.Sort(lags)
	slices.Sort(total)
	t.Logf("follow lag over %d commits: acknowledged -> visible p50 %v p90 %v max %v; commit started -> visible p50 %v p90 %v",
		commits, lags[commits/2], lags[commits*9/10], lags[commits-1], total[commits/2], total[commits*9/10])

	// A schema change and a multi-row transaction.
	mustExec(t, owner, `CREATE INDEX t_v ON t(v)`)
	mustExec(t, owner, `UPDATE t SET v = v || '!' WHERE id % 2 = 0`)
	mustExec(t, owner, `DELETE FROM t WHERE id > 90`)
	waitCount(t, follower, `SELECT count(*) FROM t WHERE v LIKE '%!'`, 45, 5*time.Second)
	waitCount(t, follower, `SELECT count(*) FROM t`, 90, 5*time.Second)
	if n := count(t, follower, `SELECT count(*) FROM sqlite_master WHERE name = 't_v'`); n != 1 {
		t.Fatal("the follower misses the index")
	}
	integrityOK(t, follower)
	var mode string
	if err := follower.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("follower journal mode %q %v", mode, err)
	}

	// Writes through the follower fail with SQLite's read-only error.
	for _, q := range []string{`INSERT INTO t(v) VALUES ('x')`, `CREATE TABLE u(x)`, `PRAGMA journal_mode=WAL`} {
		_, err := follower.Exec(q)
		if q == `PRAGMA journal_mode=WAL` {
			// Not an error in SQLite, but it must not change the mode.
			if err := follower.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "delete" {
				t.Fatalf("journal mode after %s: %q %v", q, mode, err)
			}
			continue
		}
		if !errors.Is(err, sqlite3.READONLY) {
			t.Fatalf("%s on the follower: %v, want a readonly error", q, err)
		}
	}

	ownerSt, err := Status(filepath.Join(filepath.Dir(fpath), "owner.db"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		fs, err := FollowStatus(fpath)
		if err != nil {
			t.Fatal(err)
		}
		if fs.Offset == ownerSt.Offset && fs.UpToDate {
			if !fs.Following || fs.URL != url || fs.Error != nil || fs.Epoch != ownerSt.Epoch || fs.LastApplied.IsZero() {
				t.Fatalf("follower status %+v, owner %+v", fs, ownerSt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower at %d, owner at %d", fs.Offset, ownerSt.Offset)
		}
		time.Sleep(time.Millisecond)
	}
	if st, err := Status(fpath); err != nil || st.Offset != ownerSt.Offset {
		t.Fatalf("Status of the follower %+v %v", st, err)
	}
	// The file is the stream's database page for page, in rollback mode, with its own
	// change counter, valid for the database size it says.
	c, _ := client.New("")
	fresh := filepath.Join(t.TempDir(), "fresh.db")
	if _, err := replicator.Restore(context.Background(), c, url, fresh, 0, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(fpath)
	want, _ := os.ReadFile(fresh)
	if len(got) != len(want) || len(got) < 4096 {
		t.Fatalf("follower file %d bytes, stream database %d", len(got), len(want))
	}
	if got[18] != 1 || got[19] != 1 || !bytes.Equal(got[24:28], got[92:96]) ||
		binary.BigEndian.Uint32(got[28:]) != uint32(len(got)/4096) {
		t.Fatalf("follower header % x", got[:100])
	}
	for _, r := range [][2]int{{18, 20}, {24, 32}, {92, 96}} {
		copy(got[r[0]:r[1]], want[r[0]:r[1]])
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the follower's pages differ from the stream's database")
	}
	// Nobody else gets the path: neither an owner nor a read-only attach of this process.
	if _, err := Open(url, Options{Path: fpath}); !isKind(err, replicator.KindInUse) {
		t.Fatalf("owner on the follower's path: %v", err)
	}

	// One follower per path per process; Close stops it and frees the path.
	if _, err := Open(url, Options{Path: fpath, Follow: true}); !isKind(err, replicator.KindInUse) {
		t.Fatalf("second follower on the path: %v", err)
	}
	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := FollowStatus(fpath); !isKind(err, replicator.KindNotFound) {
		t.Fatalf("status after close: %v", err)
	}
	again, err := Open(url, Options{Path: fpath, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if n := count(t, again, `SELECT count(*) FROM t`); n != 90 {
		t.Fatalf("reopened follower has %d rows", n)
	}
}

func followStatus(t *testing.T, fpath string) FollowerStatus {
	t.Helper()
	fs, err := FollowStatus(fpath)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// ownerStatus is the status of the owner openPair opened beside fpath.
func ownerStatus(t *testing.T, fpath string) replicator.Status {
	t.Helper()
	st, err := Status(filepath.Join(filepath.Dir(fpath), "owner.db"))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func isKind(err error, k replicator.Kind) bool {
	e, ok := replicator.AsError(err)
	return ok && e.Kind == k
}

// TestFollowReadTransaction: a read transaction keeps its snapshot while commits arrive,
// other readers are not starved meanwhile, and the next read after it sees everything.
func TestFollowReadTransaction(t *testing.T) {
	owner, follower, fpath, _ := openPair(t, "readtx")
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('a'), ('b')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, 2, 5*time.Second)

	tx, err := follower.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("in the transaction: %d %v", n, err)
	}
	for i := 0; i < 10; i++ {
		mustExec(t, owner, `INSERT INTO t(v) VALUES (?)`, fmt.Sprintf("r%d", i))
	}
	// The applier has read the commits and waits for the transaction.
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
		if err := tx.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
			t.Fatalf("the transaction's view changed: %d %v", n, err)
		}
	}
	// Other readers still read (the applier yields its PENDING lock while it waits).
	start := time.Now()
	if err := follower.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("another reader during the transaction: %d %v", n, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("another reader waited %v", d)
	}
	if err := tx.QueryRow(`SELECT count(*) FROM t WHERE v LIKE 'r%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the transaction sees new rows: %d %v", n, err)
	}
	// The applier has read the commits but waits for the transaction to end.
	if fs, ow := followStatus(t, fpath), ownerStatus(t, fpath); fs.Offset >= ow.Offset || fs.UpToDate {
		t.Fatalf("applied up to %d (up to date %v) while a read transaction was open (owner at %d)", fs.Offset, fs.UpToDate, ow.Offset)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, follower, `SELECT count(*) FROM t`, 12, 5*time.Second)
	integrityOK(t, follower)
}

// TestFollowConsistentReads: readers running while commits are applied only ever see
// whole transactions: transfers between accounts keep the total.
func TestFollowConsistentReads(t *testing.T) {
	owner, follower, _, _ := openPair(t, "consistent")
	mustExec(t, owner, `CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER, pad BLOB)`)
	mustExec(t, owner, `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 200)
		INSERT INTO acct SELECT i, 100, randomblob(500) FROM c`)
	waitCount(t, follower, `SELECT count(*) FROM acct`, 200, 5*time.Second)
	const transfers = 60
	t0 := time.Now()
	done := make(chan struct{})
	errs := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func() {
			reads := 0
			for {
				select {
				case <-done:
					if reads == 0 {
						errs <- errors.New("no reads")
					}
					errs <- nil
					return
				default:
				}
				var n, sum int
				if err := follower.QueryRow(`SELECT count(*), sum(bal) FROM acct`).Scan(&n, &sum); err != nil {
					errs <- err
					return
				}
				if n != 200 || sum != 20000 {
					errs <- fmt.Errorf("read %d accounts holding %d", n, sum)
					return
				}
				reads++
				time.Sleep(500 * time.Microsecond) // leave the 2 shared cores some air
			}
		}()
	}
	for i := 0; i < transfers; i++ {
		from, to := i*7%200+1, i*13%200+1
		tx, err := owner.Begin()
		if err != nil {
			t.Fatal(err)
		}
		tx.Exec(`UPDATE acct SET bal = bal - 5, pad = randomblob(500) WHERE id = ?`, from)
		tx.Exec(`UPDATE acct SET bal = bal + 5, pad = randomblob(500) WHERE id = ?`, to)
		if _, err := tx.Exec(`INSERT INTO t(v) VALUES ('x')`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	t1 := time.Now()
	waitCount(t, follower, `SELECT count(*) FROM t`, transfers, 5*time.Second)
	t.Logf("commits %v, follower caught up %v later", t1.Sub(t0), time.Since(t1))
	close(done)
	for r := 0; r < 2; r++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	integrityOK(t, follower)
}

// TestFollowBigTransaction: one commit of several MB, larger than a read, is assembled
// across reads and applied whole.
func TestFollowBigTransaction(t *testing.T) {
	// The server's cap is 8 MiB; with 256 KiB reads a 3 MB record needs 12 of them.
	owner, follower, _, _ := openPairWith(t, "big", Options{followReadBytes: 256 << 10})
	const rows = 1500 // 3 MB of incompressible blobs
	mustExec(t, owner, `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < ?)
		INSERT INTO t(v) SELECT randomblob(2000) FROM c`, rows)
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('after')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, rows+1, 10*time.Second)
	var a, b int64
	if err := owner.QueryRow(`SELECT sum(length(v)) FROM t`).Scan(&a); err != nil {
		t.Fatal(err)
	}
	if err := follower.QueryRow(`SELECT sum(length(v)) FROM t`).Scan(&b); err != nil || a != b || a < 3_000_000 {
		t.Fatalf("bytes: owner %d follower %d %v", a, b, err)
	}
	integrityOK(t, follower)
}

// TestFollowBehindRetention: a follower that falls behind retention (here: held back by a
// read transaction while a snapshot is published and retention advanced past it) rebuilds
// the whole file from the latest snapshot and goes on following.
func TestFollowBehindRetention(t *testing.T) {
	owner, follower, fpath, url := openPair(t, "retention")
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('a')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, 1, 5*time.Second)
	tx, err := follower.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('b')`) // the applier reads it, then waits
	time.Sleep(100 * time.Millisecond)
	for i := 0; i < 5; i++ {
		mustExec(t, owner, `INSERT INTO t(v) VALUES ('c')`)
	}
	// Publish a snapshot of the stream's tail and retain from it.
	c, _ := client.New("")
	ctx := context.Background()
	snapPath := filepath.Join(t.TempDir(), "snap.db")
	img, err := replicator.Restore(ctx, c, url, snapPath, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: img.Tail}, image)
	if err != nil {
		t.Fatal(err)
	}
	off := streamcore.FormatOffset(img.Tail)
	if _, err := c.PublishSnapshot(ctx, url, off, "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Retain(ctx, url, off); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	waitCount(t, follower, `SELECT count(*) FROM t`, 7, 5*time.Second)
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('d')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, 8, 5*time.Second)
	fs, err := FollowStatus(fpath)
	if err != nil || fs.Rebuilds != 1 || !fs.Following {
		t.Fatalf("status %+v %v", fs, err)
	}
	integrityOK(t, follower)
}

// TestFollowStreamDeleted: a stream that disappears ends following; the file keeps its
// last state and Status says why.
func TestFollowStreamDeleted(t *testing.T) {
	owner, follower, fpath, url := openPair(t, "deleted")
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('a')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, 1, 5*time.Second)
	c, _ := client.New("")
	if _, err := c.Delete(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := Status(fpath)
		if err != nil {
			t.Fatal(err)
		}
		if st.Error != nil {
			if st.Error.Kind != replicator.KindNotFound {
				t.Fatalf("status %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no error after the stream was deleted: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if fs, _ := FollowStatus(fpath); fs.Following {
		t.Fatalf("still following: %+v", fs)
	}
	if n := count(t, follower, `SELECT count(*) FROM t`); n != 1 {
		t.Fatalf("rows after the stream went away: %d", n)
	}
}

// TestFollowRecreatedStream: a stream deleted and created again (a new incarnation) while
// the follower looked away is rebuilt from, and followed again.
func TestFollowRecreatedStream(t *testing.T) {
	owner, follower, fpath, url := openPair(t, "recreated")
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('old')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, 1, 5*time.Second)
	tx, err := follower.Begin() // holds the applier after its next read
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('old 2')`)
	time.Sleep(100 * time.Millisecond)
	owner.Close()
	c, _ := client.New("")
	if _, err := c.Delete(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	owner2, err := Open(url, Options{Path: filepath.Join(t.TempDir(), "owner2.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer owner2.Close()
	mustExec(t, owner2, `CREATE TABLE other(x)`)
	for i := 0; i < 30; i++ {
		mustExec(t, owner2, `INSERT INTO other VALUES (?)`, i)
	}
	tx.Rollback()
	waitCount(t, follower, `SELECT count(*) FROM sqlite_master WHERE name = 'other'`, 1, 5*time.Second)
	waitCount(t, follower, `SELECT count(*) FROM other`, 30, 5*time.Second)
	if n := count(t, follower, `SELECT count(*) FROM sqlite_master WHERE name = 't'`); n != 0 {
		t.Fatal("the old incarnation's table is still there")
	}
	mustExec(t, owner2, `INSERT INTO other VALUES (30)`)
	waitCount(t, follower, `SELECT count(*) FROM other`, 31, 5*time.Second)
	if fs := followStatus(t, fpath); fs.Rebuilds != 1 || !fs.Following || fs.Error != nil {
		t.Fatalf("status %+v", fs)
	}
	integrityOK(t, follower)
}

// TestFollowOtherProcessReaders: any SQLite reader of the file (here a plain connection
// pool, as another process would have) follows along, also across a restart of the
// follower, which rebuilds the file in place rather than replacing it.
func TestFollowOtherProcessReaders(t *testing.T) {
	owner, follower, fpath, url := openPair(t, "others")
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('a')`)
	waitCount(t, follower, `SELECT count(*) FROM t`, 1, 5*time.Second)
	plain, err := driver.Open("file:" + fpath + "?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if n := count(t, plain, `SELECT count(*) FROM t`); n != 1 {
		t.Fatalf("plain reader: %d rows", n)
	}
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('b')`)
	waitCount(t, plain, `SELECT count(*) FROM t`, 2, 5*time.Second)

	before, err := os.Stat(fpath)
	if err != nil {
		t.Fatal(err)
	}
	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, owner, `CREATE TABLE u(x)`)
	mustExec(t, owner, `INSERT INTO t(v) VALUES ('c')`)
	again, err := Open(url, Options{Path: fpath, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	after, err := os.Stat(fpath)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Fatal("the restarted follower replaced the file")
	}
	waitCount(t, plain, `SELECT count(*) FROM t`, 3, 5*time.Second)
	waitCount(t, plain, `SELECT count(*) FROM sqlite_master WHERE name = 'u'`, 1, 5*time.Second)
	mustExec(t, owner, `INSERT INTO u VALUES (1)`)
	waitCount(t, plain, `SELECT count(*) FROM u`, 1, 5*time.Second)
	if fs := followStatus(t, fpath); fs.Rebuilds != 0 || !fs.Following {
		t.Fatalf("status %+v", fs)
	}
	integrityOK(t, plain)
}

// TestFollowMissingStream: following a stream that does not exist is a typed not_found
// and leaves nothing behind locally.
func TestFollowMissingStream(t *testing.T) {
	base := startServer(t)
	dir := t.TempDir()
	_, err := Open(base+"/dbs1/missing", Options{Path: filepath.Join(dir, "f.db"), Follow: true})
	var e *Error
	if !errors.As(err, &e) || e.Kind != replicator.KindNotFound {
		t.Fatalf("missing stream: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("files left behind: %v", ents)
	}
	if _, err := Open("ftp://x/y", Options{Path: filepath.Join(dir, "f.db"), Follow: true}); !isKind(err, replicator.KindInvalidURL) {
		t.Fatalf("bad URL: %v", err)
	}
}
