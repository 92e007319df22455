package vfs

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// BenchmarkColdStartS3: a fresh host opens (attach: snapshot install, tail replay, claim,
// then a first query) a database of 10 MB, 100 MB or 1 GB whose snapshot is an object in
// an S3 cold tier (versitygw), next to a plain copy plus fsync of the same file. Rows are
// half compressible, so the 100 MB and 1 GB snapshots are over one request (32 MiB) and
// need the upload in parts: a size skips while the server announces no
// Ursula-Max-Snapshot-Bytes. Setup (writing the database and waiting for its snapshot)
// is not timed; run with -benchtime 1x (setup is per run).
//
//	go test -run '^$' -bench ColdStartS3 -benchtime 1x ./vfs
func BenchmarkColdStartS3(b *testing.B) {
	quiet(b)
	for _, mb := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("%dMB", mb), func(b *testing.B) {
			url, ownerPath := coldStartSetup(b, mb)
			size := fileSize(b, ownerPath)
			b.SetBytes(size)
			cp := copyTime(b, ownerPath)
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				db, err := Open(url, Options{Path: filepath.Join(b.TempDir(), "fresh.db")})
				if err != nil {
					b.Fatal(err)
				}
				var n int64
				if err := db.QueryRow(`SELECT max(id) FROM t`).Scan(&n); err != nil || n == 0 {
					b.Fatalf("first query: %d, %v", n, err)
				}
				total += time.Since(t0)
				b.StopTimer()
				db.Close()
				b.StartTimer()
			}
			b.StopTimer()
			per := total / time.Duration(b.N)
			b.ReportMetric(float64(size)/per.Seconds()/1e6, "MB/s")
			b.ReportMetric(float64(size)/cp.Seconds()/1e6, "cp-MB/s")
			b.ReportMetric(per.Seconds()/cp.Seconds(), "x-cp")
		})
	}
}

// coldStartSetup starts a server with an S3 cold tier, writes a database of about mb MB
// through the VFS and keeps writing until its snapshot is published; it returns the
// stream URL and the owner's (checkpointed, closed) file.
func coldStartSetup(b *testing.B, mb int) (string, string) {
	base, _ := s3ColdServer(b, "coldstart", 8<<20)
	url := base + fmt.Sprintf("/bench/cold%d", mb)

	c, _ := client.New("")
	ownerPath := filepath.Join(b.TempDir(), "owner.db")
	owner, err := Open(url, Options{Path: ownerPath})
	if err != nil {
		b.Fatal(err)
	}
	info, err := c.Head(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	if mb > 30 && info.MaxSnapshotBytes <= 0 {
		owner.Close()
		b.Skipf("%d MB: its snapshot is over one request and the server's HEAD sends no Ursula-Max-Snapshot-Bytes (no upload in parts)", mb)
	}
	exec := func(q string) {
		if _, err := owner.Exec(q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)`)
	// Half-compressible rows of 4 KB, 4 MB per transaction.
	for i := 0; i < mb/4+1; i++ {
		exec(`WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM s WHERE i < 1000) INSERT INTO t(v) SELECT randomblob(2000) || zeroblob(2000) FROM s`)
	}
	// A snapshot is due once the log passes the database size: rewrite rows until it is
	// due, then wait for it, so the tail after it is short.
	deadline := time.Now().Add(10 * time.Minute)
	for k := 0; ; k++ {
		// The owner's status, not a HEAD: it names the snapshot once the publisher read it
		// back, so closing the owner then cuts no cycle short.
		st, err := Status(ownerPath)
		if err != nil {
			b.Fatal(err)
		}
		if st.Snapshot != "-1" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("no snapshot after 10 minutes: %+v", st)
		}
		if st.LogBytes > st.SnapshotDueBytes {
			// Due: wait for the snapshot instead of growing the tail a fresh host replays.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		lo := (k * 1000) % (mb * 250)
		exec(fmt.Sprintf(`UPDATE t SET v = randomblob(2000) || zeroblob(2000) WHERE id > %d AND id <= %d`, lo, lo+1000))
	}
	exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	if err := owner.Close(); err != nil {
		b.Fatal(err)
	}
	return url, ownerPath
}

func fileSize(b *testing.B, p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}

// copyTime is the best of three plain copies (read, write, fsync) of the file.
func copyTime(b *testing.B, src string) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range 3 {
		dst := filepath.Join(b.TempDir(), "copy.db")
		t0 := time.Now()
		in, err := os.Open(src)
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(dst)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			b.Fatal(err)
		}
		if err := out.Sync(); err != nil {
			b.Fatal(err)
		}
		out.Close()
		in.Close()
		best = min(best, time.Since(t0))
		os.Remove(dst)
	}
	return best
}
