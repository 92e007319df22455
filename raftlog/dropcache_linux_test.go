package raftlog

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// dropCache evicts the journal's (clean, fsynced) pages from the page cache,
// so the next Open reads from the device: a cold restart, without touching
// anyone else's cached files.
func dropCache(dir string) bool {
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, p := range segs {
		f, err := os.Open(p)
		if err != nil {
			return false
		}
		f.Sync()
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			return false
		}
	}
	return true
}
