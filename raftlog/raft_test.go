package raftlog

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// sumFSM folds applied commands into a count and a running checksum, so two
// replicas that applied the same log agree on both.
type sumFSM struct {
	mu    sync.Mutex
	count uint64
	sum   uint64
}

func (f *sumFSM) Apply(e *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count++
	for _, b := range e.Data {
		f.sum = f.sum*31 + uint64(b)
	}
	return nil
}

func (f *sumFSM) state() (uint64, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count, f.sum
}

func (f *sumFSM) Snapshot() (raft.FSMSnapshot, error) {
	c, s := f.state()
	return &sumSnap{c, s}, nil
}

func (f *sumFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var b [16]byte
	if _, err := io.ReadFull(rc, b[:]); err != nil {
		return err
	}
	f.mu.Lock()
	f.count, f.sum = binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
	f.mu.Unlock()
	return nil
}

type sumSnap struct{ count, sum uint64 }

func (s *sumSnap) Persist(sink raft.SnapshotSink) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], s.count)
	binary.LittleEndian.PutUint64(b[8:], s.sum)
	if _, err := sink.Write(b[:]); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}
func (s *sumSnap) Release() {}

// replica is one (node, group) raft instance.
type replica struct {
	fsm   *sumFSM
	snaps *raft.InmemSnapshotStore // stands in for a persistent snapshot store
	trans *raft.InmemTransport
	r     *raft.Raft
}

type testNode struct {
	dir  string
	log  *Log
	reps map[uint64]*replica
}

// TestRaftClusterOnNodeLog runs three nodes, each with one journal shared by
// two raft groups, applies commands, compacts, restarts one node from its
// journal while the others keep going, and checks it catches up.
func TestRaftClusterOnNodeLog(t *testing.T) {
	if testing.Short() {
		t.Skip("raft cluster")
	}
	groups := []uint64{11, 12}
	ids := []raft.ServerID{"n1", "n2", "n3"}
	addr := func(n int, g uint64) raft.ServerAddress { return raft.ServerAddress(fmt.Sprintf("%s-g%d", ids[n], g)) }
	opt := Options{Fsync: FsyncNever, SegmentBytes: 8 << 10, Logf: t.Logf}
	conf := func(n int) *raft.Config {
		c := raft.DefaultConfig()
		c.LocalID = ids[n]
		c.HeartbeatTimeout = 100 * time.Millisecond
		c.ElectionTimeout = 100 * time.Millisecond
		c.LeaderLeaseTimeout = 50 * time.Millisecond
		c.CommitTimeout = 5 * time.Millisecond
		c.SnapshotInterval = 50 * time.Millisecond
		c.SnapshotThreshold = 64
		c.TrailingLogs = 16
		c.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: io.Discard})
		return c
	}
	nodes := make([]*testNode, 3)
	connect := func(g uint64) {
		for i := range nodes {
			for j := range nodes {
				if i != j && nodes[i].reps[g] != nil && nodes[j].reps[g] != nil {
					nodes[i].reps[g].trans.Connect(addr(j, g), nodes[j].reps[g].trans)
				}
			}
		}
	}
	start := func(n int) {
		nd := nodes[n]
		nd.log = openT(t, nd.dir, opt)
		for _, g := range groups {
			rep := nd.reps[g]
			if rep == nil {
				rep = &replica{snaps: raft.NewInmemSnapshotStore()}
				nd.reps[g] = rep
			}
			rep.fsm = &sumFSM{}
			_, rep.trans = raft.NewInmemTransport(addr(n, g))
			store := nd.log.Group(g)
			r, err := raft.NewRaft(conf(n), rep.fsm, store, store, rep.snaps, rep.trans)
			if err != nil {
				t.Fatalf("node %d group %d: %v", n, g, err)
			}
			rep.r = r
		}
	}
	for n := range nodes {
		nodes[n] = &testNode{dir: t.TempDir(), reps: map[uint64]*replica{}}
		start(n)
	}
	for _, g := range groups {
		connect(g)
		var servers []raft.Server
		for n := range nodes {
			servers = append(servers, raft.Server{ID: ids[n], Address: addr(n, g)})
		}
		if err := nodes[0].reps[g].r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, nd := range nodes {
			for _, rep := range nd.reps {
				rep.r.Shutdown().Error()
			}
			nd.log.Close()
		}
	}()

	leader := func(g uint64) *raft.Raft {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			for _, nd := range nodes {
				if r := nd.reps[g].r; r.State() == raft.Leader {
					return r
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("group %d: no leader", g)
		return nil
	}
	apply := func(g uint64, from, to int) {
		for i := from; i < to; i++ {
			var err error
			for try := 0; try < 50; try++ {
				if err = leader(g).Apply([]byte(fmt.Sprintf("g%d cmd %d", g, i)), time.Second).Error(); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("group %d apply %d: %v", g, i, err)
			}
		}
	}
	waitConverged := func(g uint64, want uint64) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			// An Apply that timed out may still commit and is retried, so a
			// command can apply twice: replicas must agree, on >= want.
			c0, s0 := nodes[0].reps[g].fsm.state()
			same := c0 >= want
			for _, nd := range nodes[1:] {
				c, s := nd.reps[g].fsm.state()
				same = same && c == c0 && s == s0
			}
			if same {
				return
			}
			if time.Now().After(deadline) {
				for n, nd := range nodes {
					c, s := nd.reps[g].fsm.state()
					t.Logf("node %d group %d: count %d sum %x", n, g, c, s)
				}
				t.Fatalf("group %d did not converge on %d commands", g, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	for _, g := range groups {
		apply(g, 0, 150)
	}
	for _, g := range groups {
		waitConverged(g, 150)
	}

	// Restart node 3 from its journal while the others keep applying.
	n := 2
	for _, g := range groups {
		if err := nodes[n].reps[g].r.Shutdown().Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := nodes[n].log.Close(); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		apply(g, 150, 250)
	}
	start(n)
	st := nodes[n].log.Stats()
	t.Logf("restarted node: %+v", st)
	if st.RecoveredEntries == 0 {
		t.Fatal("restarted node recovered no entries")
	}
	for _, g := range groups {
		connect(g)
		if c := nodes[n].reps[g].r.GetConfiguration().Configuration(); len(c.Servers) != 3 {
			t.Fatalf("group %d: restarted node lost its configuration: %+v", g, c)
		}
		if term, _ := nodes[n].log.Group(g).GetUint64([]byte("CurrentTerm")); term == 0 {
			t.Fatalf("group %d: restarted node lost its term", g)
		}
	}
	for _, g := range groups {
		apply(g, 250, 300)
	}
	for _, g := range groups {
		waitConverged(g, 300)
	}
	purged := uint64(0)
	for _, nd := range nodes {
		settle(t, nd.log)
		purged += nd.log.Stats().PurgedSegments
	}
	if purged == 0 {
		t.Errorf("log compaction purged no segment on any node")
	}
}
