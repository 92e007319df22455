package server

// TLS terminated in the listener, so the connection wrapper of refusals.go sits above TLS
// and sees the HTTP library's canned refusals in clear. Handshakes run concurrently, each
// bounded in time, and Accept hands out only handshaken connections: one whose client
// chose HTTP/2 goes to the HTTP library as the *tls.Conn it needs to serve HTTP/2.

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"
)

// ALPN as http.Server.ServeTLS offers it by default: HTTP/2 first, then HTTP/1.1.
var serverNextProtos = []string{"h2", "http/1.1"}

// TLSListener terminates TLS on connections from ln with cfg (its NextProtos, when
// empty, become "h2" and "http/1.1", as http.Server.ServeTLS offers). Each handshake is
// bounded by handshakeTimeout (0: none). A client that speaks plain HTTP to it gets a 400
// with the JSON error body. Serve with hs.Serve (hs.TLSConfig left nil, or the same cfg),
// usually on JSONRefusals(hs, TLSListener(...)).
func TLSListener(ln net.Listener, cfg *tls.Config, handshakeTimeout time.Duration) net.Listener {
	cfg = cfg.Clone()
	if len(cfg.NextProtos) == 0 {
		cfg.NextProtos = serverNextProtos
	}
	l := &tlsListener{ln: ln, cfg: cfg, timeout: handshakeTimeout, ready: make(chan *tls.Conn),
		done: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	go l.acceptLoop()
	return l
}

type tlsListener struct {
	ln      net.Listener
	cfg     *tls.Config
	timeout time.Duration
	ready   chan *tls.Conn
	done    chan struct{}
	errOnce sync.Once
	err     error // the raw listener's fatal error, set before done closes

	mu      sync.Mutex
	closed  bool
	pending map[net.Conn]struct{} // raw connections in their handshake
}

func (l *tlsListener) acceptLoop() {
	var tempDelay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			var ne interface{ Temporary() bool }
			if errors.As(err, &ne) && ne.Temporary() {
				// Like http.Server: back off on EMFILE and the like, keep accepting.
				tempDelay = min(max(2*tempDelay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(tempDelay):
					continue
				case <-l.done:
					return
				}
			}
			l.fail(err)
			return
		}
		tempDelay = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.pending[c] = struct{}{}
		l.mu.Unlock()
		go l.handshake(c)
	}
}

func (l *tlsListener) handshake(raw net.Conn) {
	tc := tls.Server(raw, l.cfg)
	if l.timeout > 0 {
		raw.SetDeadline(time.Now().Add(l.timeout))
	}
	err := tc.Handshake()
	l.mu.Lock()
	delete(l.pending, raw)
	closed := l.closed
	l.mu.Unlock()
	if err != nil || closed {
		var re tls.RecordHeaderError
		if !closed && errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			raw.SetWriteDeadline(time.Now().Add(time.Second))
			ans, _ := jsonRefusal([]byte("HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"))
			raw.Write(ans)
		}
		raw.Close()
		return
	}
	raw.SetDeadline(time.Time{})
	select {
	case l.ready <- tc:
	case <-l.done:
		tc.Close()
	}
}

// looksLikeHTTP reports whether the first bytes of a would-be TLS record are an HTTP/1
// method, as net/http decides the client spoke plain HTTP to a TLS port.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "CONNE":
		return true
	}
	return false
}

func (l *tlsListener) fail(err error) {
	l.errOnce.Do(func() {
		l.err = err
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.done)
	})
}

// Accept returns the next connection whose handshake completed.
func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// Close stops accepting and closes the connections still in their handshake.
func (l *tlsListener) Close() error {
	err := l.ln.Close()
	l.fail(net.ErrClosed)
	l.mu.Lock()
	for c := range l.pending {
		c.Close()
	}
	l.mu.Unlock()
	return err
}

func (l *tlsListener) Addr() net.Addr { return l.ln.Addr() }
