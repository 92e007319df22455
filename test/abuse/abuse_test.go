// Package abuse attacks a real `ursula server` process over loopback the way a careless or
// hostile client would, and checks that the node bends without breaking: its memory and
// descriptors stay bounded, a normal client is still served, nothing acknowledged is lost.
package abuse

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var binPath string // built once by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ursula-abuse-bin")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "ursula")
	if out, err := exec.Command("go", "build", "-o", binPath, "../../cmd/ursula").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build ursula: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is one server process.
type node struct {
	cmd       *exec.Cmd
	addr      string
	url       string
	adminAddr string
	log       *lockedBuffer
}

// lockedBuffer is the server's output, written by the process's copier and read by the
// test at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start runs a server with the given [limits] lines on a free loopback port.
func start(t *testing.T, dataDir string, limits string) *node {
	t.Helper()
	return startConfig(t, dataDir, "[limits]\n"+limits+"\n")
}

// startConfig runs a server with the given config file text on a free loopback port.
func startConfig(t *testing.T, dataDir string, config string) *node {
	t.Helper()
	return startWith(t, dataDir, config, "http", client)
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startWith runs a server with the given config file text on free loopback ports (client
// and admin), and waits until cl sees it ready over scheme.
func startWith(t *testing.T, dataDir, config, scheme string, cl *http.Client) *node {
	t.Helper()
	addr, adminAddr := freeAddr(t), freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "ursula.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &node{addr: addr, url: scheme + "://" + addr, adminAddr: adminAddr, log: &lockedBuffer{}}
	n.cmd = exec.Command(binPath, "server", "--listen", addr, "--admin-listen", adminAddr, "--data", dataDir, "--config", cfg)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.cmd.Process.Kill()
		n.cmd.Wait()
		if t.Failed() {
			t.Logf("server log:\n%s", n.log.String())
		}
	})
	for i := 0; i < 300; i++ {
		if res, err := cl.Get(n.url + "/__ursula/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return n
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("server did not become ready:\n%s", n.log.String())
	return nil
}

// alive fails the test when the process has exited (a crash, a panic).
func (n *node) alive(t *testing.T) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("server exited:\n%s", n.log.String())
	}
	if strings.Contains(n.log.String(), "panic:") {
		t.Fatalf("server panicked:\n%s", n.log.String())
	}
}

// rssBytes reads the process's resident memory.
func (n *node) rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// fds counts the process's open descriptors.
func (n *node) fds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.cmd.Process.Pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	return len(ents)
}

var client = &http.Client{Timeout: 20 * time.Second}

func do(t *testing.T, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, b
}

// served checks that a normal client can create, append to and read a stream.
func (n *node) served(t *testing.T, name string) {
	t.Helper()
	u := n.url + "/abuse/" + name
	if res, b := do(t, "PUT", u, nil, "Content-Type", "text/plain"); res.StatusCode/100 != 2 {
		t.Fatalf("create %s: %d %s", name, res.StatusCode, b)
	}
	if res, b := do(t, "POST", u, []byte("still served"), "Content-Type", "text/plain"); res.StatusCode/100 != 2 {
		t.Fatalf("append %s: %d %s", name, res.StatusCode, b)
	}
	if res, b := do(t, "GET", u+"?offset=-1", nil); res.StatusCode != 200 || !bytes.Contains(b, []byte("still served")) {
		t.Fatalf("read %s: %d %s", name, res.StatusCode, b)
	}
}

