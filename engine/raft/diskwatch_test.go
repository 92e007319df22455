package raftengine

import (
	"bytes"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/raftlog"
	"github.com/ursula-go/ursula/server"
)

// fakeDisk is a write admission a test turns on and off (raftlog.DiskGuard in a node).
type fakeDisk struct{ full atomic.Bool }

func (d *fakeDisk) WriteRefusal() (string, string) {
	if d.full.Load() {
		return "WalDiskPressure", "the journal's disk is full (test)"
	}
	return "", ""
}

// TestDiskPressureHandsLeadershipOff: a leader whose journal disk takes no writes hands
// every group it leads to a healthy voter, says why in its status (and so in the
// metrics), and stops saying it once space is back.
func TestDiskPressureHandsLeadershipOff(t *testing.T) {
	lns, peers := loopbackPeers(t, 3)
	disks := make([]*fakeDisk, 3)
	var es []*Engine
	for i := range 3 {
		disks[i] = &fakeDisk{}
		e, err := Open(Config{NodeID: uint64(i + 1), GroupCount: 4, Peers: peers, Listener: lns[i], InitMembership: true,
			HeartbeatTimeout: 300 * time.Millisecond, RaftLog: io.Discard, WriteAdmission: disks[i].WriteRefusal})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		es = append(es, e)
	}
	for _, e := range es {
		waitReady(t, e)
	}
	// Node 1 leads every group.
	for g := range uint64(4) {
		eventually(t, "node 1 takes the lead", func() bool {
			if es[0].groups[g].r.State() == raft.Leader {
				return true
			}
			if l := es[0].LeaderOf(g); l != 0 {
				es[l-1].TransferLeadership(g, 1)
			}
			return false
		})
	}
	disks[0].full.Store(true)
	eventually(t, "node 1 hands every leadership off", func() bool {
		for g := range uint64(4) {
			if l := es[1].LeaderOf(g); l == 0 || l == 1 || es[0].groups[g].r.State() == raft.Leader {
				return false
			}
		}
		return true
	})
	st := es[0].RaftStatus().(Status)
	if st.DiskPressure == "" || st.PressureTransfers < 4 || st.Leading != 0 {
		t.Fatalf("status under pressure: pressure %q, transfers %d, leading %d", st.DiskPressure, st.PressureTransfers, st.Leading)
	}
	if st := es[1].RaftStatus().(Status); st.DiskPressure != "" {
		t.Fatalf("a healthy node reports pressure: %q", st.DiskPressure)
	}
	// The cluster still takes writes through the healthy leaders.
	key := "disk/s"
	leader := es[es[1].LeaderOf(es[1].GroupOf(key))-1]
	if r, err := leader.Propose(t.Context(), create(key)); err != nil || r.Status != http.StatusCreated {
		t.Fatalf("create through a healthy leader: %+v %v", r, err)
	}
	disks[0].full.Store(false)
	eventually(t, "node 1 stops reporting pressure", func() bool { return es[0].RaftStatus().(Status).DiskPressure == "" })
}

// trimNode is a single voter on the node journal with an fs cold tier that flushes only
// when asked (POST /__ursula/flush-cold/{key} on adm).
type trimNode struct {
	e        *Engine
	l        *raftlog.Log
	ts, adm  *httptest.Server
	coldDir  string
	flushKey func(key string)
}

