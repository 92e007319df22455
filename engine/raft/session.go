package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// One physical connection per peer pair. Every group's Raft connections and every
// peer-channel request to a peer are streams of one yamux session over one connection
// (TCP, TLS, or an upgraded HTTP connection), so the AppendEntries of many groups share
// a socket. Under the session a coalescer batches the frames yamux writes while the
// previous batch is in its write syscall: under load the AppendEntries of many groups
// leave in one write.
//
// A session starts with the preamble "URS1", a uint32 length and the dialing node's own
// cluster address. The accepting node serves the streams the dialer opens, and also
// opens its own streams to that address on the same session, so two nodes share one
// connection whichever of them dialed first (both may dial at once: then each uses its
// own and both serve).

var sessMagic = [4]byte{'U', 'R', 'S', '1'}

const maxAdvertLen = 1024

// yamuxConfig tunes the sessions: a peer that stops answering pings for a few seconds
// loses its session (its streams fail and Raft redials), and a stream may have up to
// 1 MiB in flight so that large entries stream at loopback speed.
func (m *Mux) yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = m.logOut // a refused TLS handshake shows here ("remote error: tls")
	c.KeepAliveInterval = 2 * time.Second
	c.ConnectionWriteTimeout = 5 * time.Second
	c.StreamOpenTimeout = 15 * time.Second
	c.StreamCloseTimeout = time.Minute
	c.MaxStreamWindowSize = 1 << 20
	return c
}

// sessEntry is the session to one peer address; mu serialises dialing it.
type sessEntry struct {
	mu sync.Mutex
	s  *yamux.Session
}

func (m *Mux) entry(addr string) *sessEntry {
	m.smu.Lock()
	defer m.smu.Unlock()
	e := m.sessions[addr]
	if e == nil {
		e = &sessEntry{}
		m.sessions[addr] = e
	}
	return e
}

// session returns the live session to addr, dialing one when there is none.
func (m *Mux) session(ctx context.Context, addr string) (*yamux.Session, error) {
	e := m.entry(addr)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s != nil && !e.s.IsClosed() {
		return e.s, nil
	}
	select {
	case <-m.done:
		return nil, errors.New("raftengine: cluster transport closed")
	default:
	}
	c, err := m.dialConn(ctx, addr)
	if err != nil {
		return nil, err
	}
	pre := make([]byte, 0, 8+len(m.advName))
	pre = append(pre, sessMagic[:]...)
	pre = binary.BigEndian.AppendUint32(pre, uint32(len(m.advName)))
	pre = append(pre, m.advName...)
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	if _, err := c.Write(pre); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	s, err := yamux.Client(newCoalescer(c), m.yamuxConfig())
	if err != nil {
		c.Close()
		return nil, err
	}
	e.s = s
	m.track(s)
	go m.serveSession(s)
	return s, nil
}

// dial opens a stream to the node at addr (a host:port of a cluster listener, or a
// client URL whose HTTP listener carries Raft): inside the peer's session when the mux
// shares one connection per peer, else on a physical connection of its own.
func (m *Mux) dial(ctx context.Context, addr string) (net.Conn, error) {
	if !m.shared {
		return m.dialConn(ctx, addr) // a physical connection per stream (URG1/URP1)
	}
	for attempt := 0; ; attempt++ {
		s, err := m.session(ctx, addr)
		if err != nil {
			return nil, err
		}
		st, err := s.OpenStream()
		if err == nil {
			return st, nil
		}
		s.Close() // broken: the next attempt dials a fresh one
		if attempt > 0 || ctx.Err() != nil {
			return nil, fmt.Errorf("raftengine: open stream to %s: %w", addr, err)
		}
	}
}

// acceptSession serves a session a peer dialed (c is past the magic).
func (m *Mux) acceptSession(c net.Conn) {
	var n [4]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, n[:]); err != nil {
		c.Close()
		return
	}
	l := binary.BigEndian.Uint32(n[:])
	if l > maxAdvertLen {
		c.Close()
		return
	}
	name := make([]byte, l)
	if _, err := io.ReadFull(c, name); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	s, err := yamux.Server(newCoalescer(c), m.yamuxConfig())
	if err != nil {
		c.Close()
		return
	}
	m.track(s)
	if len(name) > 0 {
		// Reuse it for this node's own streams to the dialer, unless a session to it
		// exists or is being dialed.
		e := m.entry(string(name))
		if e.mu.TryLock() {
			if e.s == nil || e.s.IsClosed() {
				e.s = s
			}
			e.mu.Unlock()
		}
	}
	m.serveSession(s)
}

