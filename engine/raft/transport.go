package raftengine

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
)

// Mux carries the Raft traffic of every group over one cluster listener: a TCP listener
// of its own (server.cluster_listen), or the node's HTTP listener, whose upgrade route
// hands Raft connections over (UpgradeListener, upgrade.go).
//
// Each stream starts with an 8-byte preamble: the magic "URG1" then the group id (uint32
// big endian). The mux hands the rest of the stream to that group's
// raft.NetworkTransport, so every group keeps hashicorp/raft's own wire protocol,
// pipelining and connection pool. A stream whose preamble is "URP1" and four zero bytes
// carries one request of the engine's peer channel (peer.go) instead. With a shared peer
// connection (Config.SharedPeerConnection) this node dials every stream inside one yamux
// session per peer (session.go): a physical connection starts with "URS1" and carries
// every group's streams. Otherwise, and always on the accepting side, a physical
// connection that starts with "URG1" or "URP1" is one stream by itself.
type Mux struct {
	ln      net.Listener
	adv     net.Addr
	advName string // this node's cluster address as peers dial it (announced in sessions)
	mu      sync.Mutex
	groups  map[uint32]*streamLayer
	peers   func(net.Conn) // handler of peer-channel connections
	// clientTLS, when set, wraps every outgoing peer connection (mutual TLS); set once
	// before any dial.
	clientTLS *tls.Config
	done      chan struct{}
	once      sync.Once

	smu      sync.Mutex
	sessions map[string]*sessEntry // peer address -> its session
	live     map[*yamux.Session]struct{}
	closed   bool
	logOut   io.Writer // the sessions' errors (SetLog)
	// shared: dial every stream inside one session per peer (session.go); else each
	// stream is a physical connection of its own. Set once before any dial.
	shared bool

	links linkState // framed pipelines (pipeline.go)
}

// SetLog sends the sessions' errors to w (default: discarded); before any dial.
func (m *Mux) SetLog(w io.Writer) { m.logOut = w }

// stringAddr is an advertised address that is no TCP address (a client URL).
type stringAddr string

func (a stringAddr) Network() string { return "ursula" }
func (a stringAddr) String() string  { return string(a) }

var muxMagic = [4]byte{'U', 'R', 'G', '1'}

// NewMux starts accepting on ln. advertise is the address peers dial to reach this node
// (the listener's address when empty; it differs when a proxy sits in front).
func NewMux(ln net.Listener, advertise string) *Mux {
	var adv net.Addr = ln.Addr()
	if advertise != "" {
		if a, err := net.ResolveTCPAddr("tcp", advertise); err == nil {
			adv = a
		} else {
			adv = stringAddr(advertise)
		}
	}
	m := &Mux{ln: ln, adv: adv, advName: advertise, groups: map[uint32]*streamLayer{}, done: make(chan struct{}),
		sessions: map[string]*sessEntry{}, live: map[*yamux.Session]struct{}{}, logOut: io.Discard}
	go m.accept()
	return m
}

// Addr is the advertised address.
func (m *Mux) Addr() net.Addr { return m.adv }

// Close stops the listener and every group layer.
func (m *Mux) Close() error {
	m.once.Do(func() { close(m.done) })
	err := m.ln.Close()
	m.closeSessions()
	m.closeLinks()
	return err
}

func (m *Mux) accept() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go m.route(c, true)
	}
}

// route serves one connection of the listener (physical) or one stream of a session by
// its preamble.
func (m *Mux) route(c net.Conn, physical bool) {
	var pre [8]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, pre[:4]); err != nil {
		c.Close()
		return
	}
	if physical && [4]byte(pre[:4]) == sessMagic {
		m.acceptSession(c)
		return
	}
	if _, err := io.ReadFull(c, pre[4:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	if [4]byte(pre[:4]) == peerMagic {
		m.mu.Lock()
		serve := m.peers
		m.mu.Unlock()
		if serve == nil {
			c.Close()
			return
		}
		serve(c)
		return
	}
	if [4]byte(pre[:4]) == linkMagic {
		m.serveLink(c)
		return
	}
	if [4]byte(pre[:4]) != muxMagic {
		c.Close()
		return
	}
	g := binary.BigEndian.Uint32(pre[4:])
	m.mu.Lock()
	sl := m.groups[g]
	m.mu.Unlock()
	if sl == nil {
		c.Close()
		return
	}
	select {
	case sl.conns <- c:
	case <-sl.closed:
		c.Close()
	case <-m.done:
		c.Close()
	}
}

// HandlePeers sets the handler of peer-channel connections (after their preamble).
func (m *Mux) HandlePeers(serve func(net.Conn)) {
	m.mu.Lock()
	m.peers = serve
	m.mu.Unlock()
}

// Layer returns the raft.StreamLayer of group.
func (m *Mux) Layer(group uint32) raft.StreamLayer {
	m.mu.Lock()
	defer m.mu.Unlock()
	sl := &streamLayer{m: m, group: group, conns: make(chan net.Conn, 16), closed: make(chan struct{})}
	m.groups[group] = sl
	return sl
}

type streamLayer struct {
	m      *Mux
	group  uint32
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// PeerTLS is the mutual TLS of the peer transport: Server for the cluster listener
// (which must require and verify client certificates), Client for dialing peers.
type PeerTLS struct {
	Server *tls.Config
	Client *tls.Config
}

// dialConn opens a physical connection to the node at addr: TCP to a cluster listener
// (host:port), or an HTTP upgrade at a client URL (upgrade.go). Over TLS when the mux has
// a client config (the handshake is done here, so that a refused certificate fails the
// dial); at a URL that TLS runs inside the upgraded connection.
func (m *Mux) dialConn(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	host := addr
	if isURL(addr) {
		c, host, err = dialUpgrade(ctx, addr, m.clientTLS != nil)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		host, _, _ = net.SplitHostPort(addr)
	}
	if err != nil || m.clientTLS == nil {
		return c, err
	}
	cfg := m.clientTLS
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// Dial opens a connection to the group on the node at address.
func (l *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	// A member added at run time carries its client URL in its Raft address (lifecycle.go).
	raftAddr, _ := splitAddr(string(address))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c, err := l.m.dial(ctx, raftAddr)
	cancel()
	if err != nil {
		return nil, err
	}
	var pre [8]byte
	copy(pre[:4], muxMagic[:])
	binary.BigEndian.PutUint32(pre[4:], l.group)
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write(pre[:]); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}

func (l *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, errors.New("raftengine: group transport closed")
	case <-l.m.done:
		return nil, errors.New("raftengine: cluster listener closed")
	}
}

func (l *streamLayer) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.m.mu.Lock()
		if l.m.groups[l.group] == l {
			delete(l.m.groups, l.group)
		}
		l.m.mu.Unlock()
	})
	return nil
}

func (l *streamLayer) Addr() net.Addr { return l.m.adv }
