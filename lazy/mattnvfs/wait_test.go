//go:build cgo

package mattnvfs_test

import "time"

func waitABit() { time.Sleep(25 * time.Millisecond) }
