package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages counts the pages of the file at p that are in the page cache.
func residentPages(t *testing.T, p string) (resident, total int) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec)
}

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
	if r, n := residentPages(t, plain); r < n/2 {
		t.Skipf("a file just written has %d of %d pages cached: this filesystem does not show page-cache residency", r, n)
	}
	if r, n := residentPages(t, filepath.Join(dir, "p", "obj")); r > n/8 {
		t.Fatalf("%d of %d pages of the object stay in the page cache after Put", r, n)
	}
}
