package raftengine

// Start-up without reading the log three times. A restart used to read every entry of
// every group's log from the journal three times before it was ready: once to size it
// (logpressure.go), once in raft.NewRaft's scan for configuration entries, and once to
// replay it through the state machine. With the node journal the first two need no
// bodies: its in-memory index knows each entry's size, and the scan only looks at
// entry types, which a 37-byte read of the entry's fixed part gives.

import (
	"io"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// journalIndex is what the node journal's GroupStore (raftlog) offers beyond
// raft.LogStore: entry sizes from its index, and an entry's fixed part without its body.
type journalIndex interface {
	EntrySizes() (first uint64, sizes []uint32)
	GetLogMeta(index uint64, out *raft.Log) error
}

// journalIndexOf finds the journal behind a group's stores. The log store may be
// wrapped (a raft.LogCache hides it); the journal's GroupStore is the stable store too.
func journalIndexOf(logs raft.LogStore, stable raft.StableStore) journalIndex {
	if ji, ok := logs.(journalIndex); ok {
		return ji
	}
	ji, _ := stable.(journalIndex)
	return ji
}

// startScanLog is the log store raft.NewRaft gets. While armed it answers the calls of
// NewRaft's own start-up reads with each command entry's fixed part only (Index, Term,
// Type, AppendedAt; no Data): first GetLog(last), then GetLog(snap+1) ... GetLog(last)
// in order, where snap is the newest snapshot's index. It disarms after the last of
// them, at the first call that does not match that sequence (another snapshot was
// restored, or anything else reads), and when NewRaft returns (disarm). raft starts its
// goroutines only after that scan, so the state machine never sees a bodiless entry;
// any call outside the sequence gets the whole entry. Entries of any other type
// (configurations) are always read whole.
type startScanLog struct {
	*sizedLog
	ji journalIndex

	mu    sync.Mutex
	armed bool
	last  uint64 // the log's last index when armed
	next  uint64 // the next index the scan reads; 0 until GetLog(last) came
	first uint64 // where the scan starts: snap+1

	// The replay turn (single voter only): after NewRaft, raft replays the entries the
	// log held at open (up to last) through the state machine in batches of up to
	// MaxAppendEntries, reading far ahead of it. With every group replaying at once that
	// keeps hundreds of MiB of fresh entry buffers in flight on a node of big entries,
	// more memory and more CPU than the same reads one group after the other. So a group
	// takes the node's one turn before reading its first replayed entry and gives it back
	// after reading the last one. Waiting is bounded (replayTurnWait): a turn never
	// holds a group back for long, whatever happens to the group holding it.
	turn     chan struct{}   // nil: no turn taking
	stop     <-chan struct{} // closed when the engine closes: stop waiting
	replay   bool            // NewRaft returned: reads up to last are the replay
	waiting  bool
	holding  bool
	finished bool
}

// replayTurnWait bounds how long a group waits for the replay turn.
const replayTurnWait = 30 * time.Second

func newStartScanLog(l *sizedLog, ji journalIndex, snaps raft.SnapshotStore, turn chan struct{}, stop <-chan struct{}) (*startScanLog, error) {
	s := &startScanLog{sizedLog: l, ji: ji, turn: turn, stop: stop}
	last, err := l.LastIndex()
	if err != nil || last == 0 {
		return s, err
	}
	s.last = last
	if ji == nil {
		return s, nil
	}
	var snap uint64
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		snap = metas[0].Index // the one NewRaft restores, unless it fails to open
	}
	s.armed, s.last, s.first = true, last, snap+1
	return s, nil
}

// disarm ends the bodiless answers (call it once raft.NewRaft returned); from then on
// reads up to the log's last index at open are the replay.
func (s *startScanLog) disarm() {
	s.mu.Lock()
	s.armed = false
	s.replay = true
	if s.first > s.last {
		s.finished = true // the snapshot covers the whole log: nothing to replay
	}
	s.mu.Unlock()
}

// replayRead is called around every read of the replay: before (done false) it takes
// the turn if needed, after (done true) it gives the turn back after the last entry.
// Only reads past the snapshot (first up to last) are the replay: an entry the snapshot
// covers is read for other reasons (something looked at the log's first entry after a
// restore), and taking the turn there held it for good, since no read of last followed:
// every other group then waited replayTurnWait (30 s) before its own replay.
func (s *startScanLog) replayRead(index uint64, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.turn == nil || !s.replay || s.finished || index > s.last || index < s.first {
		return
	}
	switch {
	case !done && !s.holding && !s.waiting:
		// One reader waits; another one of the same group meanwhile (raft reads from
		// more than one goroutine once there are followers) just reads.
		s.waiting = true
		s.mu.Unlock()
		var took bool
		select {
		case s.turn <- struct{}{}:
			took = true
		case <-time.After(replayTurnWait):
		case <-s.stop:
		}
		s.mu.Lock()
		s.waiting = false
		switch {
		case took && s.finished:
			<-s.turn // the replay ended while this reader waited
		case took:
			s.holding = true
		default:
			s.finished = true
		}
	case done && index == s.last:
		s.release()
	}
}

// release gives the turn back (called with mu held) and ends turn taking. A group that
// closes while holding it needs no release: Close closes stop, which ends every wait.
func (s *startScanLog) release() {
	if s.holding {
		<-s.turn
		s.holding = false
	}
	s.finished = true
}

// metaOnly reports whether GetLog(index) is the next call of NewRaft's scan, and
// advances the expected sequence.
func (s *startScanLog) metaOnly(index uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.armed {
		return false
	}
	switch {
	case s.next == 0 && index == s.last:
		s.next = s.first
		if s.next > s.last {
			s.armed = false // no scan follows
		}
		return true
	case s.next != 0 && index == s.next:
		s.next++
		if index == s.last {
			s.armed = false
		}
		return true
	}
	s.armed = false
	return false
}

func (s *startScanLog) GetLog(index uint64, out *raft.Log) error {
	if s.metaOnly(index) {
		if err := s.ji.GetLogMeta(index, out); err != nil {
			return err
		}
		if out.Type == raft.LogCommand {
			return nil
		}
		return s.sizedLog.GetLog(index, out)
	}
	s.replayRead(index, false)
	err := s.sizedLog.GetLog(index, out)
	s.replayRead(index, true)
	return err
}

// readSnapshot reads a whole snapshot: in one allocation when its size is known (hint,
// from the snapshot's metadata; 0 when unknown), else growing by doubling. io.ReadAll
// grows a large buffer by about a quarter at a time, so a snapshot of some hundred MiB
// was copied and cleared several times over before it was decoded.
func readSnapshot(r io.Reader, hint int64) ([]byte, error) {
	n := 1 << 20
	if hint > 0 && hint < 1<<40 {
		n = int(hint) + 1 // one spare byte: the EOF comes without growing
	}
	b := make([]byte, 0, n)
	for {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), 2*cap(b))
			copy(nb, b)
			b = nb
		}
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
