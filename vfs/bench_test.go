package vfs

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"
)

// Commit latency of a replicated database (the real server over loopback HTTP, in this
// process and in another one) next to plain local SQLite in WAL mode (synchronous NORMAL and FULL), with the
// same statements, and the cold start (fresh-host attach) of 10 MB and 100 MB databases:
//
//	go test -run '^$' -bench . -benchtime 2000x ./vfs      (make bench)
//
// p50/p99 are reported as extra metrics (us); ns/op is the mean.

const row = `INSERT INTO t(body) VALUES ('a row of about sixty bytes, a typical small commit ....')`

// latencies runs op b.N times and reports p50 and p99.
func latencies(b *testing.B, op func() error) {
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-us")
}

func commitWorkloads(b *testing.B, open func(b *testing.B) *sql.DB) {
	b.Run("row", func(b *testing.B) {
		db := open(b)
		latencies(b, func() error { _, err := db.Exec(row); return err })
	})
	b.Run("tx100", func(b *testing.B) {
		db := open(b)
		latencies(b, func() error {
			tx, err := db.Begin()
			if err != nil {
				return err
			}
			for i := 0; i < 100; i++ {
				if _, err := tx.Exec(row); err != nil {
					tx.Rollback()
					return err
				}
			}
			return tx.Commit()
		})
	})
}

func withTable(b *testing.B, db *sql.DB) *sql.DB {
	b.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		b.Fatal(err)
	}
	return db
}

// quiet sends the replicator's event lines (stderr, captured by go test into the
// benchmark's output) to /dev/null, so the result lines stay parseable.
func quiet(b *testing.B) {
	devnull, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	saved := os.Stderr
	os.Stderr = devnull
	b.Cleanup(func() { os.Stderr = saved; devnull.Close() })
}

func BenchmarkCommit(b *testing.B) {
	quiet(b)
	// replicated: the memory engine in this process (one Go runtime schedules both
	// ends); replicated-process: `ursula server` with its defaults in another process, as
	// a deployment runs it (each request and answer wakes the other process).
	servers := map[string]func(b *testing.B) string{
		"replicated":         func(b *testing.B) string { return startServer(b) },
		"replicated-process": func(b *testing.B) string { return testserver.StartProcess(b) },
	}
	for _, variant := range []string{"replicated", "replicated-process"} {
		b.Run(variant, func(b *testing.B) {
			base := servers[variant](b)
			n := 0
			commitWorkloads(b, func(b *testing.B) *sql.DB {
				n++
				db, err := Open(fmt.Sprintf("%s/bench/commit-%d", base, n), Options{Path: filepath.Join(b.TempDir(), "r.db")})
				if err != nil {
					b.Fatal(err)
				}
				return withTable(b, db)
			})
		})
	}
	for _, sync := range []string{"normal", "full"} {
		b.Run("local-"+sync, func(b *testing.B) {
			commitWorkloads(b, func(b *testing.B) *sql.DB {
				db, err := sql.Open("sqlite3", "file:"+filepath.Join(b.TempDir(), "l.db")+"?_pragma=journal_mode(wal)&_pragma=synchronous("+sync+")")
				if err != nil {
					b.Fatal(err)
				}
				return withTable(b, db)
			})
		})
	}
}

// BenchmarkColdStart: a fresh host attaches (rebuild + claim) a database of 10 or 100 MB
// written by another owner. With the memory engine and no cold tier, snapshots over
// 32 MiB cannot be stored inline, so the 100 MB start replays the log.
func BenchmarkColdStart(b *testing.B) {
	quiet(b)
	for _, mb := range []int{10, 100} {
		b.Run(fmt.Sprintf("%dMB", mb), func(b *testing.B) {
			base := startServer(b)
			url := base + fmt.Sprintf("/bench/cold%d", mb)
			owner, err := Open(url, Options{Path: filepath.Join(b.TempDir(), "owner.db")})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := owner.Exec(`CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)`); err != nil {
				b.Fatal(err)
			}
			// Half-compressible rows, 4 MB per transaction.
			for i := 0; i < mb/4+1; i++ {
				if _, err := owner.Exec(`WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM s WHERE i < 1000) INSERT INTO t(v) SELECT randomblob(2000) || zeroblob(2000) FROM s`); err != nil {
					b.Fatal(err)
				}
			}
			owner.Close()
			b.SetBytes(int64(mb) << 20)
			latencies(b, func() error {
				db, err := Open(url, Options{Path: filepath.Join(b.TempDir(), "fresh.db")})
				if err != nil {
					return err
				}
				return db.Close()
			})
		})
	}
}
