package raftengine

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/streamcore"
)

// Log entry kinds (first byte of every entry this engine writes).
const (
	entryCommand byte = 'C' // a streamcore command (streamcore.AppendCommand)
	entrySweep   byte = 'S' // collect expired streams at the carried time (uvarint ms)
)

func appendSweep(b []byte, now int64) []byte {
	b = append(b, entrySweep)
	return binary.AppendVarint(b, now)
}

// group is one Raft group and its FSM: the state of all its streams, the live watchers
// of its keys and the aliases (keys it holds that hash elsewhere: forks).
type group struct {
	id    uint64
	e     *Engine
	r     *raft.Raft
	trans raft.Transport

	mu       sync.RWMutex
	state    *streamcore.State
	watchers map[string]chan struct{}
	aliases  map[string]bool

	applied        atomic.Uint64 // last log index the FSM applied
	barrierTerm    atomic.Uint64 // term whose barrier this leader has applied
	barrierRunning atomic.Bool
	caughtUp       atomic.Bool  // a follower applied all it knew committed once (readiness)
	hot            atomic.Int64 // hot (unflushed) bytes of the group's streams (cold.go)
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
	case entrySweep:
		now, n := binary.Varint(l.Data[1:])
		if n <= 0 {
			return nil
		}
		g.mu.Lock()
		before := len(g.state.Streams)
		g.state.Sweep(now)
		changed := len(g.state.Streams) != before
		g.recountHot()
		wakes := g.afterStructural(changed)
		g.mu.Unlock()
		wakeAll(wakes)
	}
	return nil
}

func (g *group) applyCommand(c *streamcore.Command) streamcore.Result {
	g.mu.Lock()
	forks := g.state.InvolvesForks(c)
	before := g.hotOf(c.Key)
	res := g.state.Apply(c)
	if forks {
		g.recountHot() // a cascade may have touched other streams
	} else {
		g.hot.Add(g.hotOf(c.Key) - before)
	}
	var wakes []chan struct{}
	switch {
	case forks:
		// A fork create or a removal in a fork family may cascade to other streams and
		// change aliases: recompute them and wake every watcher of the group.
		wakes = g.afterStructural(res.Changed)
	case res.Changed:
		g.aliasKey(c.Key)
		if ch := g.watchers[c.Key]; ch != nil {
			delete(g.watchers, c.Key)
			wakes = []chan struct{}{ch}
		}
	}
	g.mu.Unlock()
	wakeAll(wakes)
	return res
}

// aliasKey updates the alias of one key after a command on it. Called with g.mu held.
func (g *group) aliasKey(k string) {
	held := g.state.Streams[k] != nil
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
// Called with g.mu held.
func (g *group) afterStructural(changed bool) []chan struct{} {
	var add, remove []string
	for k := range g.aliases {
		if g.state.Streams[k] == nil {
			delete(g.aliases, k)
			remove = append(remove, k)
		}
	}
	for k := range g.state.Streams {
		if !g.aliases[k] && g.e.home(k) != g.id {
			g.aliases[k] = true
			add = append(add, k)
		}
	}
	g.e.setAliases(g, add, remove)
	if !changed {
		return nil
	}
	wakes := make([]chan struct{}, 0, len(g.watchers))
	for k, ch := range g.watchers {
		wakes = append(wakes, ch)
		delete(g.watchers, k)
	}
	return wakes
}

func wakeAll(chs []chan struct{}) {
	for _, ch := range chs {
		close(ch)
	}
}

// Snapshot implements raft.FSM. Under the read lock it only captures the state's
// metadata (streamcore.CaptureState shares the append-only stream bytes); Persist encodes
// and writes it while commands keep applying.
func (g *group) Snapshot() (raft.FSMSnapshot, error) {
	g.mu.RLock()
	st := streamcore.CaptureState(g.state)
	g.mu.RUnlock()
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
	g.mu.Lock()
	g.state = st
	g.recountHot()
	wakes := g.afterStructural(true)
	g.mu.Unlock()
	wakeAll(wakes)
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
