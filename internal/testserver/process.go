package testserver

import (
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// StartProcess builds cmd/ursula and runs `ursula server` in another process, with args
// after its listeners and data directory (none: its defaults, the default engine), until
// the test ends. It returns the base URL. For benchmarks that measure what a deployment
// sees: a server in the same process shares the client's Go scheduler.
func StartProcess(tb testing.TB, args ...string) string {
	tb.Helper()
	dir := tb.TempDir()
	bin := BuildUrsula(tb, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, append([]string{"server", "--listen", addr, "--admin-listen", "127.0.0.1:0", "--data", filepath.Join(dir, "data")}, args...)...)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() })
	WaitReady(tb, addr)
	return "http://" + addr
}

// WaitReady waits up to 30 s for the server at host:port addr to answer ready.
func WaitReady(tb testing.TB, addr string) {
	tb.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get("http://" + addr + "/__ursula/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
	}
	tb.Fatalf("server %s not ready", addr)
}

// BuildUrsula builds cmd/ursula into dir and returns the binary's path.
func BuildUrsula(tb testing.TB, dir string) string {
	tb.Helper()
	bin := filepath.Join(dir, "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/ursula-go/ursula/cmd/ursula").CombinedOutput(); err != nil {
		tb.Fatalf("build ursula: %v\n%s", err, out)
	}
	return bin
}
