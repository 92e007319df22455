//go:build !linux

package server

import "net"

// newReadAhead: the read-ahead (readahead_linux.go) is Linux only; elsewhere connections
// are read as they are.
func newReadAhead(net.Conn) readAheader { return nil }
