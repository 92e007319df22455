package server

import (
	"sort"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// The memory engine's side of the cold tier: a shard plays the part of a Raft group.

// hotOf is the hot byte count of the stream at key (the caller holds sh.mu).
func (sh *memShard) hotOf(key string) int64 {
	s := sh.state.Streams[key]
	if s == nil {
		return 0
	}
	return int64(s.Tail() - s.Data.Base())
}

// recountHot recomputes every shard's hot bytes (the caller holds every shard's lock).
func (e *MemoryEngine) recountHot() {
	for i := range e.shards {
		sh := &e.shards[i]
		var n int64
		for _, s := range sh.state.Streams {
			n += int64(s.Tail() - s.Data.Base())
		}
		sh.hot.Store(n)
	}
}

// ColdGroups implements ColdEngine.
func (e *MemoryEngine) ColdGroups() []int {
	gs := make([]int, memoryShards)
	for i := range gs {
		gs[i] = i
	}
	return gs
}

// GroupOf implements ColdEngine.
func (e *MemoryEngine) GroupOf(key string) int {
	sh := e.shard(key)
	for i := range e.shards {
		if &e.shards[i] == sh {
			return i
		}
	}
	return 0
}

// GroupHotBytes implements ColdEngine.
func (e *MemoryEngine) GroupHotBytes(g int) int64 { return e.shards[g].hot.Load() }

// HotStreams implements ColdEngine.
func (e *MemoryEngine) HotStreams(g int) []HotStream {
	sh := &e.shards[g]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	var out []HotStream
	now := time.Now().UnixMilli()
	for k, s := range sh.state.Streams {
		if s.SoftDeleted || s.Tail() == s.Data.Base() || s.Expired(now) {
			continue
		}
		out = append(out, HotStream{Key: k, Incarnation: s.Incarnation, HotStart: s.Data.Base(), Tail: s.Tail()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tail-out[i].HotStart > out[j].Tail-out[j].HotStart })
	return out
}

// ColdRefs implements ColdEngine.
func (e *MemoryEngine) ColdRefs(fn func(key string)) {
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.RLock()
		for _, s := range sh.state.Streams {
			streamColdRefs(s, fn)
		}
		sh.mu.RUnlock()
	}
}

// streamColdRefs calls fn with every cold object a stream references.
func streamColdRefs(s *streamcore.Stream, fn func(string)) {
	for _, c := range s.Chunks {
		fn(c.Key)
	}
	if s.Snapshot != nil && s.Snapshot.ColdKey != "" {
		fn(s.Snapshot.ColdKey)
	}
}