// serveSession routes every stream the peer opens on s like a connection of the cluster
// listener (a group's Raft connection or a peer-channel request).
func (m *Mux) serveSession(s *yamux.Session) {
	defer m.untrack(s)
	for {
		st, err := s.AcceptStream()
		if err != nil {
			s.Close()
			return
		}
		go m.route(st, false)
	}
}

func (m *Mux) track(s *yamux.Session) {
	m.smu.Lock()
	m.live[s] = struct{}{}
	closed := m.closed
	m.smu.Unlock()
	if closed {
		s.Close()
	}
}

func (m *Mux) untrack(s *yamux.Session) {
	m.smu.Lock()
	delete(m.live, s)
	m.smu.Unlock()
}

// closeSessions ends every session (Mux.Close).
func (m *Mux) closeSessions() {
	m.smu.Lock()
	m.closed = true
	ss := make([]*yamux.Session, 0, len(m.live))
	for s := range m.live {
		ss = append(ss, s)
	}
	m.smu.Unlock()
	for _, s := range ss {
		s.Close()
	}
}

// coalescer sits under a yamux session and writes its frames in batches. yamux writes
// each frame as a 12-byte header then its body, from one goroutine, and waits for each
// write; the coalescer takes them into a buffer at once, and a flusher writes whatever
// whole frames have gathered in one write call. While a write is in the kernel, the
// frames of other groups and streams gather behind it and leave together in the next.
// Writes block while coalesceMax bytes wait, and an error of the connection is answered
// to every later write (yamux then closes the session).
type coalescer struct {
	net.Conn
	mu    sync.Mutex
	room  *sync.Cond
	buf   []byte // waiting bytes
	mark  int    // buf[:mark] ends on a frame boundary
	spare []byte
	need  int // body bytes of the data frame in progress
	err   error
	kick  chan struct{}
	done  chan struct{}
	once  sync.Once
}

const (
	coalesceMax     = 1 << 20
	yamuxHeaderLen  = 12
	yamuxTypeData   = 0
	yamuxProtoVer   = 0
	maxSpareBufSize = 4 << 20
)

var errCoalescerClosed = errors.New("raftengine: connection closed")

func newCoalescer(c net.Conn) *coalescer {
	w := &coalescer{Conn: c, kick: make(chan struct{}, 1), done: make(chan struct{})}
	w.room = sync.NewCond(&w.mu)
	go w.flushLoop()
	return w
}

func (w *coalescer) Write(p []byte) (int, error) {
	w.mu.Lock()
	for w.err == nil && len(w.buf) >= coalesceMax {
		w.room.Wait()
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return 0, err
	}
	w.buf = append(w.buf, p...)
	if frameEnds(&w.need, p) || len(w.buf) >= coalesceMax {
		w.mark = len(w.buf)
	}
	ready := w.mark > 0
	w.mu.Unlock()
	if ready {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// frameEnds tracks yamux framing across writes: it reports whether the bytes written so
// far end a frame. need carries the body bytes still due of the data frame in progress.
// A write that is not a header where one is due counts as a boundary (never holding
// bytes back).
func frameEnds(need *int, p []byte) bool {
	if *need > 0 {
		*need = max(*need-len(p), 0)
		return *need == 0
	}
	if len(p) == yamuxHeaderLen && p[0] == yamuxProtoVer && p[1] == yamuxTypeData {
		*need = int(binary.BigEndian.Uint32(p[8:12]))
		return *need == 0
	}
	return true
}

func (w *coalescer) flushLoop() {
	for {
		select {
		case <-w.kick:
		case <-w.done:
			return
		}
		w.mu.Lock()
		if w.mark == 0 || w.err != nil {
			w.mu.Unlock()
			continue
		}
		out := w.buf[:w.mark]
		w.buf = append(w.spare[:0], w.buf[w.mark:]...)
		w.mark = 0
		w.mu.Unlock()
		_, err := w.Conn.Write(out)
		w.mu.Lock()
		if cap(out) <= maxSpareBufSize {
			w.spare = out[:0]
		} else {
			w.spare = nil
		}
		if err != nil && w.err == nil {
			w.err = err
		}
		w.room.Broadcast()
		again := w.mark > 0
		w.mu.Unlock()
		if err != nil {
			w.Conn.Close()
			return
		}
		if again {
			select {
			case w.kick <- struct{}{}:
			default:
			}
		}
	}
}

func (w *coalescer) Close() error {
	var err error
	w.once.Do(func() {
		w.mu.Lock()
		if w.err == nil {
			w.err = errCoalescerClosed
		}
		w.room.Broadcast()
		w.mu.Unlock()
		close(w.done)
		err = w.Conn.Close()
	})
	return err
}
