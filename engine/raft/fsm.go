package raftengine

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Log entry kinds (first byte of every entry this engine writes).
const (
	entryCommand byte = 'C' // a streamcore command (streamcore.AppendCommand)
	entrySweep   byte = 'S' // collect expired streams at the carried time (uvarint ms)
	entryBatch   byte = 'B' // several streamcore commands applied in order (batch.go)
)

func appendSweep(b []byte, now int64) []byte {
	b = append(b, entrySweep)
	return binary.AppendVarint(b, now)
}

// group is one Raft group and its FSM: a partition (the state of all its streams, the
// live watchers of its keys, their hot bytes) and the aliases (keys it holds that hash
// elsewhere: forks), guarded by the partition's lock.
type group struct {
	*engine.Partition
	id    uint64
	e     *Engine
	r     *raft.Raft
	trans raft.Transport

	aliases map[string]bool
	batch   batcher // proposals waiting for this group's next entry (batch.go)

	applied        atomic.Uint64 // last log index the FSM applied
	barrierTerm    atomic.Uint64 // term whose barrier this leader has applied
	barrierRunning atomic.Bool
	caughtUp       atomic.Bool // a follower applied all it knew committed once (readiness)

	hadState         bool        // the replica held Raft state when the node started
	gated            atomic.Bool // recovery gate closed: no votes, no campaigns, no transfers to it
	gateRefusedVotes atomic.Uint64
}

// Apply implements raft.FSM.
func (g *group) Apply(l *raft.Log) any {
	defer g.applied.Store(l.Index)
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return nil
	}
	switch l.Data[0] {
	case entryCommand:
		c, err := streamcore.DecodeCommand(l.Data[1:])
		if err != nil {
			// A committed entry this build cannot read: refuse it the same way on every
			// replica (state unchanged) and say so.
			g.e.cfg.Logger.Error("raft entry not decodable", "group", g.id, "index", l.Index, "err", err)
			return fmt.Errorf("raftengine: entry %d of group %d: %w", l.Index, g.id, err)
		}
		return g.applyCommand(c)
	case entryBatch:
		cmds, err := decodeBatch(l.Data[1:])
		if err != nil {
			g.e.cfg.Logger.Error("raft entry not decodable", "group", g.id, "index", l.Index, "err", err)
			return fmt.Errorf("raftengine: entry %d of group %d: %w", l.Index, g.id, err)
		}
		out := make(batchAnswer, len(cmds))
		for i, b := range cmds {
			c, err := streamcore.DecodeCommand(b)
			if err != nil {
				g.e.cfg.Logger.Error("raft entry not decodable", "group", g.id, "index", l.Index, "command", i, "err", err)
				out[i] = fmt.Errorf("raftengine: entry %d of group %d, command %d: %w", l.Index, g.id, i, err)
				continue
			}
			out[i] = g.applyCommand(c)
		}
		return out
	case entrySweep:
		now, n := binary.Varint(l.Data[1:])
		if n <= 0 {
			return nil
		}
		g.Lock()
		st := g.StateLocked()
		before := len(st.Streams)
		st.Sweep(now)
		changed := len(st.Streams) != before
		g.RecountHotLocked()
		wakes := g.afterStructural(changed)
		g.Unlock()
		engine.Wake(wakes...)
	default:
		// A kind this build does not know (written by a newer one): refuse it the same
		// way on every replica and say so.
		g.e.cfg.Logger.Error("raft entry of unknown kind", "group", g.id, "index", l.Index, "kind", l.Data[0])
		return fmt.Errorf("raftengine: entry %d of group %d has unknown kind %q", l.Index, g.id, l.Data[0])
	}
	return nil
}

func (g *group) applyCommand(c *streamcore.Command) streamcore.Result {
	g.Lock()
	forks := g.StateLocked().InvolvesForks(c)
	res := g.ApplyLocked(c)
	if forks {
		g.RecountHotLocked() // a cascade may have touched other streams
	}
	var wakes []chan struct{}
	switch {
	case forks:
		// A fork create or a removal in a fork family may cascade to other streams and
		// change aliases: recompute them and wake every watcher of the group.
		wakes = g.afterStructural(res.Changed)
	case res.Changed:
		g.aliasKey(c.Key)
		wakes = []chan struct{}{g.TakeWatcherLocked(c.Key)}
	}
	g.Unlock()
	engine.Wake(wakes...)
	return res
}

// aliasKey updates the alias of one key after a command on it. Called with g locked.
func (g *group) aliasKey(k string) {
	held := g.StateLocked().Streams[k] != nil
	switch {
	case held && !g.aliases[k] && g.e.home(k) != g.id:
		g.aliases[k] = true
		g.e.setAliases(g, []string{k}, nil)
	case !held && g.aliases[k]:
		delete(g.aliases, k)
		g.e.setAliases(g, nil, []string{k})
	}
}

// afterStructural recomputes the group's aliases and, when changed, takes every watcher.
// Called with g locked.
func (g *group) afterStructural(changed bool) []chan struct{} {
	var add, remove []string
	streams := g.StateLocked().Streams
	for k := range g.aliases {
		if streams[k] == nil {
			delete(g.aliases, k)
			remove = append(remove, k)
		}
	}
	for k := range streams {
		if !g.aliases[k] && g.e.home(k) != g.id {
			g.aliases[k] = true
			add = append(add, k)
		}
	}
	g.e.setAliases(g, add, remove)
	if !changed {
		return nil
	}
	return g.TakeWatchersLocked()
}

// Snapshot implements raft.FSM. Under the read lock it only captures the state's
// metadata (streamcore.CaptureState shares the append-only stream bytes); Persist encodes
// and writes it while commands keep applying.
func (g *group) Snapshot() (raft.FSMSnapshot, error) {
	g.RLock()
	st := streamcore.CaptureState(g.StateLocked())
	g.RUnlock()
	return &fsmSnapshot{st: st}, nil
}

// Restore implements raft.FSM.
func (g *group) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	st, err := streamcore.ReadState(b)
	if err != nil {
		return fmt.Errorf("raftengine: group %d snapshot: %w", g.id, err)
	}
	g.Lock()
	g.ReplaceStateLocked(st)
	wakes := g.afterStructural(true)
	g.Unlock()
	engine.Wake(wakes...)
	return nil
}

type fsmSnapshot struct{ st *streamcore.State }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriterSize(sink, 1<<20)
	err := streamcore.WriteState(w, s.st)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { s.st = nil }
