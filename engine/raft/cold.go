package raftengine

import (
	"sort"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/server"
)

// The raft engine's side of the cold tier (DESIGN.md §3 "Tiers"). A cold group is a Raft
// group. Only a group's leader flushes it (ColdGroups lists the groups this node leads);
// the flusher's OpRecordChunk goes through Raft like every command, so every replica
// records the chunk and trims its hot buffer alike, and followers serve cold ranges from
// the shared object store by the keys their replicated state holds.
//
// Hot accounting: each group keeps its hot (unflushed) byte count in an atomic counter
// that the FSM maintains on apply (noteHot / recountHot), so GroupHotBytes, called on
// every append, is O(1).
//
// Collection: ColdRefs covers every local replica (led or followed). The collector runs on
// one node at a time, the leader of group 0 (ColdCollectHere), and asks every other voter
// which candidates its replicas still reference or pin before it deletes anything
// (ColdPeers; server/cold_gc.go).
//
// The engine's own GroupOf (uint64, for tools and tests) predates the cold tier, so the
// server.ColdEngine view is a separate value: Engine.ColdEngine().

var (
	_ server.ColdEngine         = coldView{}
	_ server.ColdEngineProvider = (*Engine)(nil)
	_ server.ColdCollectorGate  = coldView{}
)

// ColdEngine implements server.ColdEngineProvider.
func (e *Engine) ColdEngine() server.ColdEngine { return coldView{e} }

// coldView is the engine seen as a server.ColdEngine.
type coldView struct{ e *Engine }

// ColdGroups implements server.ColdEngine: the groups this node leads.
func (v coldView) ColdGroups() []int {
	var gs []int
	for _, g := range v.e.groups {
		if g.r.State() == raft.Leader {
			gs = append(gs, int(g.id))
		}
	}
	return gs
}

// GroupOf implements server.ColdEngine.
func (v coldView) GroupOf(key string) int { return int(v.e.groupOf(key).id) }

// GroupHotBytes implements server.ColdEngine (O(1): a counter maintained on apply).
func (v coldView) GroupHotBytes(g int) int64 {
	if g < 0 || g >= len(v.e.groups) {
		return 0
	}
	return v.e.groups[g].hot.Load()
}

// HotStreams implements server.ColdEngine.
func (v coldView) HotStreams(gi int) []server.HotStream {
	if gi < 0 || gi >= len(v.e.groups) {
		return nil
	}
	g := v.e.groups[gi]
	now := time.Now().UnixMilli()
	var out []server.HotStream
	g.mu.RLock()
	for k, s := range g.state.Streams {
		if s.SoftDeleted || s.Tail() == s.Data.Base() || s.Expired(now) {
			continue
		}
		out = append(out, server.HotStream{Key: k, Incarnation: s.Incarnation, HotStart: s.Data.Base(), Tail: s.Tail()})
	}
	g.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Tail-out[i].HotStart > out[j].Tail-out[j].HotStart })
	return out
}

// ColdRefs implements server.ColdEngine: every object any local replica references,
// whether this node leads the group or not.
func (v coldView) ColdRefs(fn func(key string)) {
	for _, g := range v.e.groups {
		g.mu.RLock()
		for _, s := range g.state.Streams {
			for _, c := range s.Chunks {
				fn(c.Key)
			}
			if s.Snapshot != nil && s.Snapshot.ColdKey != "" {
				fn(s.Snapshot.ColdKey)
			}
		}
		g.mu.RUnlock()
	}
}

// ColdCollectHere implements server.ColdCollectorGate: the collector runs on the leader
// of group 0 only. A local replica that lags its group's leader is covered by the
// question the collector asks every other voter (the leader among them) before deleting.
func (v coldView) ColdCollectHere() bool {
	return len(v.e.groups) > 0 && v.e.groups[0].r.State() == raft.Leader
}

// ColdPeers implements server.ColdCollectorGate: the HTTP base URLs of the other voters.
func (v coldView) ColdPeers() []string {
	var out []string
	for _, p := range v.e.cfg.Peers {
		if p.ID != v.e.cfg.NodeID {
			out = append(out, p.URL)
		}
	}
	return out
}

// hotOf is the hot byte count of the stream at key (the caller holds g.mu).
func (g *group) hotOf(key string) int64 {
	s := g.state.Streams[key]
	if s == nil {
		return 0
	}
	return int64(s.Tail() - s.Data.Base())
}

// recountHot recomputes the group's hot bytes (the caller holds g.mu): after a restore,
// a sweep, or a command touching a fork family.
func (g *group) recountHot() {
	var n int64
	for _, s := range g.state.Streams {
		n += int64(s.Tail() - s.Data.Base())
	}
	g.hot.Store(n)
}
