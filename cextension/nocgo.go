//go:build !cgo

package main

import (
	"fmt"
	"os"
)

// Without cgo there is no extension to build: the package still compiles, so
// CGO_ENABLED=0 go build ./... passes, and says so if run.
func main() {
	fmt.Fprintln(os.Stderr, "cextension: the loadable extension needs cgo (go build -buildmode=c-shared with CGO_ENABLED=1)")
	os.Exit(2)
}
