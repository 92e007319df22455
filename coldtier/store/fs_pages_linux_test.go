package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ursula-go/ursula/internal/pagecache"
)

// TestFSPutDropsPages: an object Put wrote (and fsynced) does not stay in the page
// cache; a plain file written the same way does (the check can see cached pages).
func TestFSPutDropsPages(t *testing.T) {
	dir := t.TempDir()
	st, err := NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("cold"), 2<<20) // 8 MiB
	if err := st.Put(context.Background(), "p/obj", bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, n, err := pagecache.Resident(plain); err != nil || r < n/2 {
		t.Skipf("a file just written has %d of %d pages cached (%v): this filesystem does not show page-cache residency", r, n, err)
	}
	if r, n, err := pagecache.Resident(filepath.Join(dir, "p", "obj")); err != nil || r > n/8 {
		t.Fatalf("%d of %d pages of the object stay in the page cache after Put (%v)", r, n, err)
	}
}
