package vfs

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// captureStderr sends os.Stderr, where the adapter writes its events, to a file until the
// test ends; the returned function gives the event lines named event written so far.
func captureStderr(t *testing.T) func(event string) []string {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = f
	t.Cleanup(func() { os.Stderr = saved; f.Close() })
	return func(event string) []string {
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if strings.Contains(sc.Text(), " event="+event+" ") {
				lines = append(lines, sc.Text())
			}
		}
		return lines
	}
}

// TestJournalModeChangeRefused: an owner's connection that left WAL mode would write its
// pages straight into the database file, where the stream never sees them, and
// locking_mode=EXCLUSIVE keeps the WAL index in one connection's memory. Both pragmas
// fail before SQLite changes anything, each logs journal_refused at level warn, and the
// connection goes on committing in WAL mode.
func TestJournalModeChangeRefused(t *testing.T) {
	base := startServer(t)
	path := filepath.Join(t.TempDir(), "j.db")
	db, err := Open(base+"/events/journal", Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // the pragmas and the inserts run on one connection
	mustExec(t, db, `CREATE TABLE t(x)`)
	mustExec(t, db, `INSERT INTO t VALUES (1)`)
	events := captureStderr(t)
	for i, q := range []string{`PRAGMA journal_mode=DELETE`, `PRAGMA journal_mode=memory`, `PRAGMA locking_mode=EXCLUSIVE`} {
		if _, err := db.Exec(q); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("%s: %v", q, err)
		}
		got := events("journal_refused")
		if len(got) != i+1 || !strings.HasPrefix(got[i], "sqlite-ursula-vfs level=warn event=journal_refused ") {
			t.Fatalf("after %s, journal_refused events: %q", q, got)
		}
	}
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q (%v)", mode, err)
	}
	mustExec(t, db, `INSERT INTO t VALUES (2)`)
	if n := count(t, db, `SELECT count(*) FROM t`); n != 2 {
		t.Fatalf("the owner reads %d rows, want 2", n)
	}
	db.Close()
	again, err := Open(base+"/events/journal", Options{Path: filepath.Join(t.TempDir(), "rebuilt.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if n := count(t, again, `SELECT count(*) FROM t`); n != 2 {
		t.Fatalf("a rebuild from the stream reads %d rows, want 2", n)
	}
}
