package raftengine

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

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

// TestSnapshotOpenVerifies: the store reads a snapshot in one pass and gives the bytes
// raft's own file store gives; a damaged or short state file fails before its last bytes
// are handed out, whatever the reader's buffer size.
func TestSnapshotOpenVerifies(t *testing.T) {
	dir := t.TempDir()
	s, err := newSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	_, trans := raft.NewInmemTransport("a")
	sink, err := s.Create(raft.SnapshotVersionMax, 42, 3, raft.Configuration{}, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	id := sink.ID()
	wantMeta, rc, err := s.FileSnapshotStore.Open(id) // raft's own reading, for comparison
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	readAll := func(buf int) ([]byte, error) {
		meta, rc, err := s.Open(id)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		if meta.ID != wantMeta.ID || meta.Index != 42 || meta.Term != 3 || meta.Size != wantMeta.Size {
			t.Fatalf("meta %+v, raft's store says %+v", meta, wantMeta)
		}
		var out bytes.Buffer
		_, err = io.CopyBuffer(struct{ io.Writer }{&out}, struct{ io.Reader }{rc}, make([]byte, buf))
		return out.Bytes(), err
	}
	for _, buf := range []int{1, 4096, 1 << 20, len(data) + 1} {
		if got, err := readAll(buf); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("buffer %d: %d bytes, %v", buf, len(got), err)
		}
	}
	state := filepath.Join(dir, "snapshots", id, "state.bin")
	damaged := bytes.Clone(data)
	damaged[len(damaged)/2] ^= 1
	if err := os.WriteFile(state, damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, buf := range []int{4096, len(data) + 1} {
		got, err := readAll(buf)
		if err == nil || len(got) >= len(data) {
			t.Fatalf("damaged snapshot, buffer %d: %d of %d bytes handed out, err %v", buf, len(got), len(data), err)
		}
	}
	if err := os.WriteFile(state, data[:len(data)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(4096); err == nil {
		t.Fatalf("short snapshot read without error (%d bytes)", len(got))
	}
	if _, _, err := s.Open("no-such-snapshot"); err == nil {
		t.Fatal("opened a snapshot that does not exist")
	}
}
