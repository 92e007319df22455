package server

// The HTTP library's own refusals in the JSON error shape. net/http answers a request it
// cannot parse (a control byte in a header, a NUL or a broken %-escape in the target, a
// malformed request line, headers over MaxHeaderBytes, an unknown transfer coding, an
// Expect it does not support) before any handler runs, by writing a canned plain-text
// answer straight on the connection. A connection wrapper sees that write: while no
// handler has run since the connection was opened or went idle, every answer on it is the
// library's own, so a refusal written then is rewritten into the server's error body.

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/ursula-go/ursula/streamcore"
)

// JSONRefusals makes hs answer its parser's refusals on connections from ln with the
// JSON error body. It wraps hs.Handler and chains hs.ConnContext and hs.ConnState, so call
// it once hs is otherwise configured, and serve hs on the returned listener with hs.Serve.
// For TLS, ln is a TLSListener: the wrapper then sits above TLS, over each HTTP/1
// connection's *tls.Conn (the request still sees its TLS state); a connection whose client
// chose HTTP/2 passes unwrapped, since the library serves HTTP/2 only on a *tls.Conn and
// answers its protocol errors in HTTP/2 frames, not text.
func JSONRefusals(hs *http.Server, ln net.Listener) net.Listener {
	next := hs.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	hs.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := refusalConnOf(r); c != nil {
			c.armed.Store(false) // from here on the answer is the handler's
		}
		next.ServeHTTP(w, r)
	})
	connCtx := hs.ConnContext
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if connCtx != nil {
			ctx = connCtx(ctx, c)
		}
		if rc := findRefusalConn(c); rc != nil {
			ctx = context.WithValue(ctx, refusalConnKey{}, rc)
		}
		return ctx
	}
	connState := hs.ConnState
	hs.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateIdle {
			// The previous answer is written whole: the next write, until a handler
			// runs, is the library's.
			if rc := findRefusalConn(c); rc != nil {
				rc.armed.Store(true)
				rc.short.Store(false)
			}
		}
		if connState != nil {
			connState(c, st)
		}
	}
	return &refusalListener{Listener: ln}
}

type refusalConnKey struct{}

type refusalListener struct{ net.Listener }

func (l *refusalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*tls.Conn); ok {
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			return tc, nil
		}
		rc := &refusalTLSConn{refusalConn: refusalConn{Conn: tc}, tc: tc}
		rc.armed.Store(true)
		return rc, nil
	}
	rc := &refusalConn{Conn: c, ra: newReadAhead(c)}
	rc.armed.Store(true)
	return rc, nil
}

// refusalTLSConn is a refusalConn over a handshaken *tls.Conn. Its ConnectionState makes
// the library fill Request.TLS as it does for a *tls.Conn.
type refusalTLSConn struct {
	refusalConn
	tc *tls.Conn
}

