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
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestSnapshotOpenVerifies: a snapshot written by the store (CRC-32C) and one written by
// raft's own file store (CRC-64, as earlier builds did) both read back whole in one pass,
// with the metadata raft's store lists; a damaged or short state file fails before its
// last bytes are handed out, whatever the reader's buffer size; a half-written snapshot
// left by a crash is removed when the store opens.
func TestSnapshotOpenVerifies(t *testing.T) {
	dir := t.TempDir()
	s, err := newSnapshotStore(dir, 3, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	_, trans := raft.NewInmemTransport("a")
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "1", Address: "a"}}}
	write := func(create func(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error), index uint64) string {
		sink, err := create(raft.SnapshotVersionMax, index, 3, conf, 1, trans)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sink.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
		return sink.ID()
	}
	old := write(s.FileSnapshotStore.Create, 41) // raft's own sink: CRC-64
	id := write(s.Create, 42)
	metas, err := s.List()
	if err != nil || len(metas) != 2 || metas[0].ID != id || metas[1].ID != old {
		t.Fatalf("raft's store lists %v (%v), want %s then %s", metas, err, id, old)
	}
	readAll := func(id string, buf int) ([]byte, error) {
		meta, rc, err := s.Open(id)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		if meta.ID != id || meta.Term != 3 || meta.Size != int64(len(data)) || meta.ConfigurationIndex != 1 ||
			len(meta.Configuration.Servers) != 1 || meta.Configuration.Servers[0].ID != "1" {
			t.Fatalf("meta %+v", meta)
		}
		var out bytes.Buffer
		_, err = io.CopyBuffer(struct{ io.Writer }{&out}, struct{ io.Reader }{rc}, make([]byte, buf))
		return out.Bytes(), err
	}
	for _, sid := range []string{id, old} {
		for _, buf := range []int{1, 4096, 1 << 20, len(data) + 1} {
			if got, err := readAll(sid, buf); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("%s, buffer %d: %d bytes, %v", sid, buf, len(got), err)
			}
		}
	}
	for _, sid := range []string{id, old} {
		state := filepath.Join(dir, "snapshots", sid, "state.bin")
		damaged := bytes.Clone(data)
		damaged[len(damaged)/2] ^= 1
		if err := os.WriteFile(state, damaged, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, buf := range []int{4096, len(data) + 1} {
			got, err := readAll(sid, buf)
			if err == nil || len(got) >= len(data) {
				t.Fatalf("damaged snapshot %s, buffer %d: %d of %d bytes handed out, err %v", sid, buf, len(got), len(data), err)
			}
		}
		if err := os.WriteFile(state, data[:len(data)-1], 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := readAll(sid, 4096); err == nil {
			t.Fatalf("short snapshot %s read without error (%d bytes)", sid, len(got))
		}
	}
	if _, _, err := s.Open("no-such-snapshot"); err == nil {
		t.Fatal("opened a snapshot that does not exist")
	}

	// A crash in the middle of a snapshot leaves its .tmp directory; a cancelled one
	// leaves nothing.
	sink, err := s.Create(raft.SnapshotVersionMax, 43, 3, conf, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	sink.Write(data)
	cancelled, err := s.Create(raft.SnapshotVersionMax, 44, 3, conf, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	if err := cancelled.Cancel(); err != nil {
		t.Fatal(err)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*.tmp"))
	if len(tmps) != 1 {
		t.Fatalf("unfinished snapshots on disk: %v, want the one left open", tmps)
	}
	if _, err := newSnapshotStore(dir, 3, io.Discard); err != nil {
		t.Fatal(err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*.tmp")); len(tmps) != 0 {
		t.Fatalf("the store opened and left %v", tmps)
	}
	if metas, err := s.List(); err != nil || len(metas) != 2 {
		t.Fatalf("after the restart raft's store lists %v (%v)", metas, err)
	}
	if _, err := s.Create(2, 45, 3, conf, 1, trans); err == nil {
		t.Fatal("created a snapshot of version 2")
	}
}

// BenchmarkSnapshotWrite: 64 MiB written in 64 KiB pieces (as WriteState writes) through
// the store's sink (CRC-32C) and through raft's own (CRC-64), fsync and rename included.
func BenchmarkSnapshotWrite(b *testing.B) {
	s, err := newSnapshotStore(b.TempDir(), 2, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("a")
	piece := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	for _, c := range []struct {
		name   string
		create func(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error)
	}{{"crc32c", s.Create}, {"raft-crc64", s.FileSnapshotStore.Create}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for i := 0; b.Loop(); i++ {
				sink, err := c.create(raft.SnapshotVersionMax, uint64(i+1), 1, raft.Configuration{}, 0, trans)
				if err != nil {
					b.Fatal(err)
				}
				for range 1024 {
					if _, err := sink.Write(piece); err != nil {
						b.Fatal(err)
					}
				}
				if err := sink.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSnapshotOpen: a 64 MiB snapshot read whole through the store's Open (one pass;
// one written by the store, CRC-32C, and one by raft's sink, CRC-64) and through raft's
// (a checking pass, then the read). The files are in the page cache here, unlike on a
// restart, where the store's snapshots were dropped from it.
func BenchmarkSnapshotOpen(b *testing.B) {
	s, err := newSnapshotStore(b.TempDir(), 2, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("a")
	data := bytes.Repeat([]byte("0123456789abcdef"), 4<<20)
	sink, err := s.FileSnapshotStore.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 0, trans)
	if err != nil {
		b.Fatal(err)
	}
	sink.Write(data)
	if err := sink.Close(); err != nil {
		b.Fatal(err)
	}
	ours, err := s.Create(raft.SnapshotVersionMax, 2, 1, raft.Configuration{}, 0, trans)
	if err != nil {
		b.Fatal(err)
	}
	ours.Write(data)
	if err := ours.Close(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, len(data)+1)
	for _, c := range []struct {
		name string
		open func(string) (*raft.SnapshotMeta, io.ReadCloser, error)
		id   string
	}{{"one-pass-crc32c", s.Open, ours.ID()}, {"one-pass-crc64", s.Open, sink.ID()}, {"raft", s.FileSnapshotStore.Open, sink.ID()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				_, rc, err := c.open(c.id)
				if err != nil {
					b.Fatal(err)
				}
				if n, err := io.ReadFull(rc, buf); err != io.ErrUnexpectedEOF || n != len(data) {
					b.Fatalf("read %d bytes: %v", n, err)
				}
				rc.Close()
			}
		})
	}
}

// TestSnapshotInstalledOnFollower: a follower that missed entries the leader compacted
// away catches up from the leader's snapshot over the real transport: the leader's store
// reads it (one pass, CRC-32C checked), the follower's store writes it (its own sink),
// restores it, and holds every byte; it then restarts from that snapshot.
func TestSnapshotInstalledOnFollower(t *testing.T) {
	lns, peers := loopbackPeers(t, 3)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	type node struct {
		e     *Engine
		close func()
	}
	open := func(i int, ln net.Listener) node {
		t.Helper()
		stores, l := nodelogStores(t, dirs[i]+"/wal")
		e, err := Open(Config{NodeID: uint64(i + 1), GroupCount: 1, Peers: peers, Listener: ln, InitMembership: true,
			Dir: dirs[i] + "/raft", Stores: stores, SnapshotThreshold: 1 << 20, TrailingLogs: 2,
			HeartbeatTimeout: 300 * time.Millisecond, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		c := func() { once.Do(func() { e.Close(); l.Close() }) }
		t.Cleanup(c)
		return node{e, c}
	}
	nodes := make([]node, 3)
	for i := range nodes {
		nodes[i] = open(i, lns[i])
	}
	for _, n := range nodes {
		waitReady(t, n.e)
	}
	var leader int
	eventually(t, "a leader", func() bool {
		id := nodes[0].e.LeaderOf(0)
		leader = int(id) - 1
		return id != 0
	})
	f := (leader + 1) % 3 // the follower that will miss entries
	addr := lns[f].Addr().String()
	nodes[f].close()

	ctx := context.Background()
	L := nodes[leader].e
	key := "b/snap"
	if r, err := L.Propose(ctx, create(key)); err != nil || r.Status != http.StatusCreated {
		t.Fatalf("create: %v %+v", err, r)
	}
	var want strings.Builder
	chunk := strings.Repeat("x", 64<<10)
	for i := range 40 { // 2.5 MiB
		body := fmt.Sprintf("%03d", i) + chunk
		if r, err := L.Propose(ctx, appendCmd(key, body)); err != nil || r.Status != http.StatusNoContent {
			t.Fatalf("append %d: %v %+v", i, err, r)
		}
		want.WriteString(body)
	}
	if err := L.groups[0].r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if first, _ := L.groups[0].logs.FirstIndex(); first < 10 {
		t.Fatalf("the leader's log still starts at %d after its snapshot", first)
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the follower's address was taken meanwhile: %v", err)
	}
	nodes[f] = open(f, ln)
	F := nodes[f].e
	eventually(t, "the follower to install the leader's snapshot", func() bool {
		return F.groups[0].r.Stats()["last_snapshot_index"] != "0" && read(F, key) == want.String()
	})
	metas, err := F.groups[0].snaps.List()
	if err != nil || len(metas) == 0 {
		t.Fatalf("the follower's store lists %v (%v)", metas, err)
	}
	b, err := os.ReadFile(filepath.Join(dirs[f], "raft", "g0000", "snapshots", metas[0].ID, "meta.json"))
	if err != nil || !strings.Contains(string(b), `"CRC32C"`) {
		t.Fatalf("the follower's snapshot meta: %s (%v)", b, err)
	}

	// The follower restarts from the snapshot it installed.
	nodes[f].close()
	if ln, err = net.Listen("tcp", addr); err != nil {
		t.Skipf("the follower's address was taken meanwhile: %v", err)
	}
	nodes[f] = open(f, ln)
	F = nodes[f].e
	eventually(t, "the follower to hold every byte after its restart", func() bool {
		return read(F, key) == want.String()
	})
}
