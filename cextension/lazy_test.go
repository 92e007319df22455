package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

// lazyQueries are point lookups, range scans, joins and aggregates whose answers print
// the same from the sqlite3 CLI and from Python (no floats, no blobs).
var lazyQueries = []string{
	`SELECT body FROM notes WHERE id = 7;`,
	`SELECT id, body FROM notes WHERE id BETWEEN 300 AND 330 ORDER BY id;`,
	`SELECT count(*), sum(length(body)), sum(length(blob)) FROM notes;`,
	`SELECT n.id, t.tag FROM notes n JOIN tags t ON t.note = n.id WHERE t.tag = 'tag 3' AND n.id < 400 ORDER BY n.id;`,
	`SELECT t.tag, count(*) FROM tags t JOIN notes n ON n.id = t.note GROUP BY t.tag ORDER BY t.tag;`,
}

// lazyStream writes a replicated database of notes and tags with a published snapshot in
// the middle, and returns its URL, an offset before the snapshot, and the tail.
func lazyStream(t *testing.T, e *env, name string) (string, uint64, uint64) {
	t.Helper()
	streamURL := e.base + "/lazyext/" + name
	owner, err := vfs.Open(streamURL, vfs.Options{Path: filepath.Join(e.dir, name+"-owner.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	exec := func(q string, args ...any) {
		if _, err := owner.Exec(q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	notes := func(from, n int) {
		exec(`INSERT INTO notes(id, body, blob) SELECT value, 'note ' || value, randomblob(200 + value % 300) FROM generate_series(?, ?)`, from, from+n-1)
		exec(`INSERT INTO tags(note, tag) SELECT value, 'tag ' || (value % 17) FROM generate_series(?, ?)`, from, from+n-1)
	}
	exec(`CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT, blob BLOB)`)
	exec(`CREATE TABLE tags(note INTEGER, tag TEXT)`)
	exec(`CREATE INDEX tags_note ON tags(note)`)
	notes(1, 1000)
	before := headTail(t, streamURL)
	notes(1001, 500)
	publish(t, streamURL)
	exec(`DELETE FROM notes WHERE id % 5 = 0`)
	exec(`UPDATE notes SET body = 'changed ' || id WHERE id BETWEEN 300 AND 310`)
	notes(3000, 100)
	return streamURL, before, headTail(t, streamURL)
}

func headTail(t *testing.T, streamURL string) uint64 {
	t.Helper()
	c, _ := client.New("")
	info, err := c.Head(context.Background(), streamURL)
	if err != nil {
		t.Fatal(err)
	}
	off, _ := streamcore.ParseOffset(info.NextOffset)
	return off
}

// publish publishes a snapshot of the stream's tail, as an owner's cycle would.
func publish(t *testing.T, streamURL string) {
	t.Helper()
	c, _ := client.New("")
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "snap.db")
	img, err := replicator.Restore(ctx, c, streamURL, path, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	image, _ := os.ReadFile(path)
	blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: img.Tail}, image)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishSnapshot(ctx, streamURL, streamcore.FormatOffset(img.Tail), "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}
}

// fullAnswers restores the stream as of at and runs the queries on the file with the
// plain sqlite3 CLI.
func fullAnswers(t *testing.T, streamURL string, at uint64) string {
	t.Helper()
	c, _ := client.New("")
	path := filepath.Join(t.TempDir(), "full.db")
	if _, err := replicator.Restore(context.Background(), c, streamURL, path, at, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatal(err)
	}
	return run(t, strings.Join(lazyQueries, "\n"), nil, "sqlite3", path)
}

// lazyURI is the URI of a lazy open, its parameters percent-encoded.
func lazyURI(streamURL string, at uint64) string {
	u := "file:lazy.db?vfs=ursula-lazy&url=" + url.QueryEscape(streamURL)
	if at != 0 {
		u += fmt.Sprintf("&at=%d", at)
	}
	return u
}

// TestLazyCLI: in the sqlite3 CLI, after .load, .open of a vfs=ursula-lazy URI answers
// point lookups, range scans and joins as a full download does, at the tail and at a
// past offset, and refuses writes.
func TestLazyCLI(t *testing.T) {
	e := setup(t)
	streamURL, before, tail := lazyStream(t, e, "cli")
	for _, at := range []uint64{tail, before} {
		script := fmt.Sprintf(".bail on\n.load %s\n.open %s\n%s\n", strings.TrimSuffix(e.so, ".so"), lazyURI(streamURL, at), strings.Join(lazyQueries, "\n"))
		got := run(t, script, nil, "sqlite3")
		if want := fullAnswers(t, streamURL, at); got != want || !strings.Contains(got, "note 7") {
			t.Fatalf("at %d: lazy\n%.500s\nfull\n%.500s", at, got, want)
		}
	}
	out, err := runErr(fmt.Sprintf(".load %s\n.open %s\nINSERT INTO notes(id) VALUES (99999);\n", strings.TrimSuffix(e.so, ".so"), lazyURI(streamURL, 0)), nil, "sqlite3")
	if err == nil || !strings.Contains(out, "readonly") {
		t.Fatalf("a write through ursula-lazy: %v\n%s", err, out)
	}
	out, _ = runErr(fmt.Sprintf(".load %s\n.open file:x.db?vfs=ursula-lazy\nSELECT 'opened';\n", strings.TrimSuffix(e.so, ".so")), nil, "sqlite3")
	if !strings.Contains(out, "no url parameter") || !strings.Contains(out, "unable to open") {
		t.Fatalf("an ursula-lazy URI without url:\n%s", out)
	}
}

// TestLazyPython: Python's sqlite3 module, after loading the extension, connects to a
// vfs=ursula-lazy URI and gets the answers of a full download.
func TestLazyPython(t *testing.T) {
	e := setup(t)
	streamURL, before, tail := lazyStream(t, e, "py")
	for _, at := range []uint64{tail, before} {
		script := fmt.Sprintf(`
db = sqlite3.connect(%q, uri=True)
for sql in %s:
    for row in db.execute(sql):
        print("|".join("" if v is None else str(v) for v in row))
`, lazyURI(streamURL, at), pyList(lazyQueries))
		if got, want := python(t, e, nil, script), fullAnswers(t, streamURL, at); got != want {
			t.Fatalf("at %d: python lazy\n%.500s\nfull\n%.500s", at, got, want)
		}
	}
}

func pyList(qs []string) string {
	var b strings.Builder
	b.WriteString("[")
	for _, q := range qs {
		fmt.Fprintf(&b, "%q, ", q)
	}
	b.WriteString("]")
	return b.String()
}

// TestLazyOpenFunction: ursula_lazy_open registers a plain path (which does not exist) as
// a lazy database; a plain open of it through the default ursula VFS (as better-sqlite3
// does) answers as a full download at the tail and at a past offset, refuses writes,
// creates no file, and a bad URL or argument is a clear error from the function.
func TestLazyOpenFunction(t *testing.T) {
	e := setup(t)
	streamURL, before, tail := lazyStream(t, e, "named")
	load := ".bail on\n.load " + strings.TrimSuffix(e.so, ".so") + "\n"
	for i, at := range []uint64{tail, before} {
		name := filepath.Join(e.dir, fmt.Sprintf("named-%d.db", i))
		script := fmt.Sprintf("%sSELECT ursula_lazy_open('%s', '%s', %d);\n.open %s\n%s\n", load, name, streamURL, at, name, strings.Join(lazyQueries, "\n"))
		got := run(t, script, nil, "sqlite3")
		want := fmt.Sprintf("%020d\n", at) + fullAnswers(t, streamURL, at)
		if got != want {
			t.Fatalf("at %d: lazy name\n%.500s\nfull\n%.500s", at, got, want)
		}
		if _, err := os.Stat(name); !os.IsNotExist(err) {
			t.Fatalf("the lazy name %s exists on disk: %v", name, err)
		}
	}
	name := filepath.Join(e.dir, "named-w.db")
	out, err := runErr(fmt.Sprintf("%sSELECT ursula_lazy_open('%s', '%s');\n.open %s\nINSERT INTO notes(id) VALUES (99999);\n", load, name, streamURL, name), nil, "sqlite3")
	if err == nil || !strings.Contains(out, "readonly") {
		t.Fatalf("a write to a lazy name: %v\n%s", err, out)
	}
	out, err = runErr(fmt.Sprintf("%sSELECT ursula_lazy_open('%s', '%s');\nSELECT ursula_attach('%s', '%s');\n", load, name, streamURL, name, streamURL), nil, "sqlite3")
	if err == nil || !strings.Contains(out, "ursula_attach: in_use") {
		t.Fatalf("attaching a lazy name: %v\n%s", err, out)
	}
	for _, c := range []struct{ args, want string }{
		{`'` + name + `', '` + e.base + `/lazyext/absent'`, "ursula_lazy_open: not_found"},
		{`'` + name + `', 'nohost'`, "ursula_lazy_open: invalid_url"},
		{`'` + name + `', '` + streamURL + `', 'soon'`, "ursula_lazy_open: invalid_argument: at=\"soon\""},
		{`'` + name + `'`, "ursula_lazy_open: invalid_argument"},
	} {
		out, err := runErr(fmt.Sprintf("%sSELECT ursula_lazy_open(%s);\n", load, c.args), nil, "sqlite3")
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("ursula_lazy_open(%s): %v\n%s\nwant %q", c.args, err, out, c.want)
		}
	}
}
