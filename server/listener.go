package server

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// connLimitAnswer is what a connection past the cap gets at once, before it is closed:
// a complete HTTP answer with the JSON error body, whatever the client sent.
const connLimitAnswer = "HTTP/1.1 503 Service Unavailable\r\n" +
	"Content-Type: application/json\r\n" +
	"Retry-After: 1\r\n" +
	"Connection: close\r\n" +
	"Content-Length: 95\r\n\r\n" +
	`{"error":{"code":"CONNECTION_LIMIT","message":"the node serves as many connections as it can"}}`

// ConnLimitListener caps the connections a listener has open at once. Past the cap, a new
// connection gets a 503 and is closed, so a flood of idle connections never runs the
// process out of descriptors and a client never hangs waiting to be accepted.
type ConnLimitListener struct {
	net.Listener
	max      int64
	open     atomic.Int64
	refused  atomic.Uint64
	accepted atomic.Uint64
}

// LimitConnections wraps ln so that at most max connections are open at once.
func LimitConnections(ln net.Listener, max int) *ConnLimitListener {
	return &ConnLimitListener{Listener: ln, max: int64(max)}
}

// Accept returns the next connection under the cap; those past it are answered and
// closed here.
func (l *ConnLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			go refuseConn(c)
			continue
		}
		l.accepted.Add(1)
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// refuseConn answers and closes a connection past the cap, bounded in time.
func refuseConn(c net.Conn) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write([]byte(connLimitAnswer))
	if tc, ok := c.(*net.TCPConn); ok {
		// Closing with unread request bytes would reset the connection and could drop
		// the answer before the client reads it: close the write side first.
		tc.CloseWrite()
		tc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var buf [512]byte
		for {
			if _, err := tc.Read(buf[:]); err != nil {
				break
			}
		}
	}
	c.Close()
}

// Open returns the connections open now.
func (l *ConnLimitListener) Open() int64 { return l.open.Load() }

// Refused returns how many connections were refused for the cap.
func (l *ConnLimitListener) Refused() uint64 { return l.refused.Load() }

type limitedConn struct {
	net.Conn
	l    *ConnLimitListener
	once sync.Once
}

// SyscallConn exposes the descriptor beneath, for the read-ahead (readahead_linux.go).
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
