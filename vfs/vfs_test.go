package vfs

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ncruces/go-sqlite3/driver"
	sqlvfs "github.com/ncruces/go-sqlite3/vfs"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// These tests run real SQLite (ncruces/go-sqlite3) against the real server over HTTP.

func startServer(t testing.TB) string {
	t.Helper()
	return testserver.Start(t, testserver.Options{ClusterID: "vfs-test"}).URL
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func count(t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestTransparencyAndRebuild: any schema works, and a rebuild from the stream on a fresh
// directory is byte-identical to the checkpointed original and passes integrity_check.
func TestTransparencyAndRebuild(t *testing.T) {
	base := startServer(t)
	url := base + "/dbs1/notes"
	path := filepath.Join(t.TempDir(), "notes.db")
	db, err := Open(url, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, `CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, blob BLOB)`)
	mustExec(t, db, `CREATE INDEX notes_body ON notes(body)`)
	for i := 0; i < 50; i++ {
		mustExec(t, db, `INSERT INTO notes(body, blob) VALUES (?, randomblob(300))`, fmt.Sprintf("note %d", i))
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2000; i++ {
		if _, err := tx.Exec(`INSERT INTO notes(body, blob) VALUES (?, randomblob(100))`, strings.Repeat("x", i%200)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `DELETE FROM notes WHERE id % 3 = 0`)
	if n := count(t, db, `SELECT count(*) FROM notes`); n != 1367 {
		t.Fatalf("rows %d", n)
	}
	st, err := Status(path)
	if err != nil || st.Offset == 0 || st.Epoch != 1 || st.Commits < 53 {
		t.Fatalf("status %+v %v", st, err)
	}
	mustExec(t, db, `PRAGMA wal_checkpoint(TRUNCATE)`)

	fresh := filepath.Join(t.TempDir(), "rebuilt.db")
	c, _ := client.New("")
	img, err := replicator.Restore(context.Background(), c, url, fresh, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Tail != st.Offset {
		t.Fatalf("rebuilt to %d, owner at %d", img.Tail, st.Offset)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(fresh)
	if !bytes.Equal(a, b) {
		t.Fatalf("rebuild differs: %d vs %d bytes", len(a), len(b))
	}
	plain, err := driver.Open("file:" + fresh + "?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	var ok string
	if err := plain.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check %q %v", ok, err)
	}
	if n := count(t, plain, `SELECT count(*) FROM notes`); n != 1367 {
		t.Fatalf("rebuilt rows %d", n)
	}
}

// TestTwoOwners: the later claim wins; the earlier owner fails with stop, reads included.
func TestTwoOwners(t *testing.T) {
	base := startServer(t)
	url := base + "/dbs1/shared"
	first, err := Open(url, Options{Path: filepath.Join(t.TempDir(), "a.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	mustExec(t, first, `CREATE TABLE t(x)`)
	mustExec(t, first, `INSERT INTO t VALUES (1)`)

	second, err := Open(url, Options{Path: filepath.Join(t.TempDir(), "b.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if n := count(t, second, `SELECT count(*) FROM t`); n != 1 {
		t.Fatalf("second owner sees %d rows", n)
	}
	mustExec(t, second, `INSERT INTO t VALUES (2)`)

	_, err = first.Exec(`INSERT INTO t VALUES (3)`)
	if err == nil {
		t.Fatal("the fenced owner committed")
	}
	var e *Error
	if !errors.As(err, &e) || e.Kind != replicator.KindFenced || e.Action != replicator.ActionStop {
		t.Fatalf("fenced commit error: %v", err)
	}
	if _, err := first.Query(`SELECT count(*) FROM t`); err == nil {
		// Reads fail too once fenced (a fresh connection reads the file).
		var n int
		if err := first.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err == nil {
			t.Fatalf("fenced owner still reads (%d rows)", n)
		}
	}
	if n := count(t, second, `SELECT count(*) FROM t`); n != 2 {
		t.Fatalf("second owner has %d rows", n)
	}
}

// dirState is every file of dir with its content, to prove a refusal changed nothing.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out[e.Name()] = string(b)
	}
	return out
}

// TestBadInput: refusals before anything is claimed or written (checklist-vfs B, C, T45,
// T46); each leaves the directory byte-identical.
func TestBadInput(t *testing.T) {
	base := startServer(t)
	for _, u := range []string{"ftp://x/y", "http://127.0.0.1:1/b?q=1", "http://127.0.0.1:1/b#f", "http:///nohost", "http://127.0.0.1:1/"} {
		_, err := Open(u, Options{Path: filepath.Join(t.TempDir(), "x.db")})
		var e *Error
		if !errors.As(err, &e) || e.Kind != replicator.KindInvalidURL || e.Action != replicator.ActionFix {
			t.Errorf("%s: %v", u, err)
		}
	}
	for _, p := range []string{":memory:", "file:x.db"} {
		_, err := Open(base+"/dbs1/m", Options{Path: p})
		if e, ok := replicator.AsError(err); !ok || e.Action != replicator.ActionFix {
			t.Errorf("%s: %v", p, err)
		}
	}

	// A file with data and no sidecar is never replicated over.
	dir := t.TempDir()
	p := filepath.Join(dir, "local.db")
	os.WriteFile(p, []byte("not from a stream"), 0o644)
	before := dirState(t, dir)
	_, err := Open(base+"/dbs1/missing", Options{Path: p})
	if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindUnreplicated {
		t.Errorf("unreplicated file: %v", err)
	}
	delete(before, "local.db-ursula.lock")
	after := dirState(t, dir)
	delete(after, "local.db-ursula.lock")
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("the refused attach changed files: %v", after)
	}

	// A replicated file whose stream disappeared: not_found, and the file is kept.
	dir = t.TempDir()
	p = filepath.Join(dir, "kept.db")
	url := base + "/dbs1/gone"
	db, err := Open(url, Options{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `CREATE TABLE t(x)`)
	db.Close()
	c, _ := client.New("")
	if _, err := c.Delete(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	before = dirState(t, dir)
	_, err = Open(url, Options{Path: p})
	if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindNotFound {
		t.Errorf("missing stream: %v", err)
	}
	if after := dirState(t, dir); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Error("the refused attach changed the local files")
	}
	if _, err := c.Head(context.Background(), url); err == nil {
		t.Error("the refused attach created the stream")
	}

	// The sidecar names the stream exactly as attached: another spelling is other_stream.
	dir = t.TempDir()
	p = filepath.Join(dir, "spelled.db")
	db, err = Open(base+"/dbs1/spelled", Options{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `CREATE TABLE t(x)`)
	db.Close()
	before = dirState(t, dir)
	_, err = Open(strings.Replace(base, "127.0.0.1", "localhost", 1)+"/dbs1/spelled", Options{Path: p})
	if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindOtherStream {
		t.Errorf("other spelling: %v", err)
	}
	if after := dirState(t, dir); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Error("the refused attach changed the local files")
	}
}

// TestResumeAndRebuild: a re-attach on the same boot resumes from the sidecar (folding
// the local WAL, replaying only what another owner added); a sidecar from another boot,
// a damaged sidecar or a replaced file rebuilds (checklist-vfs D21-D23, G, T5, T7).
func TestResumeAndRebuild(t *testing.T) {
	base := startServer(t)
	url := base + "/dbs1/resume"
	dir := t.TempDir()
	p := filepath.Join(dir, "a.db")
	db, err := Open(url, Options{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `CREATE TABLE t(x)`)
	for i := 0; i < 20; i++ {
		mustExec(t, db, `INSERT INTO t VALUES (?)`, i)
	}
	db.Close()
	if _, err := os.Stat(p + "-wal"); err != nil {
		t.Log("no WAL left after close:", err)
	}

	// Another owner elsewhere adds rows.
	other, err := Open(url, Options{Path: filepath.Join(t.TempDir(), "b.db")})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, other, `INSERT INTO t VALUES (100)`)
	other.Close()

	reopen := func(wantMode string, wantRows int) {
		t.Helper()
		db, err := Open(url, Options{Path: p})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		st, _ := Status(p)
		if st.AttachMode != wantMode {
			t.Errorf("attach mode %q, want %q", st.AttachMode, wantMode)
		}
		if n := count(t, db, `SELECT count(*) FROM t`); n != wantRows {
			t.Errorf("%d rows, want %d", n, wantRows)
		}
		var ok string
		db.QueryRow(`PRAGMA integrity_check`).Scan(&ok)
		if ok != "ok" {
			t.Errorf("integrity_check: %s", ok)
		}
		mustExec(t, db, `INSERT INTO t VALUES (-1)`)
	}
	reopen("resumed", 21)

	// A sidecar from another boot is never trusted.
	var sc map[string]json.RawMessage // raw, so numbers keep every digit
	b, err := os.ReadFile(replicator.SidecarPath(p))
	if err == nil {
		err = json.Unmarshal(b, &sc)
	}
	if err != nil || sc["boot_id"] == nil {
		t.Fatalf("sidecar: %v %v", sc, err)
	}
	sc["boot_id"] = json.RawMessage(`"another-boot"`)
	b, _ = json.Marshal(sc)
	os.WriteFile(replicator.SidecarPath(p), b, 0o644)
	reopen("rebuilt", 22)

	// A torn sidecar is never trusted either.
	b, _ = os.ReadFile(replicator.SidecarPath(p))
	os.WriteFile(replicator.SidecarPath(p), b[:len(b)/2], 0o644)
	reopen("rebuilt", 23)

	reopen("resumed", 24)
}

// syncCounter is a file that counts the syncs that reach it.
type syncCounter struct {
	sqlvfs.File
	syncs int
}

func (f *syncCounter) Sync(sqlvfs.SyncFlag) error { f.syncs++; return nil }

// TestWALSyncStaysLocal: a sync of an owner's -wal file, which SQLite issues on every
// commit under its default synchronous=FULL, never reaches the file (DESIGN: nothing on
// the commit path fsyncs local files); the database file's syncs still do.
func TestWALSyncStaysLocal(t *testing.T) {
	wal, db := &syncCounter{}, &syncCounter{}
	for _, flag := range []sqlvfs.SyncFlag{sqlvfs.SYNC_NORMAL, sqlvfs.SYNC_FULL, sqlvfs.SYNC_DATAONLY} {
		if err := (&walFile{File: wal}).Sync(flag); err != nil {
			t.Fatal(err)
		}
		if err := (&dbFile{File: db}).Sync(flag); err != nil {
			t.Fatal(err)
		}
	}
	if wal.syncs != 0 || db.syncs != 3 {
		t.Fatalf("syncs reaching the files: wal %d (want 0), db %d (want 3)", wal.syncs, db.syncs)
	}
}
