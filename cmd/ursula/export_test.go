package main

import (
	"bytes"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/internal/testserver"

	_ "github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

// TestExport: `ursula export` writes a plain SQLite file at the tail and at any earlier
// commit boundary (point-in-time), claims nothing, and refuses bad offsets without
// touching the output file.
func TestExport(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{ClusterID: "export-test"})
	url := ts.URL + "/expt/db"
	dir := t.TempDir()
	owner, err := vfs.Open(url, vfs.Options{Path: filepath.Join(dir, "owner.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Exec(`CREATE TABLE t(x INTEGER, pad BLOB)`); err != nil {
		t.Fatal(err)
	}
	var offsets []uint64 // offset after the commit that made the row count i+1
	for i := 0; i < 30; i++ {
		if _, err := owner.Exec(`INSERT INTO t VALUES (?, randomblob(700))`, i); err != nil {
			t.Fatal(err)
		}
		st, _ := vfs.Status(filepath.Join(dir, "owner.db"))
		offsets = append(offsets, st.Offset)
	}

	rows := func(path string) int {
		t.Helper()
		db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int
		var mode, ok string
		if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		db.QueryRow(`PRAGMA journal_mode`).Scan(&mode)
		db.QueryRow(`PRAGMA integrity_check`).Scan(&ok)
		if mode != "delete" || ok != "ok" {
			t.Errorf("%s: journal_mode %s, integrity %s", path, mode, ok)
		}
		return n
	}
	var out, errb bytes.Buffer
	tail := filepath.Join(dir, "tail.db")
	if err := runExport([]string{url, tail}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if n := rows(tail); n != 30 {
		t.Fatalf("tail export has %d rows", n)
	}
	if _, err := os.Stat(tail + "-wal"); err == nil {
		t.Error("reading the export left a -wal file: it is not self-contained")
	}
	for _, k := range []int{0, 9, 28} {
		p := filepath.Join(dir, "at.db")
		if err := runExport([]string{url, p, "--at", streamcore.FormatOffset(offsets[k])}, &out, &errb); err != nil {
			t.Fatal(err)
		}
		if n := rows(p); n != k+1 {
			t.Fatalf("export at commit %d has %d rows", k, n)
		}
	}
	// The owner was not fenced: it still commits.
	if _, err := owner.Exec(`INSERT INTO t VALUES (99, NULL)`); err != nil {
		t.Fatalf("owner after export: %v", err)
	}

	before, _ := os.ReadFile(tail)
	for _, args := range [][]string{
		{url, tail, "--at", streamcore.FormatOffset(offsets[29] + 1<<20)}, // past the tail
		{url, tail, "--at", streamcore.FormatOffset(offsets[5] + 3)},      // inside a record
		{url, tail, "--at", "12x"},
		{url + "?q", tail},
		{ts.URL + "/expt/missing", tail},
		{url},
	} {
		errb.Reset()
		if err := runExport(args, &out, &errb); err == nil {
			t.Errorf("%v: accepted", args)
		}
		if after, _ := os.ReadFile(tail); !bytes.Equal(before, after) {
			t.Fatalf("%v: the refused export changed the output file", args)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, "*.ursula-restore")); len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
	_ = strings.Contains
}
