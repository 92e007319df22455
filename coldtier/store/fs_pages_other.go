//go:build !linux

package store

import "os"

// dropPages: page-cache advice is given on Linux only.
func dropPages(*os.File) {}
