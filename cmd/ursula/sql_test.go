package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

// TestSQL: `ursula sql` answers a query at the tail and at an earlier offset, as a
// table, JSON or CSV, and at a time (the last commit at or before it), refusing one before the history.
func TestSQL(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{ClusterID: "sql-test"})
	url := ts.URL + "/sqlt/db"
	path := filepath.Join(t.TempDir(), "owner.db")
	owner, err := vfs.Open(url, vfs.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	for _, q := range []string{`CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, b BLOB)`,
		`INSERT INTO t VALUES (1, 'one', x'00ff'), (2, 'two', NULL)`} {
		if _, err := owner.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := vfs.Status(path)
	past := st.Offset
	if _, err := owner.Exec(`INSERT INTO t VALUES (3, 'three, with a comma', NULL)`); err != nil {
		t.Fatal(err)
	}
	runOK := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(append([]string{"sql"}, args...), &out, &errb); code != 0 {
			t.Fatalf("ursula sql %q: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	table := runOK(url, `SELECT id, name, b FROM t ORDER BY id`)
	for _, want := range []string{"id", "name", "three, with a comma", "x'00ff'", "NULL"} {
		if !strings.Contains(table, want) {
			t.Fatalf("table lacks %q:\n%s", want, table)
		}
	}
	if lines := strings.Count(table, "\n"); lines != 5 {
		t.Fatalf("table has %d lines, want header, rule and 3 rows:\n%s", lines, table)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(runOK(url, `SELECT id, name FROM t ORDER BY id`, "--json", "--at", streamcore.FormatOffset(past))), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1]["name"] != "two" || rows[0]["id"] != float64(1) {
		t.Fatalf("json at %d: %v", past, rows)
	}
	if csv := runOK(url, `SELECT id, name FROM t WHERE id = 3`, "--csv"); csv != "id,name\n3,\"three, with a comma\"\n" {
		t.Fatalf("csv: %q", csv)
	}
	var out, errb bytes.Buffer
	// A time before the first commit names the earliest restorable commit; a time after
	// the commits resolves to the tail.
	if code := run([]string{"sql", url, `SELECT 1`, "--at", "2024-01-02T03:04:05Z"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "earliest") {
		t.Fatalf("--at a time before the history: exit %d, %s", code, errb.String())
	}
	if got := runOK(url, `SELECT count(*) AS n FROM t`, "--csv", "--at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); got != "n\n3\n" {
		t.Fatalf("--at a time after the last commit: %q", got)
	}
	if code := run([]string{"sql", url, `DELETE FROM t`}, &out, &errb); code != 1 {
		t.Fatalf("a write through ursula sql: exit %d", code)
	}
}
