package pagecache

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestDrop: a file written and synced is in the page cache; after Drop it is not.
func TestDrop(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat([]byte("page"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	r, n, err := Resident(p)
	if err != nil {
		t.Skipf("page-cache residency unavailable: %v", err)
	}
	if r < n/2 {
		t.Skipf("a file just written has %d of %d pages cached: this filesystem does not show page-cache residency", r, n)
	}
	Drop(f)
	if r, n, _ := Resident(p); r > n/8 {
		t.Fatalf("%d of %d pages stay cached after Drop", r, n)
	}
	DropPath(filepath.Join(t.TempDir(), "missing")) // no panic, no error to see
}
