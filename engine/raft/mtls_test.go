package raftengine

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testcerts"
	"github.com/ursula-go/ursula/tlsfiles"
)

// TestMutualTLSPeers: three voters whose peer traffic runs over mutual TLS with a cluster
// CA elect leaders and replicate; a fourth party presenting a certificate of another CA
// (or none) is refused by the cluster listener before any Raft or peer-channel byte is read.
func TestMutualTLSPeers(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "cluster-ca")
	pool, err := tlsfiles.LoadCAPool(ca.WriteCA(t, dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	lns, peers := loopbackPeers(t, 3)
	var es []*Engine
	for i := range 3 {
		cf, kf := ca.Issue(t, fmt.Sprintf("node-%d", i+1)).Write(t, dir, fmt.Sprintf("node%d", i+1))
		cert, err := tlsfiles.LoadCertificate(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		e, err := Open(Config{NodeID: uint64(i + 1), GroupCount: 2, Peers: peers, Listener: lns[i], InitMembership: true,
			PeerTLS:          &PeerTLS{Server: tlsfiles.MutualServerConfig(cert, pool), Client: tlsfiles.ClientConfig(pool, cert)},
			HeartbeatTimeout: 300 * time.Millisecond, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		es = append(es, e)
	}
	for _, e := range es {
		waitReady(t, e)
	}
	key := "b/x"
	L := es[es[0].LeaderOf(es[0].GroupOf(key))-1]
	ctx := context.Background()
	if r, err := L.Propose(ctx, create(key)); err != nil || r.Status != http.StatusCreated {
		t.Fatalf("create over mTLS: %v %+v", err, r)
	}

	// The fourth party: a certificate from another CA, then no certificate at all.
	rogue := testcerts.NewCA(t, "rogue-ca")
	rcf, rkf := rogue.Issue(t, "node-4").Write(t, dir, "rogue")
	rcert, err := tlsfiles.LoadCertificate(rcf, rkf)
	if err != nil {
		t.Fatal(err)
	}
	for name, cert := range map[string]*tlsfiles.Certificate{"another CA": rcert, "no certificate": nil} {
		cfg := tlsfiles.ClientConfig(pool, cert)
		cfg.ServerName = "127.0.0.1"
		c, err := tls.Dial("tcp", peers[0].RaftAddr, cfg)
		if err != nil {
			continue // refused during the handshake (TLS 1.2)
		}
		// TLS 1.3: the server's refusal arrives after the client's half of the
		// handshake. A peer-channel request must get no answer.
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(append(peerMagic[:], 0, 0, 0, 0, 1, 0))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("%s: the cluster listener answered", name)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: the connection was left open instead of refused", name)
		}
		c.Close()
	}
	// Plain TCP speaking the raft preamble is not served either.
	c, err := net.Dial("tcp", peers[0].RaftAddr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(append(muxMagic[:], 0, 0, 0, 0))
	// The TLS listener answers bytes that are no TLS hello with an alert record (type
	// 21) at most, then closes.
	buf := make([]byte, 64)
	if n, err := c.Read(buf); err == nil && n > 0 && buf[0] != 21 {
		t.Errorf("a plain client got %q", buf[:n])
	}
	c.Close()
	if _, err := L.Propose(ctx, appendCmd(key, "still")); err != nil {
		t.Fatalf("cluster after the refusals: %v", err)
	}
}
