package vfs

import (
	"database/sql"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/replicator"
)

// TestNaming: checklist-vfs H, T49. Spellings of one stream share a file; different
// streams never do; names stay within 104 safe characters.
func TestNaming(t *testing.T) {
	same := [][]string{
		{"http://127.0.0.1:4437/demo/notes", "HTTP://127.0.0.1:4437/demo/notes/", "http://127.0.0.1:4437/demo/./x/../notes", "http://user:pw@127.0.0.1:4437/demo/notes", "http://127.0.0.1:4437/demo/%6Eotes"},
		{"http://example.test/a/b", "http://EXAMPLE.test:80/a/b"},
		{"https://example.test/a/b", "https://example.test:443/a/b"},
	}
	seen := map[string]string{}
	for _, group := range same {
		var first string
		for _, u := range group {
			n, err := DefaultFileName(u)
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first = n
			} else if n != first {
				t.Errorf("%s -> %s, want %s", u, n, first)
			}
		}
		if prev, ok := seen[first]; ok {
			t.Errorf("%s collides with %s", group[0], prev)
		}
		seen[first] = group[0]
	}
	ok := regexp.MustCompile(`^[a-z0-9_][a-z0-9_-]*-[0-9a-f]{32}\.db$`)
	for u, label := range map[string]string{
		"http://127.0.0.1:4438/demo/notes":       "demo-notes",
		"http://h/":                              "stream",
		"http://h/only":                          "only",
		"http://h/a/b/Caf%C3%A9%20Menu":          "b-caf_menu",
		"http://h/-lead/x":                       "_lead-x",
		"http://h/x/" + strings.Repeat("y", 300): "x-" + strings.Repeat("y", 62),
		"http://localhost:4437/demo/notes":       "demo-notes",
		"http://h/a/%2Fslash":                    "a-_slash",
	} {
		n, err := DefaultFileName(u)
		if err != nil {
			t.Fatal(err)
		}
		if !ok.MatchString(n) || len(n) > 104+3 || !strings.HasPrefix(n, label+"-") {
			t.Errorf("%s -> %q, want label %q", u, n, label)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("%s collides with %s", u, prev)
		}
		seen[n] = u
	}
	for _, p := range []string{":memory:", "file:x.db"} {
		if _, err := localPath("http://h/a/b", p); err == nil {
			t.Errorf("%s accepted", p)
		}
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	p, err := localPath("http://127.0.0.1:4437/demo/notes", "")
	if err != nil || !strings.Contains(p, "/sqlite-ursula/demo-notes-") {
		t.Fatalf("%s %v", p, err)
	}
}

// TestReadOnlySlots: read-only opens without a Path use <name>-ro1.db .. -ro8.db beside
// the owner's default file; a ninth is in_use (checklist-vfs H54, H59, T43).
func TestReadOnlySlots(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	base := startServer(t)
	url := base + "/slots/db"
	owner, err := Open(url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	mustExec(t, owner, `CREATE TABLE t(x)`)
	mustExec(t, owner, `INSERT INTO t VALUES (1)`)
	var readers []*sql.DB
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	for n := 1; n <= 8; n++ {
		r, err := Open(url, Options{ReadOnly: true})
		if err != nil {
			t.Fatalf("reader %d: %v", n, err)
		}
		readers = append(readers, r)
		if c := count(t, r, `SELECT count(*) FROM t`); c != 1 {
			t.Fatalf("reader %d sees %d rows", n, c)
		}
		if _, err := r.Exec(`INSERT INTO t VALUES (2)`); err == nil {
			t.Fatalf("reader %d wrote", n)
		}
	}
	_, err = Open(url, Options{ReadOnly: true})
	if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindInUse || !strings.Contains(e.Message, "Options.Path") {
		t.Fatalf("ninth reader: %v", err)
	}
	readers[3].Close()
	readers = append(readers[:3], readers[4:]...)
	r, err := Open(url, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("a freed slot is not reused: %v", err)
	}
	readers = append(readers, r)
	mustExec(t, owner, `INSERT INTO t VALUES (3)`) // the owner is not fenced by readers
}

// TestNamingNodeList: a URL naming several nodes names one file whatever the order and
// spelling of its nodes (the same bytes as the Python and Node bindings); another node
// set is another file; a malformed list is invalid_url.
func TestNamingNodeList(t *testing.T) {
	for _, tc := range []struct{ urls []string }{
		{[]string{"http://a:1,B:2,c:80/x/y", "http://c,b:2,A:1/x/./y/", "http://b:02,c:80,a:1/x/y"}},
		{[]string{"https://n1:443,[::1]:4437/db/s", "https://[::1]:4437,N1/db/s"}},
	} {
		want := map[string]string{
			"http":  "x-y-5649da43f433253136a7a9fa86fef73b.db",
			"https": "db-s-9e50e69eae9de9021c8bbc863fc7c677.db",
		}[strings.Split(tc.urls[0], ":")[0]]
		for _, u := range tc.urls {
			if got, err := DefaultFileName(u); err != nil || got != want {
				t.Errorf("%s -> %s %v, want %s", u, got, err, want)
			}
		}
	}
	if a, _ := DefaultFileName("http://a:1,b:2/x/y"); a == "x-y-5649da43f433253136a7a9fa86fef73b.db" {
		t.Error("two of the three nodes name the same file as all three")
	}
	for _, bad := range []string{"http://a:1,,c:3/x/y", "http://a:1,b:x/x/y", "http://a:1,a:1/x/y"} {
		_, err := Open(bad, Options{Path: filepath.Join(t.TempDir(), "bad.db")})
		if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindInvalidURL {
			t.Errorf("Open(%s): %v, want invalid_url", bad, err)
		}
	}
}
