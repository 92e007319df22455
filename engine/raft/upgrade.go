package raftengine

// One port per node: without a cluster listener of its own, a node's Raft traffic
// arrives on its HTTP client listener. A peer sends
//
//	GET /__ursula/raft HTTP/1.1
//	Connection: Upgrade
//	Upgrade: ursula-raft
//
// the server answers 101 Switching Protocols and hands the connection (after TLS, on an
// https listener) to the engine's UpgradeListener; from there on it is a connection of the
// cluster listener: with peer TLS configured, the mutual TLS handshake comes next, inside
// the upgraded connection, then the session preamble (session.go). The peer's address in
// the Raft configuration is its client URL ("http://host:port" or "https://...").

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

const (
	// UpgradePath is the route of the upgrade on the client listener.
	UpgradePath = "/__ursula/raft"
	// UpgradeProtocol is the Upgrade header's token.
	UpgradeProtocol = "ursula-raft"
)

func isURL(addr string) bool {
	return strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://")
}

// UpgradeListener is the cluster listener of a node whose Raft traffic comes through its
// HTTP listener: Config.Listener takes it, and the HTTP server's upgrade route hands it
// each upgraded connection (ServeRaftUpgrade).
type UpgradeListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewUpgradeListener returns a listener reporting addr (the HTTP listener's).
func NewUpgradeListener(addr net.Addr) *UpgradeListener {
	return &UpgradeListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *UpgradeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *UpgradeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *UpgradeListener) Addr() net.Addr { return l.addr }

// Serve hands over an upgraded connection; false once the listener is closed (the
// caller then closes c).
func (l *UpgradeListener) Serve(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

// ServeRaftUpgrade takes a connection the HTTP server upgraded to Raft; false when this
// node's Raft traffic does not come through its HTTP listener, or it is closing.
func (e *Engine) ServeRaftUpgrade(c net.Conn) bool {
	ul, ok := e.cfg.Listener.(*UpgradeListener)
	return ok && e.mux != nil && ul.Serve(c)
}

// RaftUpgradeAuthenticated reports whether upgraded peers must prove their identity
// with mutual TLS (raft.tls_ca_file) before any Raft byte is read.
func (e *Engine) RaftUpgradeAuthenticated() bool { return e.cfg.PeerTLS != nil }

// dialUpgrade connects to the HTTP listener at rawURL and upgrades the connection to
// Raft. It returns the connection and the host name for TLS. The https server's
// certificate is verified against the system roots, unless innerTLS: then peer identity
// is proven by the mutual TLS that follows inside the upgraded connection, which checks
// both ends against the cluster CA.
func dialUpgrade(ctx context.Context, rawURL string, innerTLS bool) (net.Conn, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, "", fmt.Errorf("raftengine: peer url %q is not a URL", rawURL)
	}
	hostport := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		hostport = net.JoinHostPort(u.Hostname(), port)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return nil, "", err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if u.Scheme == "https" {
		tc := tls.Client(c, &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"},
			InsecureSkipVerify: innerTLS, MinVersion: tls.VersionTLS12}) //nolint:gosec // see above
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, "", err
		}
		c = tc
	}
	path := strings.TrimRight(u.Path, "/") + UpgradePath
	req := "GET " + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeProtocol +
		"\r\nUser-Agent: ursula-raft\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, "", err
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("raftengine: raft upgrade at %s: %w", rawURL, err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		c.Close()
		return nil, "", fmt.Errorf("raftengine: raft upgrade at %s refused: %s: %s", rawURL, res.Status, bytes.TrimSpace(b))
	}
	if !strings.EqualFold(res.Header.Get("Upgrade"), UpgradeProtocol) {
		c.Close()
		return nil, "", errors.New("raftengine: raft upgrade at " + rawURL + ": the answer upgraded to another protocol")
	}
	c.SetDeadline(time.Time{})
	return withBuffered(c, br), u.Hostname(), nil
}

// withBuffered returns c, reading first what br already holds of it.
func withBuffered(c net.Conn, br *bufio.Reader) net.Conn {
	if br.Buffered() == 0 {
		return c
	}
	b, _ := br.Peek(br.Buffered())
	return &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(bytes.Clone(b)), c)}
}

type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }
