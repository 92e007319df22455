package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// proxy forwards TCP connections to a target until blackholed: then it cuts every open
// connection and refuses new ones (a network partition between two nodes, one direction
// of dialing; a node pair has one proxy per dialing side).
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func newProxy(t *testing.T, target string, port int) *proxy {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.blackhole(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *proxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c] = true
	p.mu.Unlock()
	u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[u] = true
	p.mu.Unlock()
	go func() { io.Copy(u, c); u.Close() }()
	io.Copy(c, u)
	c.Close()
}

func (p *proxy) blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = on
	if on {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// TestPartitionedLeaderAcknowledgesNothing: the leader of a stream's group is cut off from
// both other voters. Writes sent to it are never acknowledged (no 2xx); once it has stepped
// down it answers 503 + Retry-After marked NotLeader. The majority elects a new leader and
// goes on. After the partition heals, every node holds the majority's history and none of
// the minority's writes.
func TestPartitionedLeaderAcknowledgesNothing(t *testing.T) {
	proxies := map[[2]int]*proxy{}
	c := newCluster(t, clusterOpts{nodes: 3, groups: 4, raft: "heartbeat_timeout_ms = 500",
		raftAddr: func(self, peer, port, listenPort int) string {
			p := newProxy(t, fmt.Sprintf("127.0.0.1:%d", port), listenPort)
			proxies[[2]int{self, peer}] = p
			return p.ln.Addr().String()
		}})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, _ := client.New("", client.WithTimeouts(5*time.Second, 5*time.Second))
	key := "part/stream"
	g := uint64(0)
	{
		h := fnvGroup(key, 4)
		g = h
	}
	if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
		return cl.Create(ctx, n.url+"/"+key, client.CreateOptions{ContentType: "text/plain"})
	}); err != nil {
		t.Fatal(err)
	}
	// Make node 3 the group's leader.
	iso := c.nodes[2]
	deadline := time.Now().Add(20 * time.Second)
	for c.leaderOf(g, iso) != 3 {
		if time.Now().After(deadline) {
			t.Fatal("could not move leadership to node 3")
		}
		if l := c.leaderOf(g, iso); l != 0 {
			httpDo(http.MethodPost, fmt.Sprintf("%s/__ursula/raft/transfer?group=%d&to=3", c.nodes[l-1].admin, g), nil, nil)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ct := map[string]string{"Content-Type": "text/plain"}
	if res, _, err := httpDo(http.MethodPost, iso.url+"/"+key, []byte("before;"), ct); err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("append on the leader: %v %v", err, res)
	}
	// Partition node 3 (index 2) from nodes 1 and 2, both directions.
	for _, pair := range [][2]int{{2, 0}, {2, 1}, {0, 2}, {1, 2}} {
		proxies[pair].blackhole(true)
	}
	// Writes to the isolated node: none may be acknowledged.
	var saw503 bool
	for i := range 8 {
		res, body, err := httpDo(http.MethodPost, iso.url+"/"+key, []byte(fmt.Sprintf("minority%d;", i)), ct)
		if err != nil {
			continue // a timeout acknowledges nothing either
		}
		if res.StatusCode/100 == 2 {
			t.Fatalf("isolated node acknowledged a write: %d %s", res.StatusCode, body)
		}
		if res.StatusCode == http.StatusServiceUnavailable && res.Header.Get("Retry-After") == "1" && res.Header.Get(streamcore.HdrNotApplied) == "NotLeader" {
			saw503 = true
		}
		if res.Header.Get(streamcore.HdrNotAppliedChecked) != "" {
			t.Fatal("a node sent the gateway's vouch header")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !saw503 {
		t.Error("the isolated node never answered 503 NotLeader (marked) after stepping down")
	}
	// The majority goes on.
	if _, err := retry(ctx, &testCluster{nodes: c.nodes[:2]}, func(n *node) (*client.WriteResult, error) {
		return cl.Append(ctx, n.url+"/"+key, []byte("majority;"), client.AppendOptions{ContentType: "text/plain", Producer: &client.ProducerKey{ID: "maj", Seq: 0}})
	}); err != nil {
		t.Fatalf("majority write: %v", err)
	}
	// Heal; node 3 catches up and drops its unacknowledged entries.
	for _, p := range proxies {
		p.blackhole(false)
	}
	lr, err := cl.Read(ctx, c.nodes[0].url+"/"+key, client.ReadOptions{Offset: "-1", Consistency: "leader"})
	if err != nil {
		t.Fatal(err)
	}
	want := string(lr.Data)
	if want != "before;majority;" {
		t.Fatalf("leader holds %q, want the majority's history", want)
	}
	for _, n := range c.nodes {
		if got := converge(t, cl, n.url+"/"+key, want); strings.Contains(got, "minority") {
			t.Fatalf("node %d holds a minority write: %q", n.id, got)
		}
	}
}

func fnvGroup(key string, groups uint64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h % groups
}
