package raftengine

// The leadership balancer. Every node counts the leaderships of every voter (each replica
// knows its group's leader) and, when it leads more than one more group than the voter
// with the fewest, hands one of its leaderships to that voter: one transfer per round, so
// the cluster converges to a spread of at most one without moving a group twice at once.
// A node that is drained, gated or removed does not balance, and a voter that says it is
// drained (or gated) is never a target. Off when the interval is zero.

import (
	"context"
	"sort"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// peerDrainState asks a voter whether it takes leaderships (balance.go).
const peerDrainState byte = 'D'

// Bits of the answer to peerDrainState.
const (
	drainStateDrained = 1 << iota // the drain mark is set
	drainStateGated               // a recovery gate is closed, or the node was removed
)

type balancer struct {
	every atomic.Int64 // nanoseconds between rounds; 0: off
	moves atomic.Uint64
}

// SetLeaderBalance sets the balancer's interval (0 turns it off).
func (e *Engine) SetLeaderBalance(every time.Duration) {
	e.life.balance.every.Store(int64(every))
}

func (e *Engine) balancerOn() bool {
	return e.life.balance.every.Load() > 0 && !e.life.single
}

// balanceTick runs a round when the interval has come round.
func (e *Engine) balanceTick(tick int) {
	every := time.Duration(e.life.balance.every.Load())
	if every <= 0 || e.life.single {
		return
	}
	n := max(int(every/lifecycleTick), 1)
	if tick%n != n-1 {
		return
	}
	e.balanceOnce()
}

func (e *Engine) drainState() byte {
	var b byte
	if e.life.drainMark.Load() {
		b |= drainStateDrained
	}
	if e.life.removed.Load() {
		b |= drainStateGated
	}
	for _, g := range e.groups {
		if g.gated.Load() {
			b |= drainStateGated
			break
		}
	}
	return b
}

// balanceOnce moves at most one leadership from this node to the least-loaded voter.
func (e *Engine) balanceOnce() {
	if e.drainState() != 0 {
		return
	}
	self := serverID(e.cfg.NodeID)
	counts := map[raft.ServerID]int{}
	var mine []*group
	for _, g := range e.groups {
		f := g.r.GetConfiguration()
		if f.Error() != nil {
			return
		}
		for _, s := range f.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				if _, ok := counts[s.ID]; !ok {
					counts[s.ID] = 0
				}
			}
		}
		_, lid := g.r.LeaderWithID()
		if lid == "" {
			return // an election runs: wait for a settled picture
		}
		counts[lid]++
		if lid == self && g.r.State() == raft.Leader && g.stop.Load() == nil {
			mine = append(mine, g)
		}
	}
	if len(mine) == 0 {
		return
	}
	// Candidates: the other voters, fewest leaderships first.
	var cands []raft.ServerID
	for id := range counts {
		if id != self {
			cands = append(cands, id)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if counts[cands[i]] != counts[cands[j]] {
			return counts[cands[i]] < counts[cands[j]]
		}
		return cands[i] < cands[j]
	})
	for _, id := range cands {
		if counts[self]-counts[id] <= 1 {
			return // balanced against every remaining candidate
		}
		p, ok := e.peerByID(id)
		if !ok || !e.takesLeadership(p) {
			continue
		}
		for _, g := range mine {
			if !e.voterIn(g, id) {
				continue
			}
			if err := g.r.LeadershipTransferToServer(id, raft.ServerAddress(p.RaftAddr)).Error(); err != nil {
				e.cfg.Logger.Debug("leadership balance transfer failed", "group", g.id, "to", id, "err", err)
				return
			}
			e.life.balance.moves.Add(1)
			e.cfg.Logger.Info("leadership balanced", "group", g.id, "to", string(id), "leading_before", counts[self], "target_before", counts[id])
			return
		}
	}
}

func (e *Engine) voterIn(g *group, id raft.ServerID) bool {
	f := g.r.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == id {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// takesLeadership asks a voter whether it is neither drained nor gated.
func (e *Engine) takesLeadership(p Peer) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ans, err := e.ask(ctx, p, peerDrainState, nil)
	return err == nil && len(ans) == 1 && ans[0] == 0
}
