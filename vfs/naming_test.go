package vfs

import (
	"regexp"
	"strings"
	"testing"
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
