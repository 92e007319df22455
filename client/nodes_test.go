package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

func TestParseNodeURL(t *testing.T) {
	nu, ok, err := client.ParseNodeURL("HTTP://N1:4437,[::1]:4438,n3/bucket/stream")
	if err != nil || !ok {
		t.Fatalf("parse: %v %v", ok, err)
	}
	if got := nu.Authority(); got != "n1:4437,[::1]:4438,n3" || nu.Scheme != "http" || nu.Rest != "/bucket/stream" {
		t.Fatalf("parsed %q %q %q", nu.Scheme, got, nu.Rest)
	}
	if got := nu.At(1); got != "http://[::1]:4438/bucket/stream" {
		t.Fatalf("At(1) = %q", got)
	}
	if _, ok, err := client.ParseNodeURL("http://n1:4437/bucket/stream"); ok || err != nil {
		t.Fatalf("a single host is no node list: %v %v", ok, err)
	}
	for _, bad := range []string{
		"http://n1:4437,,n3:4437/b/s",        // empty host
		"http://n1:4437,:4437/b/s",           // empty host with a port
		"http://n1:4437,n2:/b/s",             // empty port
		"http://n1:4437,n2:x/b/s",            // not a number
		"http://n1:0,n2:1/b/s",               // out of range
		"http://n1:70000,n2:1/b/s",           // out of range
		"http://n1:+1,n2:1/b/s",              // a sign is no port
		"http://n1:4437,N1:4437/b/s",         // named twice
		"http://n1,n1:80/b/s",                // named twice (the default port)
		"http://user@n1:1,n2:2/b/s",          // user information
		"ftp://n1:1,n2:2/b/s",                // scheme
		"http://n1:1,n 2:2/b/s",              // a space in a host
		"http://[::1:1,n2:2/b/s",             // unclosed bracket
		"http://n1:1,[n2]:2/b/s",             // brackets around a name
		"https://n1:1,n2:2,n3:3,n2:2/bucket", // named twice, later
	} {
		_, ok, err := client.ParseNodeURL(bad)
		var ue *client.URLError
		if !ok || !errors.As(err, &ue) {
			t.Errorf("%s: ok=%v err=%v, want a *URLError", bad, ok, err)
		}
	}
	if !client.SameStream("http://a:1,b:2,c:3/x/y", "http://c:3,A:1,b:2/x/y") {
		t.Error("the same nodes in another order are not the same stream")
	}
	if !client.SameStream("http://a:80,b:2/x/y", "http://b:2,a/x/y") {
		t.Error("the default port spelled out is not the same stream")
	}
	for _, other := range []string{"http://a:1,b:2/x/y", "http://a:1,b:2,c:3/x/z", "https://a:1,b:2,c:3/x/y", "http://a:1/x/y"} {
		if client.SameStream("http://a:1,b:2,c:3/x/y", other) {
			t.Errorf("%s is the same stream as http://a:1,b:2,c:3/x/y", other)
		}
	}
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// realNode is a real server on loopback, as a node of cluster clusterID.
func realNode(t *testing.T, clusterID string) *testserver.Server {
	return testserver.Start(t, testserver.Options{ClusterID: clusterID})
}

// notLeader answers every request but a HEAD as a follower that names leader: 307 to the
// same path there, marked as applying nothing, like a node of a cluster.
func notLeader(t *testing.T, clusterID, leader string, hits *atomic.Int32) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set(streamcore.HdrUrsulaClusterID, clusterID)
		if r.Method == http.MethodHead {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Header().Set("Location", leader+r.URL.RequestURI())
		w.Header().Set(streamcore.HdrNotApplied, "NotLeader")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTemporaryRedirect)
		w.Write([]byte(`{"error":{"code":"NOT_LEADER","message":"this node does not lead the stream's group"}}`))
	}))
	t.Cleanup(ts.Close)
	return ts
}

// host is the host:port of a base URL.
func host(base string) string { return strings.TrimPrefix(base, "http://") }

// TestNodeListRoutes: a node that cannot be reached is skipped, a NotLeader redirect to a
// node of the list is followed, and later requests go straight to the leader.
func TestNodeListRoutes(t *testing.T) {
	leader := realNode(t, "c1")
	var followerHits atomic.Int32
	follower := notLeader(t, "c1", leader.URL, &followerHits)
	u := "http://" + deadAddr(t) + "," + host(follower.URL) + "," + host(leader.URL) + "/bucket/s"
	c, err := client.New("", client.WithToken("secret"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Create(ctx, u, client.CreateOptions{ContentType: "text/plain"}); err != nil {
		t.Fatalf("create over the node list: %v", err)
	}
	before := followerHits.Load()
	for i := range 3 {
		p := &client.ProducerKey{ID: "w", Epoch: 1, Seq: uint64(i)}
		if _, err := c.Append(ctx, u, []byte("x"), client.AppendOptions{ContentType: "text/plain", Producer: p, Digest: true}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if got := followerHits.Load(); got != before {
		t.Fatalf("the follower got %d more requests after the leader was known", got-before)
	}
	for _, ref := range []string{u, leader.URL + "/bucket/s"} {
		rr, err := c.Read(ctx, ref, client.ReadOptions{})
		if err != nil || string(rr.Data) != "xxx" {
			t.Fatalf("read %s: %v %+v", ref, err, rr)
		}
	}
}

// TestNodeListRefusesForeignRedirect: a redirect to a host the URL does not name is not
// followed (nothing, and no token, reaches it) and fails with a *URLError.
func TestNodeListRefusesForeignRedirect(t *testing.T) {
	var foreignHits atomic.Int32
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		foreignHits.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	defer foreign.Close()
	var hits atomic.Int32
	liar := notLeader(t, "c1", foreign.URL, &hits)
	member := realNode(t, "c1")
	u := "http://" + host(liar.URL) + "," + host(member.URL) + "/bucket/s"
	c, _ := client.New("", client.WithToken("secret"))
	ctx := context.Background()
	_, err := c.Append(ctx, u, []byte("x"), client.AppendOptions{ContentType: "text/plain", Producer: &client.ProducerKey{ID: "w", Epoch: 1}, Digest: true})
	var ue *client.URLError
	var ce *client.Error
	if !errors.As(err, &ue) || !errors.As(err, &ce) || ce.Outcome != client.NotApplied {
		t.Fatalf("append redirected outside the list: %v, want a *URLError, outcome not-applied", err)
	}
	if _, err := c.Read(ctx, u, client.ReadOptions{}); !errors.As(err, &ue) {
		t.Fatalf("read redirected outside the list: %v, want a *URLError", err)
	}
	if n := foreignHits.Load(); n != 0 {
		t.Fatalf("the foreign host got %d requests", n)
	}
}

// TestNodeListMixedClusters: nodes of two clusters in one URL are refused on first
// contact, before any write goes out.
func TestNodeListMixedClusters(t *testing.T) {
	a, b := realNode(t, "cluster-a"), realNode(t, "cluster-b")
	u := "http://" + host(a.URL) + "," + host(b.URL) + "/bucket/s"
	c, _ := client.New("")
	ctx := context.Background()
	_, err := c.Create(ctx, u, client.CreateOptions{ContentType: "text/plain"})
	var ue *client.URLError
	if !errors.As(err, &ue) || !strings.Contains(ue.Reason, "different clusters") {
		t.Fatalf("create over mixed clusters: %v", err)
	}
	for _, ts := range []*testserver.Server{a, b} {
		if _, err := c.Head(ctx, ts.URL+"/bucket/s"); err == nil {
			t.Fatalf("%s holds the stream", ts.URL)
		}
	}
}
