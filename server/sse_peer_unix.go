//go:build unix

package server

import (
	"net"
	"syscall"
)

// peerGone reports whether the client of a handed-over SSE connection closed it (or it
// failed), without waiting: a non-blocking read that finds the end of the stream or an
// error. Bytes a client sends on an event stream mean nothing and are dropped (at most a
// few hundred per look).
func peerGone(c net.Conn) bool {
	sc := socketOf(c)
	if sc == nil {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	var buf [256]byte
	rc.Read(func(fd uintptr) bool {
		for range 4 {
			n, err := syscall.Read(int(fd), buf[:])
			if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR {
				return true // nothing to read: the client is still there
			}
			if err != nil || n == 0 {
				gone = true
				return true
			}
		}
		return true
	})
	return gone
}
