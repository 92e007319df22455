package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ursula-go/ursula/gateway"
)

// startLogged starts bin with args and returns the addr= of its log line named line.
func startLogged(t *testing.T, bin, line string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var logs syncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s := logs.String()
		if j := strings.Index(s, line); j >= 0 {
			if i := strings.Index(s[j:], "addr="); i >= 0 {
				return "http://" + strings.Fields(s[j+i+5:])[0]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not start: %s", args[0], logs.String())
	return ""
}

// A real node behind a real gateway process with token auth and a usage log.
func TestGatewayProcess(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	node := startLogged(t, bin, "ursula listening", "server", "--engine", "memory", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--data", filepath.Join(dir, "data"))
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("secret-1 tenant1\n"), 0o600)
	usage := filepath.Join(dir, "usage.jsonl")
	config := filepath.Join(dir, "gateway.toml")
	os.WriteFile(config, []byte("[gateway]\nusage_log = \""+usage+"\"\nusage_chunk_bytes = 4\n[auth]\ntoken_file = \""+tokens+"\"\n[quota.default]\nrequests_per_sec = 1000\n"), 0o600)
	gw := startLogged(t, bin, "ursula gateway listening", "gateway", "--listen", "127.0.0.1:0", "--upstream", node, "--config", config)

	send := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, gw+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "text/plain")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if st, _ := send("PUT", "/tenant1/s", "", ""); st != 401 {
		t.Fatalf("without a token: %d", st)
	}
	if st, b := send("PUT", "/tenant1/s", "secret-1", ""); st != 201 {
		t.Fatalf("create: %d %s", st, b)
	}
	if st, b := send("POST", "/tenant1/s", "secret-1", "hello"); st/100 != 2 {
		t.Fatalf("append: %d %s", st, b)
	}
	if st, b := send("GET", "/tenant1/s?offset=-1", "secret-1", ""); st != 200 || b != "hello" {
		t.Fatalf("read: %d %q", st, b)
	}
	// Usage batches are flushed every second: wait for the append's bytes to show. The
	// 5-byte append in 4-byte units counts 2 chunks; the empty create none.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(usage)
		var in, chunks int64
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var l gateway.UsageLine
			if json.Unmarshal([]byte(line), &l) == nil && l.Bucket == "tenant1" && l.Principal == "|" && l.Action == gateway.ActionWrite {
				in += l.BytesIn
				chunks += l.Chunks
			}
		}
		if in == 5 {
			if chunks != 2 {
				t.Fatalf("chunks %d, want 2: %s", chunks, data)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no usage line for the append")
}

// A gateway process in front of a node with auth on presents its own upstream token, and
// SIGHUP applies a new body limit and a rotated upstream token without a restart.
func TestGatewayProcessReload(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	nodeTokens := filepath.Join(dir, "node-tokens")
	os.WriteFile(nodeTokens, []byte("gw-1 *\ngw-2 *\n"), 0o600)
	nodeConf := filepath.Join(dir, "node.toml")
	os.WriteFile(nodeConf, []byte("[auth]\ntoken_file = \""+nodeTokens+"\"\n"), 0o600)
	nodeCmd, node := startProc(t, bin, "ursula listening", "server", "--engine", "memory", "--config", nodeConf, "--listen", "127.0.0.1:0", "--admin-listen", "off", "--data", filepath.Join(dir, "data"))
	upTok := filepath.Join(dir, "up-token")
	os.WriteFile(upTok, []byte("gw-1\n"), 0o600)
	config := filepath.Join(dir, "gateway.toml")
	writeConf := func(maxBody int) {
		os.WriteFile(config, []byte(fmt.Sprintf("[gateway]\nupstream_token_file = %q\nmax_request_body_bytes = %d\n", upTok, maxBody)), 0o600)
	}
	writeConf(10)
	cmd, gw := startProc(t, bin, "ursula gateway listening", "gateway", "--listen", "127.0.0.1:0", "--upstream", node, "--config", config)
	send := func(method, path, body string) int {
		req, _ := http.NewRequest(method, gw+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "text/plain")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if st := send("PUT", "/tenant1/s", ""); st != 201 {
		t.Fatalf("create through the gateway's upstream token: %d", st)
	}
	if st := send("POST", "/tenant1/s", strings.Repeat("x", 20)); st != 413 {
		t.Fatalf("over the configured body limit: %d", st)
	}
	// Raise the limit and rotate the upstream token (the node drops the old one).
	writeConf(100)
	os.WriteFile(upTok, []byte("gw-2\n"), 0o600)
	os.WriteFile(nodeTokens, []byte("gw-2 *\n"), 0o600)
	nodeCmd.Process.Signal(syscall.SIGHUP)
	// Until the gateway reloads, it presents the token the node no longer knows.
	for deadline := time.Now().Add(10 * time.Second); send("GET", "/tenant1/s?offset=-1", "") != 401; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node still takes the dropped upstream token after its SIGHUP")
		}
	}
	cmd.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := send("POST", "/tenant1/s", strings.Repeat("x", 20))
		if st/100 == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGHUP: %d; logs: %s", st, cmd.Stderr.(*syncBuffer).String())
		}
	}
}

