package raftengine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/raftlog"
	"github.com/ursula-go/ursula/streamcore"
)

func nodelogStores(t *testing.T, dir string) (StoreFactory, *raftlog.Log) {
	t.Helper()
	l, err := raftlog.Open(dir, raftlog.Options{Fsync: raftlog.FsyncNever, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return func(g uint64) (raft.LogStore, raft.StableStore, error) {
		s := l.Group(g)
		return s, s, nil
	}, l
}

func waitReady(t testing.TB, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, why := e.Ready()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %s", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func create(key string) *streamcore.Command {
	return &streamcore.Command{Op: streamcore.OpCreate, Key: key, Now: time.Now().UnixMilli(), ContentType: "text/plain", TTL: -1, NewIncarnation: 7}
}

func appendCmd(key, body string) *streamcore.Command {
	return &streamcore.Command{Op: streamcore.OpAppend, Key: key, Now: time.Now().UnixMilli(), ContentType: "text/plain", Body: []byte(body)}
}

func read(e *Engine, key string) string {
	var out string
	e.View(key, time.Now().UnixMilli(), func(_ *streamcore.State, s *streamcore.Stream) {
		if s != nil {
			out = string(s.Data.Copy(s.Data.Base(), s.Tail()))
		}
	})
	return out
}

// A single voter on the node log keeps every acknowledged write across a restart, through
// raft snapshots (threshold forced low) and log replay. Forks across groups work.
func TestSingleVoterRestart(t *testing.T) {
	dir := t.TempDir()
	open := func() (*Engine, *raftlog.Log) {
		stores, l := nodelogStores(t, dir+"/wal")
		e, err := Open(Config{NodeID: 1, GroupCount: 4, Dir: dir + "/raft", Stores: stores, SnapshotThreshold: 50, TrailingLogs: 10, SnapshotInterval: 50 * time.Millisecond, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		waitReady(t, e)
		return e, l
	}
	e, l := open()
	ctx := context.Background()
	want := map[string]string{}
	for i := range 8 {
		k := fmt.Sprintf("b/s%d", i)
		if r, err := e.Propose(ctx, create(k)); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("create: %v %+v", err, r)
		}
		for j := range 30 {
			body := fmt.Sprintf("%d-%d;", i, j)
			if r, err := e.Propose(ctx, appendCmd(k, body)); err != nil || r.Status != http.StatusNoContent {
				t.Fatalf("append: %v %+v", err, r)
			}
			want[k] += body
		}
	}
	// Forks of streams that hash to other groups.
	for i := range 4 {
		f := fmt.Sprintf("b/fork%d", i)
		c := create(f)
		c.ContentType = ""
		c.Fork = &streamcore.ForkSpec{Source: fmt.Sprintf("b/s%d", i)}
		if r, err := e.Propose(ctx, c); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("fork: %v %+v", err, r)
		}
		if r, err := e.Propose(ctx, appendCmd(f, "F")); err != nil || r.Status != http.StatusNoContent {
			t.Fatalf("fork append: %v %+v", err, r)
		}
		want[f] = want[fmt.Sprintf("b/s%d", i)] + "F"
		if e.GroupOf(f) != e.GroupOf(fmt.Sprintf("b/s%d", i)) {
			t.Fatal("fork not placed in its source's group")
		}
	}
	// Delete a source with a fork: soft delete.
	if r, _ := e.Propose(ctx, &streamcore.Command{Op: streamcore.OpDelete, Key: "b/s0", Now: time.Now().UnixMilli()}); r.Status != http.StatusNoContent {
		t.Fatalf("delete: %+v", r)
	}
	delete(want, "b/s0")
	// Raft snapshots compact the logs (threshold 50 entries, checked every 50 ms).
	deadline := time.Now().Add(5 * time.Second)
	for {
		snapped := 0
		for _, g := range e.groups {
			if g.r.Stats()["last_snapshot_index"] != "0" {
				snapped++
			}
		}
		if snapped == len(e.groups) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d groups took a raft snapshot", snapped, len(e.groups))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check := func(e *Engine) {
		t.Helper()
		for k, v := range want {
			if got := read(e, k); got != v {
				t.Fatalf("%s: got %q want %q", k, got, v)
			}
		}
		var soft bool
		e.View("b/s0", time.Now().UnixMilli(), func(_ *streamcore.State, s *streamcore.Stream) { soft = s != nil && s.SoftDeleted })
		if !soft {
			t.Fatal("b/s0 should be soft-deleted")
		}
	}
	check(e)
	e.Close()
	l.Close()
	e, l = open()
	defer l.Close()
	defer e.Close()
	check(e)
	if e.GroupOf("b/fork1") != e.GroupOf("b/s1") {
		t.Fatal("alias index not rebuilt after restart")
	}
}

// Three voters in process over real loopback TCP (one cluster listener each): writes on a
// follower are refused before proposal with the leader's URL; followers apply and wake
// watchers; leadership transfer works.
func TestThreeVoters(t *testing.T) {
	es := threeVoters(t)
	key := "b/x"
	g := es[0].GroupOf(key)
	leader := es[0].LeaderOf(g)
	L := es[leader-1]
	F := es[leader%3]
	ctx := context.Background()
	if _, err := F.Propose(ctx, create(key)); err == nil {
		t.Fatal("follower accepted a write")
	} else {
		var nl *engine.NotLeaderError
		// The refusal names the leader, the group and the term for the redirect's headers.
		if !errors.As(err, &nl) || nl.Proposed || nl.LeaderURL != fmt.Sprintf("http://node%d", leader) ||
			nl.LeaderID != leader || nl.Group != g || nl.Term == 0 || nl.NoPeers {
			t.Fatalf("follower error: %#v", err)
		}
	}
	if r, err := L.Propose(ctx, create(key)); err != nil || r.Status != http.StatusCreated {
		t.Fatalf("create: %v %+v", err, r)
	}
	if _, err := L.Propose(ctx, appendCmd(key, "hello")); err != nil {
		t.Fatal(err)
	}
	for {
		w := F.Watch(key)
		if got := read(F, key); got == "hello" {
			break
		}
		select {
		case <-w:
		case <-time.After(5 * time.Second):
			t.Fatal("follower watcher not woken")
		}
	}
	if err := F.VerifyLeader(ctx, key); err == nil {
		t.Fatal("follower verified leadership")
	}
	if err := L.VerifyLeader(ctx, key); err != nil {
		t.Fatal(err)
	}
	to := F.cfg.NodeID
	if err := L.TransferLeadership(g, to); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for F.LeaderOf(g) != to || F.VerifyLeader(ctx, key) != nil {
		if time.Now().After(deadline) {
			t.Fatal("transfer did not complete")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r, err := F.Propose(ctx, appendCmd(key, " world")); err != nil || r.Status != http.StatusNoContent {
		t.Fatalf("append on new leader: %v %+v", err, r)
	}
	if got := read(F, key); got != "hello world" {
		t.Fatalf("new leader has %q", got)
	}
}

// loopbackPeers opens n cluster listeners on loopback and names them as peers 1..n.
func loopbackPeers(t *testing.T, n int) ([]net.Listener, []Peer) {
	t.Helper()
	var lns []net.Listener
	var peers []Peer
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		peers = append(peers, Peer{ID: uint64(i + 1), URL: fmt.Sprintf("http://node%d", i+1), RaftAddr: ln.Addr().String()})
	}
	return lns, peers
}

// threeVoters opens three in-process voters of 4 groups over loopback, closed when the
// test ends, and waits until every group has a leader.
func threeVoters(t *testing.T) []*Engine {
	t.Helper()
	lns, peers := loopbackPeers(t, 3)
	var es []*Engine
	for i := range 3 {
		e, err := Open(Config{NodeID: uint64(i + 1), GroupCount: 4, Peers: peers, Listener: lns[i], InitMembership: true,
			HeartbeatTimeout: 300 * time.Millisecond, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		es = append(es, e)
	}
	for _, e := range es {
		waitReady(t, e)
	}
	return es
}

// TestGroupCountFixed: a data directory written with one group count refuses another,
// before any group opens (none of the extra groups is bootstrapped into the journal),
// and still opens with its own count.
func TestGroupCountFixed(t *testing.T) {
	dir := t.TempDir()
	open := func(n int) (*Engine, func(), error) {
		stores, l := nodelogStores(t, dir+"/wal")
		e, err := Open(Config{NodeID: 1, GroupCount: n, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
		if err != nil {
			l.Close()
			return nil, nil, err
		}
		return e, func() { e.Close(); l.Close() }, nil
	}
	e, closeAll, err := open(2)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, e)
	closeAll()
	if _, _, err := open(4); err == nil || !strings.Contains(err.Error(), "cannot change") {
		t.Fatalf("opened a 2-group directory with 4 groups: %v", err)
	}
	for _, g := range []string{"g0002", "g0003"} {
		if _, err := os.Stat(filepath.Join(dir, "raft", g)); !os.IsNotExist(err) {
			t.Fatalf("the refused open made %s (%v)", g, err)
		}
	}
	l, err := raftlog.Open(dir+"/wal", raftlog.Options{Fsync: raftlog.FsyncNever, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	for g := uint64(2); g < 4; g++ {
		if last, _ := l.Group(g).LastIndex(); last != 0 {
			t.Fatalf("the refused open wrote group %d's log up to %d", g, last)
		}
	}
	l.Close()
	e, closeAll, err = open(2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	waitReady(t, e)
}
