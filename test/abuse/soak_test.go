package abuse

import (
	"net"
	"testing"
	"time"
)

// TestSoakIdleConnections (make soak): 10,000 keep-alive connections that send one request
// and go silent. The node keeps serving, and the idle timeout gives their descriptors back.
func TestSoakIdleConnections(t *testing.T) {
	if !soak() {
		t.Skip("a soak: URSULA_SOAK=1 (make soak)")
	}
	n := start(t, t.TempDir(), "idle_timeout = \"5s\"\nmax_connections = 12000\nmax_live_readers = 100")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 10000; i++ {
		c, err := net.Dial("tcp", n.addr)
		if err != nil {
			t.Fatalf("connection %d: %v (raise the test's descriptor limit)", i, err)
		}
		c.Write([]byte("GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n"))
		conns = append(conns, c)
	}
	n.served(t, "soak-idle")
	for i := 0; n.fds(t) > 1000; i++ {
		if i == 600 {
			t.Fatalf("%d descriptors still open long after the idle timeout", n.fds(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.alive(t)
	n.served(t, "soak-idle-after")
}

// TestSoakSlowLoris (make soak): 1,000 connections that never finish their headers are all
// closed by the header timeout while a normal client is served.
func TestSoakSlowLoris(t *testing.T) {
	if !soak() {
		t.Skip("a soak: URSULA_SOAK=1 (make soak)")
	}
	n := start(t, t.TempDir(), `read_header_timeout = "3s"`)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 1000; i++ {
		conns = append(conns, rawConn(t, n.addr, "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX-Slow: "))
	}
	n.served(t, "soak-loris")
	for _, c := range conns {
		closedByServer(t, c, "headers never finished")
	}
	n.alive(t)
}