// startProc starts bin with args, stopped at cleanup, and returns it with the addr= of
// its log line named line. Its log is kept in the returned command's Stderr.
func startProc(t *testing.T, bin, line string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		s := logs.String()
		if j := strings.Index(s, line); j >= 0 {
			if i := strings.Index(s[j:], "addr="); i >= 0 {
				return cmd, "http://" + strings.Fields(s[j+i+5:])[0]
			}
		}
	}
	t.Fatalf("%s did not start: %s", args[0], logs.String())
	return nil, ""
}

// A real gateway process keeps the node's connection limits: a connection past
// max_connections gets a fast 503, a slow-loris header, an idle keep-alive connection
// and a stalled body are cut off, and an oversized header is refused; clients are served
// again once connections free up.
func TestGatewayProcessLimits(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	node := startLogged(t, bin, "ursula listening", "server", "--engine", "memory", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--data", filepath.Join(dir, "data"))
	config := filepath.Join(dir, "gateway.toml")
	os.WriteFile(config, []byte("[gateway]\nmax_connections = 3\nidle_timeout = \"1s\"\nread_header_timeout = \"1s\"\nbody_idle_timeout = \"1s\"\nbody_min_rate = -1\n"), 0o600)
	gw := startLogged(t, bin, "ursula gateway listening", "gateway", "--listen", "127.0.0.1:0", "--upstream", node, "--config", config)
	addr := strings.TrimPrefix(gw, "http://")
	oneShot := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	ready := func() (int, error) {
		res, err := oneShot.Get(gw + "/__ursula/ready")
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, nil
	}
	waitServed := func(why string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if st, _ := ready(); st == 200 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not served again %s", why)
			}
		}
	}
	req, _ := http.NewRequest("PUT", gw+"/tenant1/s", nil)
	req.Header.Set("Content-Type", "text/plain")
	if res, err := oneShot.Do(req); err != nil || res.StatusCode != 201 {
		t.Fatalf("create: %v %v", res, err)
	}
	// Three SSE reads hold the three connections.
	var sse []*http.Response
	// The one-shot requests above free their connection slots when the gateway has closed
	// them, which may be just after their answers: a 503 meanwhile is that, retried.
	for range 3 {
		var res *http.Response
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			res, err = (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get(gw + "/tenant1/s?offset=-1&live=sse")
			if err != nil || res.StatusCode != 503 || time.Now().After(deadline) {
				break
			}
			res.Body.Close()
		}
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("sse: %v %v", res, err)
		}
		sse = append(sse, res)
	}
	raw := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c, bufio.NewReader(c)
	}
	c, br := raw()
	io.WriteString(c, "GET /__ursula/ready HTTP/1.1\r\nHost: gw\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 503 || !strings.Contains(string(b), "CONNECTION_LIMIT") || res.Header.Get("Retry-After") == "" {
		t.Fatalf("past max_connections: %d %s", res.StatusCode, b)
	}
	for _, r := range sse {
		r.Body.Close()
	}
	waitServed("after the SSE reads ended")

	// A client that never finishes its headers is cut off.
	c, br = raw()
	io.WriteString(c, "GET /__ursula/ready HTTP/1.1\r\nHost: gw\r\n")
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("slow-loris header: the gateway did not close the connection: %v", err)
	}
	// An idle keep-alive connection is closed.
	c, br = raw()
	io.WriteString(c, "GET /__ursula/ready HTTP/1.1\r\nHost: gw\r\n\r\n")
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
		t.Fatalf("ready: %v %v", res, err)
	} else {
		io.Copy(io.Discard, res.Body)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("idle connection: %q %v", rest, err)
	}
	// A body that stalls gets 408 BODY_TOO_SLOW.
	c, br = raw()
	io.WriteString(c, "POST /tenant1/s HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nabc")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	if res.StatusCode != 408 || !strings.Contains(string(b), "BODY_TOO_SLOW") {
		t.Fatalf("stalled body: %d %s", res.StatusCode, b)
	}
	// Headers over 64 KiB are refused with a JSON body.
	c, br = raw()
	io.WriteString(c, "GET /__ursula/ready HTTP/1.1\r\nHost: gw\r\nX-Big: "+strings.Repeat("a", 100<<10)+"\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	if res.StatusCode != 431 || !strings.Contains(string(b), `"code"`) {
		t.Fatalf("oversized header: %d %s", res.StatusCode, b)
	}
	waitServed("at the end")
}
