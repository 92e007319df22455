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

// TestFlushTrimsJournal: once a group's data reached the cold tier, the group snapshots
// and its log is compacted at once (not at SnapshotThreshold), so the journal's bytes on
// disk drop within seconds; flushing again writes no second cold object for the same bytes.
func TestFlushTrimsJournal(t *testing.T) {
	dir := t.TempDir()
	coldDir := t.TempDir()
	store, err := coldstore.NewFS(coldDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := coldstore.Config{Backend: "fs", Dir: "unused", Root: "root", FlushInterval: coldstore.Duration(time.Hour),
		FlushSize: 64 << 20, FlushMaxConcurrency: 2, CacheSize: 1 << 20, GCInterval: coldstore.Duration(time.Hour)}
	stores, l := nodelogStores(t, dir+"/wal")
	defer l.Close()
	// The default threshold (8192 entries) is far away: only the trim can compact.
	e, err := Open(Config{NodeID: 1, GroupCount: 2, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitReady(t, e)
	srv := server.New(e, server.Config{ClusterID: "c"})
	if err := srv.EnableCold(store, cfg, server.ColdOptions{}); err != nil {
		t.Fatal(err)
	}
	defer srv.StopCold()
	ts := httptest.NewServer(srv)
	defer ts.Close()
	adm := httptest.NewServer(srv.AdminHandler())
	defer adm.Close()
	key := "trimb/s"
	do(t, http.MethodPut, ts.URL+"/"+key, nil)
	body := bytes.Repeat([]byte("t"), 64<<10)
	for range 96 { // 6 MiB
		if res, b := do(t, http.MethodPost, ts.URL+"/"+key, body); res.StatusCode != http.StatusNoContent {
			t.Fatalf("append: %d %s", res.StatusCode, b)
		}
	}
	before := l.Stats().Bytes
	flush := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			res, b := do(t, http.MethodPost, adm.URL+"/__ursula/flush-cold/"+key, nil)
			if res.StatusCode == http.StatusOK {
				return
			}
			if res.StatusCode != http.StatusTooManyRequests || time.Now().After(deadline) {
				t.Fatalf("flush: %d %s", res.StatusCode, b)
			}
		}
	}
	flush()
	start := time.Now()
	eventually(t, "the journal releases the flushed entries", func() bool {
		return l.Stats().Bytes < before/4 && e.RaftStatus().(Status).LogTrims > 0
	})
	t.Logf("journal bytes %d before the flush, %d after %v", before, l.Stats().Bytes, time.Since(start).Round(10*time.Millisecond))
	objects := countFiles(t, coldDir)
	for range 2 {
		flush()
	}
	if n := countFiles(t, coldDir); n != objects {
		t.Fatalf("repeated flushes of flushed data wrote %d cold objects, then %d", objects, n)
	}
	// New bytes make one new object; the flushed ones are not written again.
	if res, b := do(t, http.MethodPost, ts.URL+"/"+key, body[:1000]); res.StatusCode != http.StatusNoContent {
		t.Fatalf("append: %d %s", res.StatusCode, b)
	}
	flush()
	if n := countFiles(t, coldDir); n != objects+1 {
		t.Fatalf("a flush of 1000 new bytes took the cold objects from %d to %d", objects, n)
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
