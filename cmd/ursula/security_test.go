package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testcerts"
	"github.com/ursula-go/ursula/tlsfiles"
	"github.com/ursula-go/ursula/vfs"
)

// TestInsecureListenRefused: a node asked to listen beyond loopback without TLS and
// auth does not start (before it binds anything) unless server.insecure says so.
func TestInsecureListenRefused(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"server", "--engine", "memory", "--listen", "0.0.0.0:0", "--data", t.TempDir()}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "server.insecure") {
		t.Fatalf("non-loopback without protection: exit %d, %q", code, errb.String())
	}
	for _, a := range []string{"127.0.0.1:1", "[::1]:1", "localhost:1"} {
		if !isLoopback(a) {
			t.Errorf("%s: not loopback", a)
		}
	}
	for _, a := range []string{"0.0.0.0:1", ":1", "[::]:1", "10.0.0.1:1", "example.test:1"} {
		if isLoopback(a) {
			t.Errorf("%s: loopback", a)
		}
	}
}

// TestTLSAndTokens runs the real binary with TLS and a token file: https with the CA,
// 401 without a token, the token file and the certificate reloaded without a restart,
// and the VFS and `ursula export` over https:// with a CA file and a token.
func TestTLSAndTokens(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "test-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certFile, keyFile := ca.Issue(t, "node-first").Write(t, dir, "node")
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("tok-1 dbs1,admin\n"), 0o600)
	cfg := filepath.Join(dir, "node.toml")
	os.WriteFile(cfg, []byte(`[server]
listen = "127.0.0.1:0"
engine = "memory"
data_dir = "`+filepath.Join(dir, "data")+`"
tls_cert_file = "`+certFile+`"
tls_key_file = "`+keyFile+`"
[auth]
token_file = "`+tokens+`"
`), 0o644)
	cmd := exec.Command(bin, "server", "--config", cfg)
	var logs syncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	var base string
	for deadline := time.Now().Add(20 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if a := clientAddr(logs.String()); a != "" {
			base = "https://" + a
		}
	}
	if base == "" {
		t.Fatalf("server did not start: %s", logs.String())
	}
	pool, err := tlsfiles.LoadCAPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	get := func(path, tok string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, res.TLS.PeerCertificates[0].Subject.CommonName
	}
	if st, cn := get("/__ursula/metrics", ""); st != 401 || cn != "node-first" {
		t.Fatalf("no token: %d from %s", st, cn)
	}
	if st, _ := get("/__ursula/metrics", "tok-1"); st != 200 {
		t.Fatalf("token: %d", st)
	}
	// Plain HTTP is not served on the TLS port.
	if res, err := http.Get(strings.Replace(base, "https", "http", 1) + "/__ursula/ready"); err == nil {
		res.Body.Close()
		if res.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}

	// SIGHUP reloads the token file; a renewed certificate is used without a signal.
	os.WriteFile(tokens, []byte("tok-2 dbs1,admin\n"), 0o600)
	cmd.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), "reloaded"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload after SIGHUP: %s", logs.String())
		}
	}
	if st, _ := get("/__ursula/metrics", "tok-1"); st != 401 {
		t.Fatalf("the replaced token still works: %d", st)
	}
	if st, _ := get("/__ursula/metrics", "tok-2"); st != 200 {
		t.Fatalf("the new token: %d", st)
	}
	ca.Issue(t, "node-second").Write(t, dir, "node")
	later := time.Now().Add(2 * time.Second)
	os.Chtimes(certFile, later, later) // a change even within the file system's timestamp granularity
	if _, cn := get("/__ursula/ready", ""); cn != "node-second" {
		t.Fatalf("after renewal the node presents %s", cn)
	}

	// The VFS and `ursula export` over https:// with a CA file and a token file.
	tokFile := filepath.Join(dir, "client-token")
	os.WriteFile(tokFile, []byte("tok-2\n"), 0o600)
	t.Setenv("URSULA_VFS_CA_FILE", caFile)
	t.Setenv("URSULA_VFS_TOKEN_FILE", tokFile)
	db, err := vfs.Open(base+"/dbs1/db", vfs.Options{Path: filepath.Join(dir, "owner.db")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE t(x); INSERT INTO t VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	var out, errb bytes.Buffer
	if err := runExport([]string{base + "/dbs1/db", filepath.Join(dir, "env.db")}, &out, &errb); err != nil {
		t.Fatalf("export with the variables: %v", err)
	}
	t.Setenv("URSULA_VFS_CA_FILE", "")
	t.Setenv("URSULA_VFS_TOKEN_FILE", "")
	if err := runExport([]string{base + "/dbs1/db", filepath.Join(dir, "noca.db")}, &out, &errb); err == nil {
		t.Fatal("export trusted an unknown CA")
	}
	if err := runExport([]string{base + "/dbs1/db", filepath.Join(dir, "flags.db"), "--ca-file", caFile, "--token-file", tokFile}, &out, &errb); err != nil {
		t.Fatalf("export with flags: %v", err)
	}
	if err := runExport([]string{base + "/dbs1/db", filepath.Join(dir, "notoken.db"), "--ca-file", caFile}, &out, &errb); err == nil {
		t.Fatal("export without a token succeeded")
	}
}
