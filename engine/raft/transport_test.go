package raftengine

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/internal/testcerts"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/tlsfiles"
)

func yamuxHeader(typ byte, length uint32) []byte {
	h := make([]byte, yamuxHeaderLen)
	h[1] = typ
	binary.BigEndian.PutUint32(h[4:], 3)
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

// TestFrameEnds: the coalescer's view of yamux framing, write by write.
func TestFrameEnds(t *testing.T) {
	cases := []struct {
		name   string
		writes [][]byte
		ends   []bool
	}{
		{"data header then body", [][]byte{yamuxHeader(0, 5), []byte("hello")}, []bool{false, true}},
		{"body in two writes", [][]byte{yamuxHeader(0, 5), []byte("he"), []byte("llo")}, []bool{false, false, true}},
		{"empty data frame (a FIN)", [][]byte{yamuxHeader(0, 0)}, []bool{true}},
		{"window update has no body", [][]byte{yamuxHeader(1, 1<<20)}, []bool{true}},
		{"ping has no body", [][]byte{yamuxHeader(2, 7)}, []bool{true}},
		{"not a header where one is due", [][]byte{[]byte("xyz")}, []bool{true}},
		{"overlong body write", [][]byte{yamuxHeader(0, 2), []byte("abcd")}, []bool{false, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			need := 0
			for i, w := range c.writes {
				if got := frameEnds(&need, w); got != c.ends[i] {
					t.Fatalf("write %d: frameEnds %v, want %v", i, got, c.ends[i])
				}
			}
		})
	}
}

// gatedConn counts writes; the first one blocks until the gate opens.
type gatedConn struct {
	net.Conn
	gate   chan struct{}
	mu     sync.Mutex
	writes int
	got    bytes.Buffer
	first  chan struct{}
}

func (c *gatedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	n := c.writes
	c.got.Write(p)
	c.mu.Unlock()
	if n == 1 {
		close(c.first)
		<-c.gate
	}
	return len(p), nil
}

// TestCoalescerBatchesFrames: while one write is in the kernel, the frames written behind
// it leave together in the next write, byte for byte in order.
func TestCoalescerBatchesFrames(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	gc := &gatedConn{Conn: a, gate: make(chan struct{}), first: make(chan struct{})}
	w := newCoalescer(gc)
	defer w.Close()
	var want bytes.Buffer
	frame := func(i int) {
		body := []byte(fmt.Sprintf("append entries of group %d", i))
		h := yamuxHeader(0, uint32(len(body)))
		want.Write(h)
		want.Write(body)
		for _, p := range [][]byte{h, body} {
			if _, err := w.Write(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	frame(0)
	<-gc.first // the flusher is in its first write
	for i := 1; i <= 50; i++ {
		frame(i)
	}
	close(gc.gate)
	deadline := time.Now().Add(10 * time.Second)
	for {
		gc.mu.Lock()
		n, got, writes := gc.got.Len(), gc.got.Bytes(), gc.writes
		gc.mu.Unlock()
		if n == want.Len() {
			if !bytes.Equal(got, want.Bytes()) {
				t.Fatal("the bytes written differ from the frames")
			}
			if writes != 2 {
				t.Fatalf("%d writes for 51 frames, want 2 (the first, then the 50 gathered behind it)", writes)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d bytes written", n, want.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCoalescerReportsConnError: a failed write closes the connection and fails every
// later write instead of queueing it.
func TestCoalescerReportsConnError(t *testing.T) {
	a, b := net.Pipe()
	b.Close()
	w := newCoalescer(a)
	defer w.Close()
	w.Write(yamuxHeader(2, 1))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := w.Write(yamuxHeader(2, 1)); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes still succeed on a closed connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// proposeAnywhere proposes on whichever voter leads the command's group, retrying
// across elections (a loaded machine may re-elect).
func proposeAnywhere(t *testing.T, es []*Engine, key string, c func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := c()
		if err == nil {
			return
		}
		var nl *engine.NotLeaderError
		if !errors.As(err, &nl) || time.Now().After(deadline) {
			t.Fatalf("propose on %s: %v", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRaftOverHTTPUpgrade: three voters without cluster listeners: each one's Raft
// traffic rides on its HTTP server (the upgrade route), plain and over https with mutual
// TLS between peers inside the upgraded connection. Writes replicate; every group's
// connections to a peer share one physical connection (a handful of upgrades in all,
// where one connection per group and pooled stream would take dozens); a peer without a
// cluster certificate is refused after the upgrade; a request without the upgrade
// headers gets 426.
func TestRaftOverHTTPUpgrade(t *testing.T) {
	for _, secure := range []bool{false, true} {
		for _, shared := range []bool{true, false} {
			name := "http"
			if secure {
				name = "https+mtls"
			}
			if shared {
				name += "/shared"
			}
			t.Run(name, func(t *testing.T) { raftOverUpgrade(t, secure, shared) })
		}
	}
}

func raftOverUpgrade(t *testing.T, secure, shared bool) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "cluster-ca")
	pool, err := tlsfiles.LoadCAPool(ca.WriteCA(t, dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	const n, groups = 3, 4
	var lns []net.Listener
	var peers []Peer
	scheme := "http"
	if secure {
		scheme = "https"
	}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		u := scheme + "://" + ln.Addr().String()
		peers = append(peers, Peer{ID: uint64(i + 1), URL: u, RaftAddr: u})
	}
	var upgrades atomic.Int64
	var es []*Engine
	var ts0 *httptest.Server
	for i := range n {
		cfg := Config{NodeID: uint64(i + 1), GroupCount: groups, Peers: peers, Listener: NewUpgradeListener(lns[i].Addr()),
			InitMembership: true, HeartbeatTimeout: 500 * time.Millisecond, RaftLog: io.Discard, SharedPeerConnection: shared}
		var cert *tlsfiles.Certificate
		if secure {
			cf, kf := ca.Issue(t, fmt.Sprintf("node-%d", i+1)).Write(t, dir, fmt.Sprintf("node%d", i+1))
			if cert, err = tlsfiles.LoadCertificate(cf, kf); err != nil {
				t.Fatal(err)
			}
			cfg.PeerTLS = &PeerTLS{Server: tlsfiles.MutualServerConfig(cert, pool), Client: tlsfiles.ClientConfig(pool, cert)}
		}
		e, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewUnstartedServer(server.New(e, server.Config{ClusterID: "upgrade"}))
		ts.Listener.Close()
		ts.Listener = lns[i]
		ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateHijacked {
				upgrades.Add(1)
			}
		}
		if secure {
			// TLS as the node terminates it: in the listener, under the JSON refusals
			// wrapper, so the upgrade hijacks a wrapped connection over TLS.
			ts.Listener = server.JSONRefusals(ts.Config, server.TLSListener(lns[i], tlsfiles.ServerConfig(cert), 10*time.Second))
			ts.Start()
		} else {
			ts.Start()
		}
		t.Cleanup(func() { e.Close(); ts.Close() })
		if i == 0 {
			ts0 = ts
		}
		es = append(es, e)
	}
	for _, e := range es {
		waitReady(t, e)
	}
	ctx := context.Background()
	for gi := range 8 {
		key := fmt.Sprintf("b/s%d", gi)
		proposeAnywhere(t, es, key, func() error {
			L := es[0].LeaderOf(es[0].GroupOf(key))
			if L == 0 {
				return &engine.NotLeaderError{}
			}
			_, err := es[L-1].Propose(ctx, create(key))
			return err
		})
		proposeAnywhere(t, es, key, func() error {
			L := es[0].LeaderOf(es[0].GroupOf(key))
			if L == 0 {
				return &engine.NotLeaderError{}
			}
			_, err := es[L-1].Propose(ctx, appendCmd(key, "x"))
			return err
		})
	}
	for _, e := range es {
		for gi := range 8 {
			key := fmt.Sprintf("b/s%d", gi)
			deadline := time.Now().Add(15 * time.Second)
			for read(e, key) == "" {
				if time.Now().After(deadline) {
					t.Fatalf("node %d never applied %s", e.cfg.NodeID, key)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	// 3 pairs: at most one connection each (none between two nodes that never lead or
	// campaign), two where both ends dialed at once, plus a few
	// redials after elections on a loaded machine. Per-group connections would be at
	// least groups x 2 peers x 3 nodes = 24.
	t.Logf("%d upgraded connections", upgrades.Load())
	if u := upgrades.Load(); !shared && u < 2*groups {
		t.Errorf("%d upgraded connections for 3 nodes of %d groups without a shared connection; want at least one per group and peer", u, groups)
	} else if u := upgrades.Load(); shared && (u < 2 || u > 12) {
		// 2 when one node won every election: only candidates and leaders dial, and the
		// two followers never needed each other.
		t.Errorf("%d upgraded connections for 3 nodes of %d groups; want at most one per pair and dialing end (2 to 6, a few redials)", u, groups)
	}

	// No upgrade headers: 426 and a JSON error.
	cl := ts0.Client()
	if secure {
		cl = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsfiles.ClientConfig(pool, nil)}, Timeout: 30 * time.Second}
	}
	res, err := cl.Get(peers[0].URL + UpgradePath)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("GET %s without upgrade headers: %d, want 426", UpgradePath, res.StatusCode)
	}
	if !secure {
		return
	}
	// A peer without a cluster certificate: upgraded, then refused by the inner TLS.
	c, _, err := dialUpgrade(ctx, peers[0].URL, true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rogue := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	rogue.SetDeadline(time.Now().Add(10 * time.Second))
	rogue.Write(append(peerMagic[:], 0, 0, 0, 0, 1, 0))
	if _, err := rogue.Read(make([]byte, 1)); err == nil {
		t.Error("a peer without a certificate got an answer")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("a peer without a certificate was left hanging instead of refused")
	}
}
