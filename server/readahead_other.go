//go:build !linux

package server

import (
	"io"
	"net"
)

// newReadAhead: the read-ahead (readahead_linux.go) is Linux only; elsewhere connections
// are read as they are.
func newReadAhead(net.Conn) io.Reader { return nil }