func (c *refusalTLSConn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

// refusalConn rewrites the library's refusals while armed: from its accept, or its last
// return to idle, until a handler starts.
type refusalConn struct {
	net.Conn
	armed atomic.Bool
	ra    readAheader // the plain TCP connection's read-ahead (readahead_linux.go); nil: none
	// short is set from the start of a handler with short work (an append, see
	// shortHandler) until the connection is idle again: the library's background read
	// after the body then ends at once.
	short atomic.Bool
}

// readAheader is a connection's read-ahead (readahead_linux.go): its reads, and how many
// bytes it holds already read from the connection and not yet returned.
type readAheader interface {
	io.Reader
	Buffered() int
}

func (c *refusalConn) Read(p []byte) (int, error) {
	if c.ra != nil {
		if len(p) == 1 && c.short.Load() {
			// The library's background read (the only 1-byte read it makes), started
			// once the body is read to watch for a client that goes away or sends its
			// next request early; the library ends it when the handler returns by
			// moving the read deadline into the past, and waits for it. For a handler
			// that only appends that watch is worth nothing, and it costs a read system
			// call and two wake-ups per request. So it ends at once: with a byte
			// already read ahead, as a read; else with nothing (the library then reads
			// the next request as usual once the handler is done).
			if c.ra.Buffered() == 0 {
				return 0, nil
			}
		}
		return c.ra.Read(p)
	}
	return c.Conn.Read(p)
}

// shortHandler marks r's connection until it is idle again (its answer written), for a
// handler whose work ends soon without waiting on anything the client does (an append),
// called before it reads the body: the library's background read after that body then
// ends at once (refusalConn.Read). The mark lasts past the handler because that read's
// goroutine may first run when the library ends it, after the handler returned.
func shortHandler(r *http.Request) {
	if c := refusalConnOf(r); c != nil && c.ra != nil {
		c.short.Store(true)
	}
}

// refusalConnOf is the connection r came on, nil when JSONRefusals did not wrap it.
func refusalConnOf(r *http.Request) *refusalConn {
	c, _ := r.Context().Value(refusalConnKey{}).(*refusalConn)
	return c
}

func findRefusalConn(c net.Conn) *refusalConn {
	switch rc := c.(type) {
	case *refusalConn:
		return rc
	case *refusalTLSConn:
		return &rc.refusalConn
	}
	return nil
}

// CloseWrite half-closes the connection beneath where it can (TCP, TLS), as the library
// does after some answers so the client reads them before the close.
func (c *refusalConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *refusalConn) Write(p []byte) (int, error) {
	if c.armed.Load() {
		if ans, ok := jsonRefusal(p); ok {
			c.armed.Store(false)
			if _, err := c.Conn.Write(ans); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}

// maxRefusalBytes bounds what jsonRefusal looks at: the library's own answers are short.
const maxRefusalBytes = 1024

// jsonRefusal rewrites one complete plain-text HTTP/1 refusal (status 4xx or 5xx, its
// headers and body in p) into the same status with the JSON error body. ok is false when
// p is anything else, which then goes out unchanged.
func jsonRefusal(p []byte) (ans []byte, ok bool) {
	if len(p) > maxRefusalBytes || !bytes.HasPrefix(p, []byte("HTTP/1.")) {
		return nil, false
	}
	head, _, found := bytes.Cut(p, []byte("\r\n\r\n"))
	if !found {
		return nil, false
	}
	statusLine, _, _ := bytes.Cut(head, []byte("\r\n"))
	// "HTTP/1.x NNN Reason[: detail]"
	if len(statusLine) < 12 || statusLine[8] != ' ' {
		return nil, false
	}
	status, err := strconv.Atoi(string(statusLine[9:12]))
	if err != nil || status < 400 || status > 599 || (len(statusLine) > 12 && statusLine[12] != ' ') {
		return nil, false
	}
	var detail []byte
	if len(statusLine) > 13 {
		if _, d, has := bytes.Cut(statusLine[13:], []byte(": ")); has {
			detail = d
		}
	}
	e := libraryRefusal(status, string(detail), bytes.Contains(p, []byte("HTTP request to an HTTPS server")))
	body := e.Body()
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 ")
	b.WriteString(strconv.Itoa(status))
	b.WriteByte(' ')
	b.WriteString(http.StatusText(status))
	b.WriteString("\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ")
	b.WriteString(strconv.Itoa(len(body)))
	b.WriteString("\r\n\r\n")
	b.Write(body)
	return b.Bytes(), true
}

// libraryRefusal names a refusal of the HTTP library: the spec's generic codes (a 4xx no
// other code names is INVALID_REQUEST, a 5xx INTERNAL), INVALID_HEADER where the library
// says a header is at fault. Messages are fixed: nothing of the request is echoed.
func libraryRefusal(status int, detail string, plainToTLS bool) *streamcore.Error {
	switch {
	case plainToTLS:
		return streamcore.Errorf(status, streamcore.CodeInvalidRequest, "the client sent an HTTP request to an HTTPS server")
	case status == http.StatusRequestHeaderFieldsTooLarge:
		return streamcore.Errorf(status, streamcore.CodeInvalidRequest, "the request line and headers are too large")
	case status == http.StatusExpectationFailed:
		return streamcore.Errorf(status, streamcore.CodeInvalidHeader, "the Expect header is not supported")
	case status == http.StatusNotImplemented:
		return streamcore.Errorf(status, streamcore.CodeInternal, "the request's transfer coding is not supported")
	case status == http.StatusHTTPVersionNotSupported:
		return streamcore.Errorf(status, streamcore.CodeInternal, "the request's HTTP version is not supported")
	case status >= 500:
		return streamcore.Errorf(status, streamcore.CodeInternal, "the request could not be served")
	}
	switch detail {
	case "invalid header name":
		return streamcore.Errorf(status, streamcore.CodeInvalidHeader, "a header name is malformed")
	case "invalid header value":
		return streamcore.Errorf(status, streamcore.CodeInvalidHeader, "a header value is malformed")
	case "missing required Host header":
		return streamcore.Errorf(status, streamcore.CodeInvalidHeader, "the request has no Host header")
	case "malformed Host header":
		return streamcore.Errorf(status, streamcore.CodeInvalidHeader, "the Host header is malformed")
	}
	return streamcore.Errorf(status, streamcore.CodeInvalidRequest, "the request could not be parsed as HTTP/1.1")
}
