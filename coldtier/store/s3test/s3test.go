// Package s3test runs a local S3 server (versitygw over a temporary directory, listening
// on 127.0.0.1 only) for tests of the S3 cold store.
//
// The binary comes from test/s3/install.sh (make s3-deps). Tests skip when it is missing,
// unless URSULA_REQUIRE_S3 is set (make test sets it), in which case they fail.
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
)

// Gateway is one running versitygw process.
type Gateway struct {
	Addr      string // 127.0.0.1:PORT
	AccessKey string
	SecretKey string
	Bucket    string

	bin  string
	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the versitygw path ($VERSITYGW, else $(go env GOPATH)/bin/versitygw, else
// PATH) or "".
func Binary() string {
	if p := os.Getenv("VERSITYGW"); p != "" {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = string(trimSpace(out))
		}
	}
	if gopath != "" {
		p := filepath.Join(filepath.SplitList(gopath)[0], "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	return ""
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// Start starts a gateway with a fresh bucket; it is stopped when the test ends.
func Start(t testing.TB) *Gateway {
	t.Helper()
	bin := Binary()
	if bin == "" {
		if os.Getenv("URSULA_REQUIRE_S3") != "" {
			t.Fatal("versitygw is not installed and URSULA_REQUIRE_S3 is set: run test/s3/install.sh (make s3-deps)")
		}
		t.Skip("versitygw is not installed: run test/s3/install.sh (make s3-deps) to run the S3 tests")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	g := &Gateway{Addr: addr, AccessKey: "ursulatestkey", SecretKey: "ursulatestsecret0123456789", Bucket: "ursula-test",
		bin: bin, dir: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(g.dir, "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := g.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	st, err := coldstore.NewS3(context.Background(), g.Config(""))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateBucket(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g
}

// Endpoint is the gateway's URL.
func (g *Gateway) Endpoint() string { return "http://" + g.Addr }

// Config is a store config for the gateway's bucket under prefix.
func (g *Gateway) Config(prefix string) coldstore.S3Config {
	return coldstore.S3Config{Bucket: g.Bucket, Region: "us-east-1", Endpoint: g.Endpoint(), Prefix: prefix,
		AccessKeyID: g.AccessKey, SecretAccessKey: g.SecretKey, ServerSideEncryption: "none",
		Timeout: coldstore.Duration(10 * time.Second), MaxRetries: 1}
}

// Restart starts the process (again) on the same address and directory.
func (g *Gateway) Restart() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd != nil {
		return nil
	}
	// Metadata (ETags of multipart parts among it) goes to a sidecar directory, not xattrs:
	// without any, CompleteMultipartUpload cannot match the parts' ETags.
	meta := filepath.Join(g.dir, "meta")
	if err := os.MkdirAll(meta, 0o755); err != nil {
		return err
	}
	cmd := exec.Command(g.bin, "--port", g.Addr, "--quiet", "posix", "--sidecar", meta, filepath.Join(g.dir, "root"))
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+g.AccessKey, "ROOT_SECRET_KEY="+g.SecretKey)
	logf, err := os.OpenFile(filepath.Join(g.dir, "versitygw.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start versitygw: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", g.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(g.dir, "versitygw.log"))
			return fmt.Errorf("versitygw exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("versitygw did not listen on %s within 20s", g.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.cmd, g.done = cmd, done
	return nil
}

// Stop kills the process (the data directory stays, so Restart resumes it).
func (g *Gateway) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return
	}
	g.cmd.Process.Kill()
	<-g.done
	g.cmd, g.done = nil, nil
}
