package raftengine

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
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

	// Apply-failure isolation (applystop.go): applyMu serialises Apply, Snapshot and
	// Restore with a restart's replay; seen is the last index raft handed to Apply.
	applyMu sync.Mutex
	stop    atomic.Pointer[ApplyFailure]
	seen    atomic.Uint64
	logs    *sizedLog
	snaps   raft.SnapshotStore
	// snapMeta is what the last snapshot this replica wrote held beyond its hot bytes
	// (stream metadata, producers, receipts, bytes below Base in a partly trimmed block):
	// with the current hot bytes, the estimate of the next snapshot's size (diskwatch.go).
	snapMeta atomic.Int64

	restoreHint atomic.Int64 // size of the snapshot NewRaft restores at start (startscan.go)

	hadState         bool        // the replica held Raft state when the node started
	gated            atomic.Bool // recovery gate closed: no votes, no campaigns, no transfers to it
	gateRefusedVotes atomic.Uint64
}

// Apply implements raft.FSM. An entry the group cannot apply (a panic, an entry this
// build cannot decode, an injected fault) stops the group (applystop.go): this entry and
// every later one stay unapplied until the group restarts, never skipped.
func (g *group) Apply(l *raft.Log) any {
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	g.seen.Store(l.Index)
	if f := g.stop.Load(); f != nil {
		return applyStoppedError(f, false)
	}
	res, fail := g.applyEntry(l)
	if fail != nil {
		g.stopApply(l, fail)
		return applyStoppedError(fail, false)
	}
	g.applied.Store(l.Index)
	return res
}

// applyEntry applies one entry to the state; a failure leaves the group to be stopped.
func (g *group) applyEntry(l *raft.Log) (res any, fail *ApplyFailure) {
	defer func() {
		if v := recover(); v != nil {
			res, fail = nil, &ApplyFailure{Kind: "panic", Message: fmt.Sprint(v)}
		}
	}()
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return nil, nil
	}
	if h := g.e.life.applyFault.Load(); h != nil {
		if err := (*h)(g.id, l); err != nil {
			return nil, &ApplyFailure{Kind: "fault", Message: err.Error()}
		}
	}
	switch l.Data[0] {
	case entryCommand:
		c, err := streamcore.DecodeCommand(l.Data[1:])
		if err != nil {
			// A committed entry this build cannot read: the group stops here on every
			// replica running this build, until a build that reads it restarts it.
			return nil, &ApplyFailure{Kind: "decode", Message: err.Error()}
		}
		return g.applyCommand(c), nil
	case entryBatch:
		cmds, err := decodeBatch(l.Data[1:])
		if err != nil {
			return nil, &ApplyFailure{Kind: "decode", Message: err.Error()}
		}
		out := make([]*streamcore.Command, len(cmds))
		for i, b := range cmds {
			c, err := streamcore.DecodeCommand(b)
			if err != nil {
				// Never skip a command: decode them all first, so a bad one stops the
				// group at this entry with nothing of it applied, and a restart replays it whole.
				return nil, &ApplyFailure{Kind: "decode", Message: fmt.Sprintf("command %d: %v", i, err)}
			}
			out[i] = c
		}
		res := make(batchAnswer, len(cmds))
		for i, c := range out {
			res[i] = g.applyCommand(c)
		}
		return res, nil
	case entrySweep:
		now, n := binary.Varint(l.Data[1:])
		if n <= 0 {
			return nil, nil
		}
		var wakes []chan struct{}
		func() {
			g.Lock()
			defer g.Unlock()
			st := g.StateLocked()
			before := len(st.Streams)
			st.Sweep(now)
			changed := len(st.Streams) != before
			g.RecountHotLocked()
			wakes = g.afterStructural(changed)
		}()
		engine.Wake(wakes...)
	default:
		// A kind this build does not know (written by a newer one): the group stops here
		// until a build that knows it restarts it; never skipped.
		return nil, &ApplyFailure{Kind: "decode", Message: fmt.Sprintf("entry of unknown kind %d", l.Data[0])}
	}
	return nil, nil
}

func (g *group) applyCommand(c *streamcore.Command) streamcore.Result {
	var res streamcore.Result
	var wakes []chan struct{}
	func() {
		g.Lock()
		defer g.Unlock() // a panic while applying must not leave the partition locked
		forks := g.StateLocked().InvolvesForks(c)
		res = g.ApplyLocked(c)
		if forks {
			g.RecountHotLocked() // a cascade may have touched other streams
		}
		switch {
		case forks:
			// A fork create or a removal in a fork family may cascade to other streams and
			// change aliases: recompute them and wake every watcher of the group.
			wakes = g.afterStructural(res.Changed)
		case res.Changed:
			g.aliasKey(c.Key)
			wakes = []chan struct{}{g.TakeWatcherLocked(c.Key)}
		}
	}()
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
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	if f := g.stop.Load(); f != nil {
		// The state lacks the failed entry: a snapshot would let raft compact it away.
		return nil, fmt.Errorf("raftengine: group %d stopped applying at index %d: no snapshot until it restarts", g.id, f.Index)
	}
	g.RLock()
	st := streamcore.CaptureState(g.StateLocked())
	hot := g.HotBytes()
	g.RUnlock()
	return &fsmSnapshot{st: st, g: g, hot: hot}, nil
}

// Restore implements raft.FSM.
func (g *group) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	if f := g.stop.Load(); f != nil {
		return fmt.Errorf("raftengine: group %d stopped applying at index %d: restart it first", g.id, f.Index)
	}
	return g.restoreFrom(rc)
}

// restoreFrom replaces the state with a snapshot's. Called with applyMu held.
func (g *group) restoreFrom(rc io.Reader) error {
	b, err := readSnapshot(rc, g.restoreHint.Swap(0))
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

type fsmSnapshot struct {
	st  *streamcore.State
	g   *group
	hot int64 // the group's hot bytes when the state was captured
}

// Persist writes the state to the sink. WriteState writes in pieces of at least 64 KiB
// (whole stream blocks directly), so no buffer of its own is needed here.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := &countingWriter{w: sink}
	if err := streamcore.WriteState(w, s.st); err != nil {
		sink.Cancel()
		return err
	}
	s.g.snapMeta.Store(max(0, w.n-s.hot))
	return sink.Close()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (s *fsmSnapshot) Release() { s.st = nil }
