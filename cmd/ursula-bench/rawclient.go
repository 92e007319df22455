package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"
)

// rawConn is the lean HTTP/1.1 client of the append scenarios (--client raw): one
// persistent connection per writer, requests written from a reused buffer in one write,
// answers parsed for the status, Content-Length, chunked bodies, Connection: close and
// the one header a writer needs (Producer-Expected-Seq). Go's net/http client costs about
// as much CPU per request as a lean server does, and on two cores the load generator
// shares the CPUs with the server: a lighter client measures the server, not the client.
// It is the same client for every target, so ratios stay fair; --client nethttp
// cross-checks it.
type rawConn struct {
	addr string
	tls  *tls.Config // nil: plain TCP
	head []byte      // request line and fixed headers, up to "Producer-Seq: "
	conn net.Conn
	br   *bufio.Reader
	buf  []byte
}

// rawAnswer is what a writer needs of an answer.
type rawAnswer struct {
	status      int
	expectedSeq string
}

// newRawConn prepares a connection to u (http, or https with tlsCfg) that sends token,
// when not empty, as a bearer token.
func newRawConn(u *url.URL, contentType, producerID string, bodyLen int, tlsCfg *tls.Config, token string) (*rawConn, error) {
	port := "80"
	switch u.Scheme {
	case "http":
		tlsCfg = nil
	case "https":
		port = "443"
		if tlsCfg == nil {
			tlsCfg = &tls.Config{}
		}
		tlsCfg = tlsCfg.Clone()
		tlsCfg.NextProtos = []string{"http/1.1"} // this client speaks HTTP/1.1 only
	default:
		return nil, fmt.Errorf("--client raw speaks http and https, not %s", u.Scheme)
	}
	host := u.Host
	addr := host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: %s\r\nContent-Length: %d\r\nProducer-Id: %s\r\nProducer-Epoch: 0\r\nProducer-Seq: ",
		u.RequestURI(), host, auth, contentType, bodyLen, producerID)
	return &rawConn{addr: addr, tls: tlsCfg, head: []byte(head)}, nil
}

func (c *rawConn) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn, c.br = nil, nil
	}
}

// append sends one append with Producer-Seq seq and reads its answer. On any transport or
// framing error the connection is dropped (the next call dials again).
func (c *rawConn) append(seq uint64, body []byte) (rawAnswer, error) {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return rawAnswer{}, err
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		if c.tls != nil {
			cfg := c.tls
			if cfg.ServerName == "" {
				cfg = cfg.Clone()
				cfg.ServerName, _, _ = net.SplitHostPort(c.addr)
			}
			tc := tls.Client(conn, cfg)
			if err := tc.Handshake(); err != nil {
				conn.Close()
				return rawAnswer{}, err
			}
			conn = tc
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 16<<10)
	}
	c.buf = append(c.buf[:0], c.head...)
	c.buf = strconv.AppendUint(c.buf, seq, 10)
	c.buf = append(c.buf, "\r\n\r\n"...)
	c.buf = append(c.buf, body...)
	if _, err := c.conn.Write(c.buf); err != nil {
		c.close()
		return rawAnswer{}, err
	}
	a, err := c.readAnswer()
	if err != nil {
		c.close()
	}
	return a, err
}

var errFraming = errors.New("raw client: malformed HTTP answer")

func (c *rawConn) readAnswer() (rawAnswer, error) {
	var a rawAnswer
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return a, err
	}
	// "HTTP/1.1 204 No Content"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return a, errFraming
	}
	st, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return a, errFraming
	}
	a.status = st
	length, chunked, closing := int64(-1), false, false
	for {
		line, err = c.br.ReadSlice('\n')
		if err != nil {
			return a, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		i := bytes.IndexByte(line, ':')
		if i < 0 {
			return a, errFraming
		}
		name, val := line[:i], bytes.TrimSpace(line[i+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(val), 10, 64); err != nil {
				return a, errFraming
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(val, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(val, []byte("close"))
		case bytes.EqualFold(name, []byte("Producer-Expected-Seq")):
			a.expectedSeq = string(val)
		}
	}
	switch {
	case st == 204 || st == 304 || st < 200:
	case chunked:
		if err := c.skipChunked(); err != nil {
			return a, err
		}
	case length >= 0:
		if _, err := c.br.Discard(int(length)); err != nil {
			return a, err
		}
	default:
		closing = true // body to the end of the connection
	}
	if closing {
		c.close()
	}
	return a, nil
}

func (c *rawConn) skipChunked() error {
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		n, err := strconv.ParseInt(string(line), 16, 64)
		if err != nil {
			return errFraming
		}
		if n == 0 { // trailers until the empty line
			for {
				t, err := c.br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(t, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := io.CopyN(io.Discard, c.br, n+2); err != nil {
			return err
		}
	}
}
