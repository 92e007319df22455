package vfs

import (
	"database/sql"
	"path/filepath"
	"testing"
)

// Commit latency of a replicated database (the real server over loopback HTTP, in this
// process) next to plain local SQLite in WAL mode with the same schema and statements:
// go test -run '^$' -bench Commit ./vfs. The ratio is the price of "durable on the
// server before COMMIT returns".

func benchCommits(b *testing.B, db *sql.DB) {
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := db.Exec(`INSERT INTO t(body) VALUES ('a row of about sixty bytes, a typical small commit ....')`); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCommitReplicated(b *testing.B) {
	base := startServer(b)
	db, err := Open(base+"/bench/commit", Options{Path: filepath.Join(b.TempDir(), "r.db")})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	benchCommits(b, db)
}

func BenchmarkCommitLocal(b *testing.B) {
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(b.TempDir(), "l.db")+"?_pragma=journal_mode(wal)&_pragma=synchronous(normal)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	benchCommits(b, db)
}