// rawConn opens a connection and sends s as is.
func rawConn(t *testing.T, addr, s string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if s != "" {
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// readAnswer reads one HTTP answer off c (bounded by a generous deadline).
func readAnswer(t *testing.T, c net.Conn) (*http.Response, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	return res, b
}

// closedByServer waits (bounded) until the server closes c.
func closedByServer(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: the server kept the connection open", what)
	}
}

func TestSlowLorisHeaders(t *testing.T) {
	n := start(t, t.TempDir(), `read_header_timeout = "1s"`)
	c := rawConn(t, n.addr, "GET /abuse/x HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	defer c.Close()
	closedByServer(t, c, "headers never finished")
	n.served(t, "loris")
}

func TestIdleKeepAlive(t *testing.T) {
	n := start(t, t.TempDir(), `idle_timeout = "1s"`)
	c := rawConn(t, n.addr, "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n")
	defer c.Close()
	if res, _ := readAnswer(t, c); res.StatusCode != 200 {
		t.Fatalf("ready: %d", res.StatusCode)
	}
	closedByServer(t, c, "idle keep-alive")
}

func TestConnectionCap(t *testing.T) {
	n := start(t, t.TempDir(), "max_connections = 40\nmax_live_readers = 20")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// Idle connections up to the cap, then one more: it gets a 503 at once, never a hang.
	for i := 0; i < 40; i++ {
		held = append(held, rawConn(t, n.addr, ""))
	}
	c := rawConn(t, n.addr, "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n")
	res, b := readAnswer(t, c)
	c.Close()
	if res.StatusCode != 503 || !bytes.Contains(b, []byte(`"code":"CONNECTION_LIMIT"`)) {
		t.Fatalf("past the cap: %d %s", res.StatusCode, b)
	}
	if fds := n.fds(t); fds > 40+64 {
		t.Fatalf("%d descriptors open with a cap of 40 connections", fds)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	// The freed slots serve again (closing is asynchronous on the server side: retry).
	for i := 0; ; i++ {
		res, err := http.Get(n.url + "/__ursula/ready")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if i == 200 {
			t.Fatalf("not served after the idle connections closed: %v %v", err, res)
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.served(t, "cap")
}

func TestSlowAndStalledBodies(t *testing.T) {
	n := start(t, t.TempDir(), "body_idle_timeout = \"1s\"\nbody_min_rate = 4096")
	do(t, "PUT", n.url+"/abuse/slow", nil, "Content-Type", "text/plain")
	// Stalled: declares 1000 bytes, sends 10, then nothing.
	c := rawConn(t, n.addr, "POST /abuse/slow HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n0123456789")
	res, b := readAnswer(t, c)
	c.Close()
	if res.StatusCode != 408 || !bytes.Contains(b, []byte(`"code":"BODY_TOO_SLOW"`)) {
		t.Fatalf("stalled body: %d %s", res.StatusCode, b)
	}
	// Slow: a byte every 200 ms keeps each gap short but the pace far under the minimum.
	c = rawConn(t, n.addr, "POST /abuse/slow HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	res, b = readAnswer(t, c)
	c.Close()
	<-done
	if res.StatusCode != 408 || !bytes.Contains(b, []byte(`"code":"BODY_TOO_SLOW"`)) {
		t.Fatalf("slow body: %d %s", res.StatusCode, b)
	}
	if res, b := do(t, "GET", n.url+"/abuse/slow?offset=-1", nil); res.StatusCode != 200 || len(b) != 0 {
		t.Fatalf("a refused body was applied: %d %q", res.StatusCode, b)
	}
	n.served(t, "slow")
}

func TestDeclaredOnlyBodies(t *testing.T) {
	n := start(t, t.TempDir(), "")
	do(t, "PUT", n.url+"/abuse/declared", nil, "Content-Type", "application/octet-stream")
	before := n.rssBytes(t)
	// 300 clients declare 32 MiB each and send 6 KB: the node must not reserve 9.4 GiB.
	var conns []net.Conn
	chunk := bytes.Repeat([]byte("a"), 6<<10)
	for i := 0; i < 300; i++ {
		c := rawConn(t, n.addr, "POST /abuse/declared HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 33554432\r\n\r\n")
		c.Write(chunk)
		conns = append(conns, c)
	}
	n.served(t, "declared-during")
	during := n.rssBytes(t)
	for _, c := range conns {
		c.Close()
	}
	n.alive(t)
	t.Logf("RSS before %d MiB, with 300 declared bodies %d MiB", before>>20, during>>20)
	if during-before > 256<<20 {
		t.Fatalf("300 declared-only bodies grew RSS by %d MiB", (during-before)>>20)
	}
}

func TestReaderThatNeverReads(t *testing.T) {
	// Hot bytes only: a read that starts cold is short (1 MiB) and fits in the socket
	// buffers, so it never stalls; TestColdReadersThatNeverRead covers the cold tier. A
	// plain reader whose write deadline has not passed yet when the test drains it gets its
	// answer whole: the short idle timeout then closes it, so only a held connection fails.
	n := startConfig(t, t.TempDir(), "[limits]\nlive_write_timeout = \"1s\"\nsse_keepalive = \"200ms\"\nwrite_timeout = \"2s\"\nidle_timeout = \"1s\"\n"+
		"[storage.cold]\nbackend = \"none\"\n")
	u := n.url + "/abuse/big"
	do(t, "PUT", u, nil, "Content-Type", "text/plain")
	block := bytes.Repeat([]byte("y"), 1<<20)
	for i := 0; i < 16; i++ {
		if res, b := do(t, "POST", u, block, "Content-Type", "text/plain"); res.StatusCode/100 != 2 {
			t.Fatalf("append: %d %s", res.StatusCode, b)
		}
	}
	before := n.rssBytes(t)
	// SSE readers and plain readers that never read a byte of their answers.
	var conns []net.Conn
	for i := 0; i < 20; i++ {
		conns = append(conns, rawConn(t, n.addr, "GET /abuse/big?offset=-1&live=sse HTTP/1.1\r\nHost: x\r\n\r\n"))
		conns = append(conns, rawConn(t, n.addr, "GET /abuse/big?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n"))
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// The server drops them once their writes stall past the deadlines.
	for i := 0; ; i++ {
		res, b := do(t, "GET", n.url+"/__ursula/metrics", nil)
		if res.StatusCode == 200 && bytes.Contains(b, []byte(`"live_readers":0`)) && i > 0 {
			break
		}
		if i == 300 {
			t.Fatalf("stalled live readers are still held: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range conns {
		closedByServer(t, c, "a reader that never reads")
	}
	after := n.rssBytes(t)
	t.Logf("RSS before %d MiB, after stalled readers %d MiB", before>>20, after>>20)
	if after-before > 512<<20 {
		t.Fatalf("stalled readers grew RSS by %d MiB", (after-before)>>20)
	}
	n.served(t, "stalled")
}

// TestAdminConnectionCap: the admin listener has a connection cap of its own (256): past
// it a connection gets the 503 at once, and the client listener is still served.
func TestAdminConnectionCap(t *testing.T) {
	n := start(t, t.TempDir(), `read_header_timeout = "60s"`)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 256; i++ {
		held = append(held, rawConn(t, n.adminAddr, ""))
	}
	c := rawConn(t, n.adminAddr, "GET /__ursula/ready HTTP/1.1\r\nHost: x\r\n\r\n")
	res, b := readAnswer(t, c)
	c.Close()
	if res.StatusCode != 503 || !bytes.Contains(b, []byte(`"code":"CONNECTION_LIMIT"`)) {
		t.Fatalf("admin listener past its cap: %d %s", res.StatusCode, b)
	}
	n.served(t, "admin-cap")
	n.alive(t)
}