func newTrimNode(t *testing.T, groups int) *trimNode {
	dir := t.TempDir()
	n := &trimNode{coldDir: t.TempDir()}
	store, err := coldstore.NewFS(n.coldDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := coldstore.Config{Backend: "fs", Dir: "unused", Root: "root", FlushInterval: coldstore.Duration(time.Hour),
		FlushSize: 64 << 20, FlushMaxConcurrency: 2, CacheSize: 1 << 20, GCInterval: coldstore.Duration(time.Hour)}
	stores, l := nodelogStores(t, dir+"/wal")
	t.Cleanup(func() { l.Close() })
	// The default threshold (8192 entries) is far away: only the trim can compact.
	e, err := Open(Config{NodeID: 1, GroupCount: groups, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	waitReady(t, e)
	srv := server.New(e, server.Config{ClusterID: "c"})
	if err := srv.EnableCold(store, cfg, server.ColdOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.StopCold)
	n.e, n.l = e, l
	n.ts = httptest.NewServer(srv)
	t.Cleanup(n.ts.Close)
	n.adm = httptest.NewServer(srv.AdminHandler())
	t.Cleanup(n.adm.Close)
	n.flushKey = func(key string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			res, b := do(t, http.MethodPost, n.adm.URL+"/__ursula/flush-cold/"+key, nil)
			if res.StatusCode == http.StatusOK {
				return
			}
			if res.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
				t.Fatalf("flush: %d %s", res.StatusCode, b)
			}
		}
	}
	return n
}

// fill creates key and appends count bodies of size bytes to it.
func (n *trimNode) fill(t *testing.T, key string, body []byte, count int) {
	t.Helper()
	do(t, http.MethodPut, n.ts.URL+"/"+key, nil)
	for range count {
		if res, b := do(t, http.MethodPost, n.ts.URL+"/"+key, body); res.StatusCode != http.StatusNoContent {
			t.Fatalf("append: %d %s", res.StatusCode, b)
		}
	}
}

// TestFlushTrimsJournal: once a group's data reached the cold tier, the group snapshots
// and its log is compacted (not at SnapshotThreshold), so the journal's bytes on disk drop
// within seconds; flushing again writes no second cold object for the same bytes.
func TestFlushTrimsJournal(t *testing.T) {
	n := newTrimNode(t, 2)
	e, l, ts, flush := n.e, n.l, n.ts, n.flushKey
	key := "trimb/s"
	body := bytes.Repeat([]byte("t"), 64<<10)
	n.fill(t, key, body, 96) // 6 MiB
	before := l.Stats().Bytes
	flush(key)
	start := time.Now()
	eventually(t, "the journal releases the flushed entries", func() bool {
		return l.Stats().Bytes < before/4 && e.RaftStatus().(Status).LogTrims > 0
	})
	t.Logf("journal bytes %d before the flush, %d after %v", before, l.Stats().Bytes, time.Since(start).Round(10*time.Millisecond))
	objects := countFiles(t, n.coldDir)
	for range 2 {
		flush(key)
	}
	if c := countFiles(t, n.coldDir); c != objects {
		t.Fatalf("repeated flushes of flushed data wrote %d cold objects, then %d", objects, c)
	}
	// New bytes make one new object; the flushed ones are not written again.
	if res, b := do(t, http.MethodPost, ts.URL+"/"+key, body[:1000]); res.StatusCode != http.StatusNoContent {
		t.Fatalf("append: %d %s", res.StatusCode, b)
	}
	flush(key)
	if c := countFiles(t, n.coldDir); c != objects+1 {
		t.Fatalf("a flush of 1000 new bytes took the cold objects from %d to %d", objects, c)
	}
	var got []byte
	for off := "-1"; ; {
		res, b := do(t, http.MethodGet, ts.URL+"/"+key+"?offset="+off, nil)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("read after the trim: %d %s", res.StatusCode, b)
		}
		got = append(got, b...)
		if res.Header.Get("Stream-Up-To-Date") == "true" || len(b) == 0 {
			break
		}
		off = res.Header.Get("Stream-Next-Offset")
	}
	if want := append(bytes.Repeat(body, 96), body[:1000]...); !bytes.Equal(got, want) {
		t.Fatalf("read after the trim: %d bytes, want %d", len(got), len(want))
	}
}

// TestTrimWaitsUntilWorthIt: a flush that leaves most of a group's bytes hot does not
// snapshot the group (the snapshot would rewrite about as much as the trim releases);
// once the hot bytes are small against the log, the trim runs.
func TestTrimWaitsUntilWorthIt(t *testing.T) {
	n := newTrimNode(t, 1)
	body := bytes.Repeat([]byte("w"), 64<<10)
	n.fill(t, "worth/big", body, 32)  // 2 MiB stays hot
	n.fill(t, "worth/small", body, 4) // 256 KiB goes cold
	n.flushKey("worth/small")
	g := n.e.groups[0]
	if held, hot := g.logs.heldBytes(), g.HotBytes(); float64(held) >= DefaultTrimLogRatio*float64(hot) {
		t.Fatalf("fixture: %d log bytes against %d hot bytes would be worth a trim", held, hot)
	}
	// The watch looks every 250 ms; give it several looks (a slow machine only makes this
	// check weaker, never wrong).
	time.Sleep(6 * diskWatchTick)
	if trims := n.e.RaftStatus().(Status).LogTrims; trims != 0 {
		t.Fatalf("%d trims after a flush that left %d of %d log bytes hot", trims, g.HotBytes(), g.logs.heldBytes())
	}
	before := n.l.Stats().Bytes
	n.flushKey("worth/big")
	eventually(t, "the trim once the group's bytes are cold", func() bool {
		return n.e.RaftStatus().(Status).LogTrims > 0 && n.l.Stats().Bytes < before/4
	})
	if meta := g.snapMeta.Load(); meta <= 0 || meta > 4<<20 {
		t.Fatalf("the snapshot's size beyond its hot bytes: %d", meta)
	}
}

func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}
