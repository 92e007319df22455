package main

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestHelpAndBadInput(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ursula server") {
		t.Fatalf("--help: %d %q", code, out.String())
	}
	if code := run([]string{"serve"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "serve"`) {
		t.Fatalf("unknown command: %d %q", code, errb.String())
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	os.WriteFile(cfg, []byte("[server]\nlisen = \"x\"\n"), 0o644)
	errb.Reset()
	if code := run([]string{"server", "--config", cfg}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "unknown keys: server.lisen") {
		t.Fatalf("typo in config: %d %q", code, errb.String())
	}
	os.WriteFile(cfg, []byte("[server]\ncluster_id = \"bad id!\"\n"), 0o644)
	errb.Reset()
	if code := run([]string{"server", "--config", cfg}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "cluster_id") {
		t.Fatalf("bad cluster id: %d %q", code, errb.String())
	}
}

// TestServeAndShutdown runs the real binary: it serves, keeps its cluster id across
// restarts, and exits 0 on SIGTERM.
func TestServeAndShutdown(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	data := t.TempDir()
	start := func() (*exec.Cmd, string) {
		cmd := exec.Command(bin, "server", "--listen", "127.0.0.1:0", "--data", data)
		var logs syncBuffer
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if addr := clientAddr(logs.String()); addr != "" {
				return cmd, "http://" + addr
			}
			time.Sleep(20 * time.Millisecond)
		}
		cmd.Process.Kill()
		t.Fatalf("server did not start: %s", logs.String())
		return nil, ""
	}
	cmd, base := start()
	res, err := http.Get(base + "/__ursula/ready")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("ready: %v %v", err, res)
	}
	id := res.Header.Get("Ursula-Cluster-Id")
	res.Body.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	cmd, base = start()
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	res, err = http.Get(base + "/__ursula/ready")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got := res.Header.Get("Ursula-Cluster-Id"); got != id || id == "" {
		t.Fatalf("cluster id changed across restart: %q -> %q", id, got)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// clientAddr is the client listener's address from a server's log ("" until logged): the
// addr= of the "ursula listening" line (the admin listener logs an addr= of its own).
func clientAddr(logs string) string {
	j := strings.Index(logs, "ursula listening")
	if j < 0 {
		return ""
	}
	i := strings.Index(logs[j:], "addr=")
	if i < 0 {
		return ""
	}
	return strings.Fields(logs[j+i+5:])[0]
}

// The usage text names every [auth] key the config file takes.
func TestUsageNamesAuthKeys(t *testing.T) {
	typ := reflect.TypeOf(authConfig{})
	for i := range typ.NumField() {
		key := typ.Field(i).Tag.Get("toml")
		if !strings.Contains(usage, key+" = ") {
			t.Errorf("ursula --help does not name auth.%s", key)
		}
	}
}
