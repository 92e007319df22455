//go:build !unix

package raftlog

import "os"

// lockDir is a no-op where flock is not available.
func lockDir(*os.File, string) error { return nil }
