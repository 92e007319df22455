package raftlog

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to begin writing [off, off+n) of f to disk
// without waiting for it. With FsyncNever this keeps the dirty data of the
// active segment small, so the fsync that seals a segment (and blocks every
// writer) has little left to do.
func startWriteback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// writeback writes [off, off+n) of f to disk and waits for it. The preparation of a
// segment (prealloc.go) paces itself with it, so the disk never holds more than one
// chunk of its zeros in its queue ahead of the journal's own fsyncs.
func writeback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
}
