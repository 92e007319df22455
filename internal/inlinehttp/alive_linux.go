package inlinehttp

import (
	"net"
	"syscall"
)

// connAlive reports whether an idle connection is still open and quiet: a peek that
// neither blocks nor consumes finds no end of stream and no unasked-for bytes. net/http
// learns this from its reader goroutine; one non-blocking syscall does it here.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true // never wait for readiness
	})
	return err == nil && alive
}
