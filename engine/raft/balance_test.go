package raftengine

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

func leaderCounts(es []*Engine) map[uint64]int {
	c := map[uint64]int{}
	for g := range es[0].GroupCount() {
		c[es[0].LeaderOf(uint64(g))]++
	}
	return c
}

// Every leadership lands on node 1; with the balancer on, the leaderships end spread over
// the voters (max - min <= 1). A drained node then gets none and the other two share all.
func TestLeaderBalancer(t *testing.T) {
	es := threeVoters(t)
	for g := range es[0].GroupCount() {
		eventually(t, "leadership on node 1", func() bool {
			l := es[0].LeaderOf(uint64(g))
			if l == 1 {
				return true
			}
			if l != 0 {
				es[l-1].TransferLeadership(uint64(g), 1)
			}
			return false
		})
	}
	if c := leaderCounts(es); c[1] != es[0].GroupCount() {
		t.Fatalf("leaders before balancing: %v", c)
	}
	for _, e := range es {
		e.SetLeaderBalance(lifecycleTick)
	}
	spread := func(nodes ...uint64) func() bool {
		return func() bool {
			c := leaderCounts(es)
			lo, hi := 1<<30, 0
			for _, n := range nodes {
				lo, hi = min(lo, c[n]), max(hi, c[n])
			}
			return c[0] == 0 && hi-lo <= 1
		}
	}
	eventually(t, "leaderships spread over the three voters", spread(1, 2, 3))
	if err := es[2].SetDrainMark(true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the drained node to lead nothing", func() bool { return leaderCounts(es)[3] == 0 && spread(1, 2)() })
	if !es[0].RaftStatus().(Status).Balancer {
		t.Fatal("status does not show the balancer")
	}
}

// Over twice the Raft-log budget, writes with a body are refused before proposal with
// 503 RaftLogPressure (marker, Retry-After) while writes without a body pass; once a
// snapshot compacts the log below 1.5 times the budget, writes pass again. With the
// pressure driver on, the node snapshots on its own.
func TestRaftLogPressure(t *testing.T) {
	e, err := Open(Config{NodeID: 1, GroupCount: 2, RaftLog: io.Discard, SnapshotThreshold: 1 << 30, SnapshotInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitReady(t, e)
	e.life.press.noDriver.Store(true)
	e.SetRaftLogBudget(4 << 10)
	ctx := context.Background()
	key := "bkts/p"
	if _, err := e.Propose(ctx, create(key)); err != nil {
		t.Fatal(err)
	}
	body := string(make([]byte, 1024))
	var se *streamcore.Error
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.Propose(ctx, appendCmd(key, body))
		if errors.As(err, &se) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("never refused")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if se.Code != CodeRaftLogPressure || se.Status != http.StatusServiceUnavailable || se.Headers[streamcore.HdrNotApplied] != MarkerRaftLogPressure || se.Headers[streamcore.HdrRetryAfter] != "1" {
		t.Fatalf("refusal: %#v", se)
	}
	if bytes, budget, over := e.RaftLogPressure(); !over || bytes <= 2*budget {
		t.Fatalf("pressure: %d %d %v", bytes, budget, over)
	}
	if _, err := e.Propose(ctx, create("bkts/q")); err != nil {
		t.Fatalf("a write without a body was refused: %v", err)
	}
	// A snapshot compacts the log: writes resume.
	if err := e.groups[e.GroupOf(key)].r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "writes to resume after the snapshot", func() bool {
		_, err := e.Propose(ctx, appendCmd(key, "x"))
		return err == nil
	})
	// The driver snapshots by itself: fill again, and the pressure clears with no help.
	e.life.press.noDriver.Store(false)
	for range 20 {
		e.Propose(ctx, appendCmd(key, body))
	}
	eventually(t, "the driver to bring the log under the budget", func() bool {
		b, budget, over := e.RaftLogPressure()
		return e.life.press.builds.Load() > 0 && !over && b < budget
	})
}
