package tlsfiles

import (
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testcerts"
)

// serverCN connects to addr trusting ca and returns the common name the server presented.
func serverCN(t *testing.T, url string, cfg *tls.Config) (string, error) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.TLS.PeerCertificates[0].Subject.CommonName, nil
}

// serveTLS serves an empty handler over TLS on loopback and returns its URL.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ErrorLog: log.New(io.Discard, "", 0)}
	go hs.Serve(tls.NewListener(ln, cfg))
	t.Cleanup(func() { hs.Close() })
	return "https://" + ln.Addr().String()
}

func TestCertificateFollowsItsFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "test-ca")
	certFile, keyFile := ca.Issue(t, "first").Write(t, dir, "node")
	cert, err := LoadCertificate(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, ServerConfig(cert))
	pool, err := LoadCAPool(ca.WriteCA(t, dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	client := ClientConfig(pool, nil)
	if cn, err := serverCN(t, url, client); err != nil || cn != "first" {
		t.Fatalf("first handshake: cn=%q err=%v", cn, err)
	}

	// A renewed pair written over the files is served from the next handshake on.
	second := ca.Issue(t, "second")
	second.Write(t, dir, "node")
	touch(t, certFile, keyFile)
	if cn, err := serverCN(t, url, client); err != nil || cn != "second" {
		t.Fatalf("after the files changed: cn=%q err=%v", cn, err)
	}

	// A half-written pair (a new key, the old certificate) does not load: the previous
	// pair stays in use, and Reload reports the error.
	os.WriteFile(keyFile, ca.Issue(t, "third").KeyPEM, 0o600)
	touch(t, certFile, keyFile)
	if cn, err := serverCN(t, url, client); err != nil || cn != "second" {
		t.Fatalf("with mismatched files: cn=%q err=%v", cn, err)
	}
	if err := cert.Reload(); err == nil {
		t.Fatal("Reload of a mismatched pair succeeded")
	}
	third := ca.Issue(t, "third")
	third.Write(t, dir, "node")
	if err := cert.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn, err := serverCN(t, url, client); err != nil || cn != "third" {
		t.Fatalf("after Reload: cn=%q err=%v", cn, err)
	}

	// A client trusting another CA refuses the server.
	other, _ := LoadCAPool(testcerts.NewCA(t, "other-ca").WriteCA(t, dir, "other.crt"))
	if _, err := serverCN(t, url, ClientConfig(other, nil)); err == nil {
		t.Fatal("a client trusting another CA accepted the server")
	}
}

// touch moves the files' modification time forward, so a rewrite within the file
// system's timestamp granularity still counts as a change.
func touch(t *testing.T, files ...string) {
	t.Helper()
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		mt := fi.ModTime().Add(time.Second)
		if err := os.Chtimes(f, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMutualTLSRefusesForeignClients(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "cluster-ca")
	sc, sk := ca.Issue(t, "node-1").Write(t, dir, "node1")
	cc, ck := ca.Issue(t, "node-2").Write(t, dir, "node2")
	rogue := testcerts.NewCA(t, "rogue-ca")
	rc, rk := rogue.Issue(t, "node-4").Write(t, dir, "rogue")
	pool, _ := LoadCAPool(ca.WriteCA(t, dir, "ca.crt"))
	serverCert, err := LoadCertificate(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, MutualServerConfig(serverCert, pool))

	member, _ := LoadCertificate(cc, ck)
	if _, err := serverCN(t, url, ClientConfig(pool, member)); err != nil {
		t.Fatalf("a member was refused: %v", err)
	}
	stranger, _ := LoadCertificate(rc, rk)
	if _, err := serverCN(t, url, ClientConfig(pool, stranger)); err == nil {
		t.Fatal("a client with a certificate of another CA was accepted")
	}
	if _, err := serverCN(t, url, ClientConfig(pool, nil)); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
}
