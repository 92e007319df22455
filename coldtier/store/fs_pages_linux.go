package store

import (
	"os"

	"golang.org/x/sys/unix"
)

// dropPages lets the kernel reuse the page-cache pages of an object just written and
// fsynced (so clean). Why: on a virtual machine a page the kernel has not used lately is
// memory the host supplies again on first touch, and the flusher writes every appended
// byte once more. Measured on this project's test machine (128 files of 8 MiB, each
// written and fsynced): 1.5-2.5 s of system CPU per GiB when the pages stay cached,
// 0.26 s when each file's pages are dropped after its fsync, since the next file's
// write reuses them. A read of a fresh object then comes from the disk; the tier's own
// block cache sits in front of reads.
func dropPages(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
