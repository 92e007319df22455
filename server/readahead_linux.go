package server

// Read-ahead for plain TCP connections. net/http reads a connection through a 4 KiB
// buffer it does not let callers size, so a request whose head and body together pass
// 4 KiB (every 4 KiB append) costs a second read system call for its last bytes, although
// they were already in the socket at the first. A read here is one readv into the caller's
// buffer and, behind it, a pooled spill buffer: what the kernel had beyond the caller's
// buffer waits in the spill for the next read. The spill is held only while it has unread
// bytes, and taken only for the non-blocking attempt itself, never while a read waits:
// an idle connection holds no buffer.

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// spillSize is the spill buffer's size; a read of at least this much goes straight into
// the caller's buffer (a large body read gains nothing from a spill).
const spillSize = 16 << 10

var spillPool = sync.Pool{New: func() any { return new([spillSize]byte) }}

// readAhead is the read side of one connection with a spill buffer. Reads of a connection
// come one at a time (net/http's connection reader serializes them).
type readAhead struct {
	conn  net.Conn
	raw   syscall.RawConn
	spill *[spillSize]byte // nil while empty
	r, w  int              // the unread bytes are spill[r:w]
	// One read's arguments and results, kept here so the readv callback is allocated once.
	iov  [2][]byte
	n    int
	err  error
	call func(fd uintptr) bool
}

// newReadAhead returns a read-ahead over c, or nil when c is not a plain TCP connection
// (possibly under wrappers that expose SyscallConn).
func newReadAhead(c net.Conn) readAheader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	if _, tcp := c.LocalAddr().(*net.TCPAddr); !tcp {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	a := &readAhead{conn: c, raw: raw}
	a.call = a.readv
	return a
}

// Buffered is how many bytes the spill holds: read from the socket, not yet returned.
func (a *readAhead) Buffered() int {
	if a.spill == nil {
		return 0
	}
	return a.w - a.r
}

func (a *readAhead) Read(p []byte) (int, error) {
	if a.spill != nil {
		n := copy(p, a.spill[a.r:a.w])
		a.r += n
		if a.r == a.w {
			spillPool.Put(a.spill)
			a.spill = nil
		}
		return n, nil
	}
	if len(p) == 0 || len(p) >= spillSize {
		return a.conn.Read(p)
	}
	a.iov[0], a.n, a.err = p, 0, nil
	err := a.raw.Read(a.call)
	a.iov[0], a.iov[1] = nil, nil
	n := a.n
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err // the raw read's own wrapping: wrapped once below, as a read
	}
	if err == nil {
		err = a.err
	}
	if err == io.EOF {
		return n, err // as net.Conn answers the end of the stream: unwrapped
	}
	if err != nil {
		return n, &net.OpError{Op: "read", Net: "tcp", Source: a.conn.LocalAddr(), Addr: a.conn.RemoteAddr(), Err: err}
	}
	return n, nil
}

// readv is the RawConn callback: one non-blocking readv; false asks to wait for the
// socket to be readable (or its deadline) and try again.
func (a *readAhead) readv(fd uintptr) bool {
	spill := spillPool.Get().(*[spillSize]byte)
	a.iov[1] = spill[:]
	for {
		n, err := unix.Readv(int(fd), a.iov[:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			spillPool.Put(spill)
			return false
		}
		switch {
		case err != nil:
			a.err = os.NewSyscallError("readv", err)
			spillPool.Put(spill)
		case n == 0:
			a.err = io.EOF
			spillPool.Put(spill)
		case n > len(a.iov[0]):
			a.n = len(a.iov[0])
			a.spill, a.r, a.w = spill, 0, n-len(a.iov[0])
		default:
			a.n = n
			spillPool.Put(spill)
		}
		return true
	}
}
