package raftengine

import (
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
)

// The raft engine's side of the cold tier. A cold group is a Raft group. Only a group's
// leader flushes it (FlushGroups lists the groups this node leads); the flusher's
// OpRecordChunk goes through Raft like every command, so every replica records the chunk
// and trims its hot buffer alike, and followers serve cold ranges from the shared object
// store by the keys their replicated state holds.
//
// Hot accounting: each group's partition keeps its hot (unflushed) byte count, maintained
// by the FSM on apply, so GroupHotBytes, called on every append, is O(1).
//
// Collection: ColdRefs covers every local replica (led or followed). The collector runs on
// one node at a time, the leader of group 0 (CollectHere), and asks every other voter
// through the peer channel (peer.go) which candidates its replicas still reference or its
// reads and uploads pin before it deletes anything.

// FlushGroups implements engine.Groups: the groups this node leads.
func (e *Engine) FlushGroups() []uint64 {
	var gs []uint64
	for _, g := range e.groups {
		if g.r.State() == raft.Leader {
			gs = append(gs, g.id)
		}
	}
	return gs
}

// GroupHotBytes implements engine.Groups (O(1): a counter maintained on apply).
func (e *Engine) GroupHotBytes(g uint64) int64 {
	if g >= uint64(len(e.groups)) {
		return 0
	}
	return e.groups[g].HotBytes()
}

// HotStreams implements engine.Groups.
func (e *Engine) HotStreams(g uint64) []engine.HotStream {
	if g >= uint64(len(e.groups)) {
		return nil
	}
	return e.groups[g].HotStreams(time.Now().UnixMilli())
}

// ColdRefs implements engine.Groups: every object any local replica references, whether
// this node leads the group or not.
func (e *Engine) ColdRefs(fn func(key string)) {
	for _, g := range e.groups {
		g.ColdRefs(fn)
	}
}

// CollectHere implements engine.ColdPeers: the collector runs on the leader of group 0
// only. A local replica that lags its group's leader is covered by the question the
// collector asks every other voter (the leader among them) before deleting.
func (e *Engine) CollectHere() bool {
	return len(e.groups) > 0 && e.groups[0].r.State() == raft.Leader
}
