package vfs

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// lazyQueries are point lookups, range scans, joins and aggregates over notes and tags.
var lazyQueries = []string{
	`SELECT body FROM notes WHERE id = 7`,
	`SELECT body FROM notes WHERE id = 1999`,
	`SELECT id, body FROM notes WHERE id BETWEEN 300 AND 420 ORDER BY id`,
	`SELECT count(*), sum(length(body)), sum(length(blob)) FROM notes`,
	`SELECT n.id, t.tag FROM notes n JOIN tags t ON t.note = n.id WHERE t.tag LIKE 'tag 1%' ORDER BY n.id, t.tag`,
	`SELECT t.tag, count(*) FROM tags t JOIN notes n ON n.id = t.note GROUP BY t.tag ORDER BY t.tag`,
	`SELECT name FROM sqlite_schema ORDER BY name`,
}

// answers runs every lazy query on db and returns the rows as text.
func answers(t *testing.T, db *sql.DB) []string {
	t.Helper()
	var out []string
	for _, q := range lazyQueries {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		cols, _ := rows.Columns()
		var b strings.Builder
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&b, vals...)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		rows.Close()
		out = append(out, b.String())
	}
	return out
}

// fullDownload restores the stream as of at into a file and opens it read-only.
func fullDownload(t *testing.T, streamURL string, at uint64) *sql.DB {
	t.Helper()
	c, _ := client.New("")
	path := filepath.Join(t.TempDir(), "full.db")
	if _, err := replicator.Restore(context.Background(), c, streamURL, path, at, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?immutable=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func tailOf(t *testing.T, streamURL string) uint64 {
	t.Helper()
	c, _ := client.New("")
	info, err := c.Head(context.Background(), streamURL)
	if err != nil {
		t.Fatal(err)
	}
	off, _ := streamcore.ParseOffset(info.NextOffset)
	return off
}

// publishSnapshot publishes a snapshot (the format writers produce) of the stream's tail,
// passing its blob through damage first.
func publishSnapshot(t *testing.T, streamURL string, damage func([]byte)) uint64 {
	t.Helper()
	c, _ := client.New("")
	ctx := context.Background()
	snapPath := filepath.Join(t.TempDir(), "snap.db")
	img, err := replicator.Restore(ctx, c, streamURL, snapPath, 0, streamcore.MaxRequestBytes, nil)
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
	if damage != nil {
		damage(blob)
	}
	if _, err := c.PublishSnapshot(ctx, streamURL, streamcore.FormatOffset(img.Tail), "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}
	return img.Tail
}

// writeNotes adds rows to notes and tags; from is the first id.
func writeNotes(t *testing.T, db *sql.DB, from, n int) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i++ {
		if _, err := tx.Exec(`INSERT INTO notes(id, body, blob) VALUES (?, ?, randomblob(200 + ? % 300))`, i, fmt.Sprintf("note %d %s", i, strings.Repeat("x", i%50)), i); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(`INSERT INTO tags(note, tag) VALUES (?, ?)`, i, fmt.Sprintf("tag %d", i%17)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func openOwnerWithNotes(t *testing.T, name string) (*sql.DB, string) {
	t.Helper()
	streamURL := startServer(t) + "/dbs1/" + name
	owner, err := Open(streamURL, Options{Path: filepath.Join(t.TempDir(), "owner.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	mustExec(t, owner, `CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, blob BLOB)`)
	mustExec(t, owner, `CREATE TABLE tags(note INTEGER, tag TEXT)`)
	mustExec(t, owner, `CREATE INDEX tags_note ON tags(note)`)
	return owner, streamURL
}

func openLazyAt(t *testing.T, streamURL string, at uint64) *sql.DB {
	t.Helper()
	db, err := Open(streamURL, Options{ReadOnly: true, Lazy: true, At: at})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestLazyMatchesFullDownload: at the tail and at past offsets (before the snapshot, at
// it, after it), a lazy open answers every query as a full download does.
func TestLazyMatchesFullDownload(t *testing.T) {
	owner, streamURL := openOwnerWithNotes(t, "lazy-same")
	writeNotes(t, owner, 1, 1500)
	beforeSnap := tailOf(t, streamURL)
	writeNotes(t, owner, 1501, 600)
	mustExec(t, owner, `UPDATE notes SET body = 'changed ' || id WHERE id % 7 = 0`)
	snap := publishSnapshot(t, streamURL, nil)
	mustExec(t, owner, `DELETE FROM notes WHERE id % 5 = 0`)
	mustExec(t, owner, `DELETE FROM tags WHERE note % 5 = 0`)
	writeNotes(t, owner, 5000, 100)
	mustExec(t, owner, `UPDATE notes SET body = 'again ' || id WHERE id BETWEEN 390 AND 400`)
	mustExec(t, owner, `VACUUM`) // shrinks the database
	writeNotes(t, owner, 6000, 10)
	tail := tailOf(t, streamURL)

	for _, at := range []uint64{beforeSnap, snap, tail, 0} {
		want := answers(t, fullDownload(t, streamURL, at))
		got := answers(t, openLazyAt(t, streamURL, at))
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("at %d, %s:\nlazy %.300q\nfull %.300q", at, lazyQueries[i], got[i], want[i])
			}
		}
	}
	if want := answers(t, fullDownload(t, streamURL, beforeSnap)); want[3] == answers(t, fullDownload(t, streamURL, tail))[3] {
		t.Fatal("the offsets compared hold the same data: the test proves nothing")
	}
	integrityOK(t, openLazyAt(t, streamURL, 0))
}

// TestLazyLiveTail: a following lazy open sees new commits in new transactions, while a
// long read transaction keeps the offset it began at.
func TestLazyLiveTail(t *testing.T) {
	owner, streamURL := openOwnerWithNotes(t, "lazy-live")
	writeNotes(t, owner, 1, 300)
	publishSnapshot(t, streamURL, nil)
	writeNotes(t, owner, 301, 10)
	db, err := Open(streamURL, Options{ReadOnly: true, Lazy: true, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// The transaction reads one row first, so SQLite caches few pages: what it reads
	// later comes from the view it pinned, not from its page cache.
	var before string
	if err := tx.QueryRow(`SELECT body FROM notes WHERE id = 5`).Scan(&before); err != nil || !strings.HasPrefix(before, "note 5 ") {
		t.Fatalf("in the transaction: %q, %v", before, err)
	}
	if n := count(t, db, `SELECT count(*) FROM notes`); n != 310 {
		t.Fatalf("%d rows, want 310", n)
	}
	for i := range 5 {
		writeNotes(t, owner, 1000+100*i, 50)
		mustExec(t, owner, `UPDATE notes SET body = 'live' WHERE id < 50`)
	}
	waitCount(t, db, `SELECT count(*) FROM notes`, 310+250, 10*time.Second)
	if n := count(t, db, `SELECT count(*) FROM notes WHERE body = 'live'`); n != 49 {
		t.Fatalf("%d updated rows seen, want 49", n)
	}
	var during, live int
	if err := tx.QueryRow(`SELECT count(*), sum(body = 'live') FROM notes`).Scan(&during, &live); err != nil || during != 310 || live != 0 {
		t.Fatalf("the long transaction sees %d rows (%d updated), %v; want its snapshot of 310, none updated", during, live, err)
	}
	tx.Rollback()
	integrityOK(t, db)
}

// TestLazyDamagedFrame: a snapshot frame that does not match its checksum is an error
// for the query that needs it, never a wrong answer.
func TestLazyDamagedFrame(t *testing.T) {
	owner, streamURL := openOwnerWithNotes(t, "lazy-damage")
	writeNotes(t, owner, 1, 2000)
	publishSnapshot(t, streamURL, func(blob []byte) { blob[len(blob)-20] ^= 0x40 }) // in the last frame
	db := openLazyAt(t, streamURL, 0)
	var n int
	err := db.QueryRow(`SELECT count(*) FROM notes WHERE length(blob) >= 0`).Scan(&n)
	if err == nil {
		t.Fatalf("a scan over a damaged frame answered %d", n)
	}
}
