package raftengine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

type coldNode struct {
	e   *Engine
	srv *server.Server
	ts  *httptest.Server
	adm *httptest.Server // the admin listener
}

// coldCluster starts n in-process voters over real HTTP, sharing one fs cold store.
func coldCluster(t *testing.T, n int, store coldstore.Store, cfg coldstore.Config) []*coldNode {
	t.Helper()
	var rafts, https []net.Listener
	var peers []Peer
	for i := range n {
		rl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		rafts, https = append(rafts, rl), append(https, hl)
		peers = append(peers, Peer{ID: uint64(i + 1), URL: "http://" + hl.Addr().String(), RaftAddr: rl.Addr().String()})
	}
	var nodes []*coldNode
	for i := range n {
		e, err := Open(Config{NodeID: uint64(i + 1), GroupCount: 2, Peers: peers, Listener: rafts[i], InitMembership: true,
			HeartbeatTimeout: 300 * time.Millisecond, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		srv := server.New(e, server.Config{ClusterID: "cold-raft"})
		if err := srv.EnableCold(store, cfg, server.ColdOptions{BackoffMax: 200 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewUnstartedServer(srv)
		ts.Listener.Close()
		ts.Listener = https[i]
		ts.Start()
		adm := httptest.NewServer(srv.AdminHandler())
		nd := &coldNode{e: e, srv: srv, ts: ts, adm: adm}
		t.Cleanup(func() { ts.Close(); adm.Close(); srv.StopCold(); e.Close() })
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		waitReady(t, nd.e)
	}
	return nodes
}

func do(t *testing.T, method, url string, body []byte) (*http.Response, []byte) {
	t.Helper()
	if strings.Contains(url, "/__ursula/") {
		return doH(t, method, url, body, "Content-Type", "application/octet-stream", "X-Ursula-Admin", "1")
	}
	return doH(t, method, url, body, "Content-Type", "application/octet-stream")
}

// hotRecount is what the O(1) counter must equal: the hot bytes of every stream of g.
func hotRecount(e *Engine, g uint64) int64 {
	gr := e.groups[g]
	gr.RLock()
	defer gr.RUnlock()
	var n int64
	for _, s := range gr.StateLocked().Streams {
		n += int64(s.Tail() - s.Data.Base())
	}
	return n
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestColdThreeVoters: only the leader flushes; the record trims every replica's hot
// buffer (the per-group counter equals a recount everywhere); a follower answers 307
// before ColdBackpressure and serves flushed bytes from the shared store; the collector
// runs on group 0's leader only, deletes an orphan, and keeps what replicas reference.
func TestColdThreeVoters(t *testing.T) {
	store, err := coldstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hotCap := coldstore.Size(256 << 10)
	noWait := coldstore.Duration(0) // the write over the cap is refused at once
	cfg := coldstore.Config{BackpressureWait: &noWait, Backend: "fs", Dir: "unused", Root: "root", FlushInterval: coldstore.Duration(time.Hour),
		// flush_size = the cap: the writes below it never wake the flusher (the first write
		// over the cap does, after the appends this test counts)
		FlushSize: 256 << 10, FlushMaxConcurrency: 2, MaxHotSizePerGroup: &hotCap, CacheSize: 1 << 20,
		GCInterval: coldstore.Duration(50 * time.Millisecond), GCGrace: coldstore.Duration(200 * time.Millisecond)}
	nodes := coldCluster(t, 3, store, cfg)
	key := "coldb/s"
	g := nodes[0].e.GroupOf(key)
	lid := nodes[0].e.LeaderOf(g)
	L, F := nodes[lid-1], nodes[lid%3]
	data := bytes.Repeat([]byte("0123456789abcdef"), 20<<10) // 320 KiB
	if res, b := do(t, http.MethodPut, L.ts.URL+"/"+key, data[:100<<10]); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	for _, part := range [][]byte{data[100<<10 : 200<<10], data[200<<10:]} {
		if res, b := do(t, http.MethodPost, L.ts.URL+"/"+key, part); res.StatusCode != http.StatusNoContent {
			t.Fatalf("append: %d %s", res.StatusCode, b)
		}
	}
	for _, nd := range nodes {
		eventually(t, "replicas apply the appends", func() bool { return nd.e.GroupHotBytes(g) == int64(len(data)) })
		if r := hotRecount(nd.e, g); r != int64(len(data)) {
			t.Fatalf("hot counter %d, recount %d", nd.e.GroupHotBytes(g), r)
		}
	}
	if gs := fmt.Sprint(L.e.FlushGroups()); !strings.Contains(" "+strings.Trim(gs, "[]")+" ", fmt.Sprintf(" %d ", g)) {
		t.Fatalf("leader's cold groups %s lack %d", gs, g)
	}
	for _, cg := range F.e.FlushGroups() {
		if cg == g {
			t.Fatal("a follower lists a group it does not lead")
		}
	}
	// Over the cap: the leader refuses with ColdBackpressure, a follower redirects first.
	res, _ := do(t, http.MethodPost, L.ts.URL+"/"+key, []byte("x"))
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get(streamcore.HdrNotApplied) != "ColdBackpressure" {
		t.Fatalf("leader over the cap: %d %v", res.StatusCode, res.Header)
	}
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprintf("coldb/o%d", i); F.e.GroupOf(k) == g {
			other = k
		}
	}
	for _, req := range []struct{ method, key string }{{http.MethodPost, key}, {http.MethodPut, other}} {
		res, _ := do(t, req.method, F.ts.URL+"/"+req.key, []byte("x"))
		if res.StatusCode != http.StatusTemporaryRedirect || res.Header.Get(streamcore.HdrNotApplied) != "NotLeader" {
			t.Fatalf("follower %s over the cap: %d %v", req.method, res.StatusCode, res.Header)
		}
	}
	if res, _ := do(t, http.MethodPost, F.adm.URL+"/__ursula/flush-cold/"+key, nil); res.StatusCode != http.StatusConflict {
		t.Fatalf("flush on a follower: %d", res.StatusCode)
	}
	if res, b := do(t, http.MethodPost, L.adm.URL+"/__ursula/flush-cold/"+key, nil); res.StatusCode != http.StatusOK || !strings.Contains(string(b), streamcore.FormatOffset(uint64(len(data)))) {
		t.Fatalf("flush on the leader: %d %s", res.StatusCode, b)
	}
	for _, nd := range nodes {
		eventually(t, "every replica trims its hot buffer", func() bool { return nd.e.GroupHotBytes(g) == 0 && hotRecount(nd.e, g) == 0 })
	}
	if st := F.srv.ColdStats(); st.FlushedObjects != 0 {
		t.Fatalf("a follower flushed: %+v", st)
	}
	res, b := do(t, http.MethodGet, F.ts.URL+"/"+key+"?offset=-1", nil)
	if res.StatusCode != http.StatusOK || !bytes.Equal(b, data) {
		t.Fatalf("follower cold read: %d, %d bytes", res.StatusCode, len(b))
	}
	if F.srv.ColdStats().ColdReadBytes == 0 {
		t.Fatal("the follower's read did not come from the cold tier")
	}
	// Collection: an orphan goes (on group 0's leader only); what replicas reference stays.
	var chunk string
	F.e.View(key, time.Now().UnixMilli(), func(_ *streamcore.State, s *streamcore.Stream) { chunk = s.Chunks[0].Key })
	orphan := "root/cold-raft/coldb/orphan-object"
	if err := store.Put(context.Background(), orphan, strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	// The collector's question over the peer channel: every other voter references the
	// chunk; nobody needs the orphan.
	needed, err := L.e.PeersColdRefs(context.Background(), []string{chunk, orphan})
	if err != nil || len(needed) != 1 || !needed[chunk] {
		t.Fatalf("peers' cold refs: %v %v", needed, err)
	}
	eventually(t, "the orphan is collected", func() bool {
		_, err := coldstore.ReadAll(context.Background(), store, orphan, 0, -1)
		return err != nil
	})
	time.Sleep(400 * time.Millisecond) // more passes past the grace
	collector := nodes[0].e.LeaderOf(0)
	for i, nd := range nodes {
		if d := nd.srv.ColdStats().GCDeletedObjects; d != 0 && uint64(i+1) != collector {
			t.Fatalf("node %d (not group 0's leader %d) deleted %d objects", i+1, collector, d)
		}
	}
	res, b = do(t, http.MethodGet, F.ts.URL+"/"+key+"?offset=-1", nil)
	if res.StatusCode != http.StatusOK || !bytes.Equal(b, data) {
		t.Fatalf("read after collection: %d, %d bytes", res.StatusCode, len(b))
	}
	// Leadership moves: the new leader flushes, the old one (now a follower) reads cold.
	// A loaded machine may lose the group's leader meanwhile: ask again until F leads.
	eventually(t, "the transfer", func() bool {
		if F.e.LeaderHint(key) == nil && L.e.LeaderOf(uint64(g)) == F.e.cfg.NodeID {
			return true
		}
		_ = L.e.TransferLeadership(uint64(g), F.e.cfg.NodeID)
		return false
	})
	more := bytes.Repeat([]byte("new leader "), 10<<10)
	if res, b := do(t, http.MethodPost, F.ts.URL+"/"+key, more); res.StatusCode != http.StatusNoContent {
		t.Fatalf("append on the new leader: %d %s", res.StatusCode, b)
	}
	if res, b := do(t, http.MethodPost, F.adm.URL+"/__ursula/flush-cold/"+key, nil); res.StatusCode != http.StatusOK {
		t.Fatalf("flush on the new leader: %d %s", res.StatusCode, b)
	}
	all := append(append([]byte(nil), data...), more...)
	// A follower serves what it has applied: wait until L has applied the append and the
	// flush record (its hot counter was already 0 before the append reached it).
	eventually(t, "the old leader applies and trims", func() bool {
		base := uint64(0)
		L.e.View(key, time.Now().UnixMilli(), func(_ *streamcore.State, s *streamcore.Stream) {
			if s != nil {
				base = s.Data.Base()
			}
		})
		return base == uint64(len(all)) && L.e.GroupHotBytes(g) == 0
	})
	res, b = do(t, http.MethodGet, L.ts.URL+"/"+key+"?offset=-1", nil)
	if res.StatusCode != http.StatusOK || !bytes.Equal(b, all) {
		t.Fatalf("old leader's read after the transfer: %d, %d bytes of %d", res.StatusCode, len(b), len(all))
	}
}

// TestColdHotCounterRestart: the hot counter is rebuilt from a raft snapshot and the log
// on restart.
func TestColdHotCounterRestart(t *testing.T) {
	dir := t.TempDir()
	store, err := coldstore.NewFS(dir + "/cold")
	if err != nil {
		t.Fatal(err)
	}
	cfg := coldstore.Config{Backend: "fs", Dir: "unused", FlushInterval: coldstore.Duration(time.Hour), FlushSize: 1 << 20, // no write reaches flush_size: only the admin flush flushes
		GCInterval: coldstore.Duration(time.Hour)}
	open := func() (*Engine, *server.Server, func()) {
		stores, l := nodelogStores(t, dir+"/wal")
		e, err := Open(Config{NodeID: 1, GroupCount: 2, Dir: dir + "/raft", Stores: stores, SnapshotThreshold: 5, TrailingLogs: 2,
			SnapshotInterval: 50 * time.Millisecond, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		waitReady(t, e)
		srv := server.New(e, server.Config{ClusterID: "c"})
		if err := srv.EnableCold(store, cfg, server.ColdOptions{}); err != nil {
			t.Fatal(err)
		}
		return e, srv, func() { srv.StopCold(); e.Close(); l.Close() }
	}
	e, srv, closeAll := open()
	ts := httptest.NewServer(srv)
	key := "hotb/s"
	g := e.GroupOf(key)
	body := bytes.Repeat([]byte("z"), 100<<10)
	do(t, http.MethodPut, ts.URL+"/"+key, nil)
	do(t, http.MethodPost, ts.URL+"/"+key, body)
	adm := httptest.NewServer(srv.AdminHandler())
	res, b := do(t, http.MethodPost, adm.URL+"/__ursula/flush-cold/"+key, nil)
	adm.Close()
	if res.StatusCode != 200 {
		t.Fatalf("flush: %d %s", res.StatusCode, b)
	}
	for range 6 {
		do(t, http.MethodPost, ts.URL+"/"+key, body[:10<<10])
	}
	want := int64(60 << 10)
	if h := e.GroupHotBytes(g); h != want {
		t.Fatalf("hot %d, want %d", h, want)
	}
	eventually(t, "a raft snapshot of the group", func() bool {
		ents, _ := os.ReadDir(fmt.Sprintf("%s/raft/g%04d/snapshots", dir, g))
		return len(ents) > 0
	})
	ts.Close()
	closeAll()
	e, srv, closeAll = open()
	defer closeAll()
	if h, r := e.GroupHotBytes(g), hotRecount(e, g); h != want || r != want {
		t.Fatalf("after restart: hot counter %d, recount %d, want %d", h, r, want)
	}
	ts = httptest.NewServer(srv)
	defer ts.Close()
	res, b = do(t, http.MethodGet, ts.URL+"/"+key+"?offset=-1", nil)
	if res.StatusCode != 200 || len(b) != len(body)+int(want) {
		t.Fatalf("read after restart: %d, %d bytes", res.StatusCode, len(b))
	}
}
