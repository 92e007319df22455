//go:build cgo

package mattnvfs_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/testserver"
	"github.com/ursula-go/ursula/lazy/mattnvfs"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// queries are point lookups, range scans, joins and aggregates over notes and tags.
var queries = []string{
	`SELECT body FROM notes WHERE id = 7`,
	`SELECT body FROM notes WHERE id = 1999`,
	`SELECT id, body FROM notes WHERE id BETWEEN 300 AND 420 ORDER BY id`,
	`SELECT count(*), sum(length(body)), sum(length(blob)) FROM notes`,
	`SELECT n.id, t.tag FROM notes n JOIN tags t ON t.note = n.id WHERE t.tag LIKE 'tag 1%' ORDER BY n.id, t.tag`,
	`SELECT t.tag, count(*) FROM tags t JOIN notes n ON n.id = t.note GROUP BY t.tag ORDER BY t.tag`,
	`SELECT name FROM sqlite_schema ORDER BY name`,
}

func answers(t *testing.T, db *sql.DB) []string {
	t.Helper()
	var out []string
	for _, q := range queries {
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

var (
	buildOnce sync.Once
	ownerBin  string
	buildErr  error
)

// owner is the sqlowner helper process writing the stream.
type owner struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

func startOwner(t *testing.T, streamURL string) *owner {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mattnvfs-test")
		if err != nil {
			buildErr = err
			return
		}
		ownerBin = filepath.Join(dir, "sqlowner")
		out, err := exec.Command("go", "build", "-o", ownerBin, "./internal/sqlowner").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build sqlowner: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	cmd := exec.Command(ownerBin, streamURL, filepath.Join(t.TempDir(), "owner.db"))
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return &owner{in: in, out: bufio.NewScanner(stdout)}
}

func (o *owner) exec(t *testing.T, q string) {
	t.Helper()
	fmt.Fprintln(o.in, strings.ReplaceAll(q, "\n", " "))
	if !o.out.Scan() {
		t.Fatalf("%s: the owner process ended", q)
	}
	if o.out.Text() != "ok" {
		t.Fatalf("%s: %s", q, o.out.Text())
	}
}

func (o *owner) notes(t *testing.T, from, n int) {
	t.Helper()
	o.exec(t, fmt.Sprintf(`WITH RECURSIVE s(i) AS (SELECT %d UNION ALL SELECT i+1 FROM s WHERE i < %d)
		INSERT INTO notes(id, body, blob) SELECT i, 'note ' || i || ' ' || substr('xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', 1, i %% 50), randomblob(200 + i %% 300) FROM s`, from, from+n-1))
	o.exec(t, fmt.Sprintf(`WITH RECURSIVE s(i) AS (SELECT %d UNION ALL SELECT i+1 FROM s WHERE i < %d)
		INSERT INTO tags(note, tag) SELECT i, 'tag ' || (i %% 17) FROM s`, from, from+n-1))
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

// fullDownload restores the stream as of at into a file and opens it with mattn.
func fullDownload(t *testing.T, streamURL string, at uint64) *sql.DB {
	t.Helper()
	c, _ := client.New("")
	path := filepath.Join(t.TempDir(), "full.db")
	if _, err := replicator.Restore(context.Background(), c, streamURL, path, at, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?immutable=1&mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// publishSnapshot publishes a snapshot of the stream's tail, as an owner's cycle would.
func publishSnapshot(t *testing.T, streamURL string) uint64 {
	t.Helper()
	c, _ := client.New("")
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "snap.db")
	img, err := replicator.Restore(ctx, c, streamURL, path, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: img.Tail}, image)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishSnapshot(ctx, streamURL, streamcore.FormatOffset(img.Tail), "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}
	return img.Tail
}

func openLazy(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestMattnLazyMatchesFullDownload: through mattn/go-sqlite3 and the ursula-lazy VFS, at
// the tail and at past offsets (before the snapshot, at it, after it), every query
// answers as on a full download; writes are refused.
func TestMattnLazyMatchesFullDownload(t *testing.T) {
	if err := mattnvfs.Register(nil); err != nil {
		t.Fatal(err)
	}
	streamURL := testserver.Start(t, testserver.Options{ClusterID: "mattnvfs-test"}).URL + "/dbs1/lazy-mattn"
	o := startOwner(t, streamURL)
	o.exec(t, `CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, blob BLOB)`)
	o.exec(t, `CREATE TABLE tags(note INTEGER, tag TEXT)`)
	o.exec(t, `CREATE INDEX tags_note ON tags(note)`)
	o.notes(t, 1, 1500)
	beforeSnap := tailOf(t, streamURL)
	o.notes(t, 1501, 600)
	o.exec(t, `UPDATE notes SET body = 'changed ' || id WHERE id % 7 = 0`)
	snap := publishSnapshot(t, streamURL)
	o.exec(t, `DELETE FROM notes WHERE id % 5 = 0`)
	o.exec(t, `DELETE FROM tags WHERE note % 5 = 0`)
	o.notes(t, 5000, 100)
	o.exec(t, `UPDATE notes SET body = 'again ' || id WHERE id BETWEEN 390 AND 400`)
	o.exec(t, `VACUUM`)
	o.notes(t, 6000, 10)
	tail := tailOf(t, streamURL)

	for _, at := range []uint64{beforeSnap, snap, tail, 0} {
		want := answers(t, fullDownload(t, streamURL, at))
		atParam := ""
		if at != 0 {
			atParam = fmt.Sprint(at)
		}
		got := answers(t, openLazy(t, mattnvfs.DSN(streamURL, atParam, false)))
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("at %d, %s:\nlazy %.300q\nfull %.300q", at, queries[i], got[i], want[i])
			}
		}
	}
	if a, b := answers(t, fullDownload(t, streamURL, beforeSnap))[3], answers(t, fullDownload(t, streamURL, tail))[3]; a == b {
		t.Fatal("the offsets compared hold the same data: the test proves nothing")
	}

	db := openLazy(t, mattnvfs.DSN(streamURL, "", false))
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check: %q, %v", ok, err)
	}
	if _, err := db.Exec(`INSERT INTO notes(id, body) VALUES (99999, 'no')`); err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Fatalf("a write through the lazy VFS: %v, want a read-only refusal", err)
	}
	// A URI without the stream URL is refused at open.
	bad := openLazy(t, "file:x.db?vfs=ursula-lazy&mode=ro")
	if err := bad.Ping(); err == nil {
		t.Fatal("an ursula-lazy URI without url opened")
	}
}

// TestMattnLazyFollow: with follow=1, a new transaction sees new commits while a long
// one keeps its offset.
func TestMattnLazyFollow(t *testing.T) {
	if err := mattnvfs.Register(nil); err != nil {
		t.Fatal(err)
	}
	streamURL := testserver.Start(t, testserver.Options{ClusterID: "mattnvfs-test"}).URL + "/dbs1/lazy-mattn-live"
	o := startOwner(t, streamURL)
	o.exec(t, `CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, blob BLOB)`)
	o.exec(t, `CREATE TABLE tags(note INTEGER, tag TEXT)`)
	o.notes(t, 1, 300)
	publishSnapshot(t, streamURL)
	o.notes(t, 301, 10)
	db := openLazy(t, mattnvfs.DSN(streamURL, "", true))
	db.SetMaxOpenConns(2)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM notes`).Scan(&n); err != nil || n != 310 {
		t.Fatalf("in the transaction: %d rows, %v; want 310", n, err)
	}
	o.notes(t, 1000, 50)
	o.exec(t, `UPDATE notes SET body = 'live' WHERE id < 50`)
	for i := 0; ; i++ {
		var live int
		if err := db.QueryRow(`SELECT count(*), coalesce(sum(body = 'live'), 0) FROM notes`).Scan(&n, &live); err != nil {
			t.Fatal(err)
		}
		if n == 360 && live == 49 {
			break
		}
		if i > 800 { // 20 s
			t.Fatalf("the follower sees %d rows, %d updated; want 360 and 49", n, live)
		}
		waitABit()
	}
	if err := tx.QueryRow(`SELECT count(*) FROM notes`).Scan(&n); err != nil || n != 310 {
		t.Fatalf("the long transaction sees %d rows, %v; want its snapshot of 310", n, err)
	}
}
