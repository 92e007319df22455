package raftengine

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/ursula-go/ursula/internal/pagecache"
	"github.com/ursula-go/ursula/server"
)

// TestSnapshotPagesDropped: a group's snapshot, once written, does not stay in the page
// cache (a file written beside it the same way does), and the engine restarts from it
// with every byte.
func TestSnapshotPagesDropped(t *testing.T) {
	dir := t.TempDir()
	open := func() (*Engine, *httptest.Server, func()) {
		stores, l := nodelogStores(t, dir+"/wal")
		e, err := Open(Config{NodeID: 1, GroupCount: 1, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		waitReady(t, e)
		ts := httptest.NewServer(server.New(e, server.Config{ClusterID: "c"}))
		return e, ts, func() { ts.Close(); e.Close(); l.Close() }
	}
	e, ts, closeAll := open()
	body := bytes.Repeat([]byte("snapshot"), 512<<10) // 4 MiB
	if res, b := do(t, http.MethodPut, ts.URL+"/snap/s", body); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	if err := e.groups[0].r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	states, _ := filepath.Glob(filepath.Join(dir, "raft", "g0000", "snapshots", "*", "state.bin"))
	if len(states) != 1 {
		t.Fatalf("snapshot files: %v", states)
	}
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, n, err := pagecache.Resident(control); err != nil || r < n/2 {
		t.Logf("a file just written has %d of %d pages cached (%v): residency not visible here", r, n, err)
	} else if r, n, err := pagecache.Resident(states[0]); err != nil || r > n/8 {
		t.Fatalf("%d of %d pages of the snapshot stay in the page cache (%v)", r, n, err)
	}
	closeAll()
	_, ts, closeAll = open()
	defer closeAll()
	res, b := do(t, http.MethodGet, ts.URL+"/snap/s?offset=-1", nil)
	if res.StatusCode != http.StatusOK || !bytes.Equal(b, body) {
		t.Fatalf("read after restart: %d, %d bytes", res.StatusCode, len(b))
	}
}
