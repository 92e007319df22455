//go:build unix

package raftlog

import (
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive advisory lock on f so that two processes never
// append to the same journal. The kernel drops it when the process dies.
func lockDir(f *os.File, dir string) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("raftlog: %s is in use by another process: %w", dir, err)
	}
	return nil
}
