package replicator

import (
	"sync"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// Measurements (checklist-vfs R): each replica buffers one measurement per acknowledged
// commit and per snapshot attempt until DrainStats takes them. Between drains it keeps
// the newest defaultStatsCap of each kind and counts the rest in Dropped; the totals (commits,
// bytes, retries) count every commit, measured or dropped.
//
// Checkpoints are a kind of the checklist but no adapter reports them yet: the checkpoint
// list is always empty in this build.

// defaultStatsCap is how many measurements of each kind a replica keeps between drains:
// 8,192, enough for minutes of commits at a high rate between two drains of a
// monitoring loop, yet a bounded memory cost.
const defaultStatsCap = 8192

// CommitMeasurement is one acknowledged commit.
type CommitMeasurement struct {
	StartMs  int64   `json:"start_ms"`  // Unix ms when Commit was called
	Ms       float64 `json:"ms"`        // Commit call to acknowledgement, backoff waits included
	AppendMs float64 `json:"append_ms"` // the acknowledged append attempt alone
	Attempts int     `json:"attempts"`
	Retries  int     `json:"retries"` // attempts - 1
	Bytes    int     `json:"bytes"`   // commit frame bytes sent
	Pages    int     `json:"pages"`
	Offset   string  `json:"offset"` // where the record starts in the stream (opaque)
}

// CheckpointMeasurement is one checkpoint (no adapter reports them yet).
type CheckpointMeasurement struct {
	StartMs int64   `json:"start_ms"`
	Ms      float64 `json:"ms"`
	Offset  string  `json:"offset"`
}

// SnapshotMeasurement is one snapshot attempt.
type SnapshotMeasurement struct {
	StartMs int64   `json:"start_ms"`
	Ms      float64 `json:"ms"`
	Offset  string  `json:"offset"` // the snapshot offset X; "-1" when the build failed first
	Bytes   int     `json:"bytes"`  // compressed body; 0 when none was built
	Outcome string  `json:"outcome"`
	Kind    string  `json:"kind,omitempty"`  // failures: size, outage or other
	Error   string  `json:"error,omitempty"` // failures
}

// Snapshot outcomes.
const (
	SnapshotPublished = "published"
	SnapshotFailed    = "failed"
	SnapshotAborted   = "aborted" // writes were refused; not a failure (P144)
)

// Dropped counts the measurements discarded since the last drain, per kind.
type Dropped struct {
	Commit     uint64 `json:"commit"`
	Checkpoint uint64 `json:"checkpoint"`
	Snapshot   uint64 `json:"snapshot"`
}

// Stats is what DrainStats returns: the measurements since the last drain, oldest first.
type Stats struct {
	Commit     []CommitMeasurement     `json:"commit"`
	Checkpoint []CheckpointMeasurement `json:"checkpoint"`
	Snapshot   []SnapshotMeasurement   `json:"snapshot"`
	Dropped    Dropped                 `json:"dropped"`
	// Totals since the last drain, dropped commits included.
	Commits uint64 `json:"commits"` // acknowledged commits
	Bytes   uint64 `json:"bytes"`   // their frame bytes
	Retries uint64 `json:"retries"` // append attempts beyond the first (failed commits' too)
}

// ring keeps the newest cap items.
type ring[T any] struct {
	buf     []T
	head    int // index of the oldest when full
	dropped uint64
}

func (q *ring[T]) add(v T, limit int) {
	if limit <= 0 {
		q.dropped++
		return
	}
	if len(q.buf) < limit {
		q.buf = append(q.buf, v)
		return
	}
	q.buf[q.head] = v
	q.head = (q.head + 1) % len(q.buf)
	q.dropped++
}

func (q *ring[T]) drain() ([]T, uint64) {
	out := make([]T, 0, len(q.buf))
	out = append(out, q.buf[q.head:]...)
	out = append(out, q.buf[:q.head]...)
	d := q.dropped
	*q = ring[T]{}
	return out, d
}

type statsBuf struct {
	cap         int // measurements kept per kind between drains
	mu          sync.Mutex
	commits     ring[CommitMeasurement]
	checkpoints ring[CheckpointMeasurement]
	snapshots   ring[SnapshotMeasurement]
	nCommits    uint64
	bytes       uint64
	retries     uint64
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

func (b *statsBuf) commit(m CommitMeasurement) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nCommits++
	b.bytes += uint64(m.Bytes)
	b.commits.add(m, b.cap)
}

func (b *statsBuf) retry() {
	b.mu.Lock()
	b.retries++
	b.mu.Unlock()
}

func (b *statsBuf) snapshot(m SnapshotMeasurement) {
	b.mu.Lock()
	b.snapshots.add(m, b.cap)
	b.mu.Unlock()
}

// RecordCheckpoint adds a checkpoint measurement (for an adapter that can observe one).
func (r *Replica) RecordCheckpoint(m CheckpointMeasurement) {
	r.stats.mu.Lock()
	r.stats.checkpoints.add(m, r.stats.cap)
	r.stats.mu.Unlock()
}

// recordSnapshot adds one snapshot attempt; x < 0: no offset.
func (r *Replica) recordSnapshot(start time.Time, x int64, bytes int, outcome, kind string, err error) {
	m := SnapshotMeasurement{StartMs: start.UnixMilli(), Ms: msSince(start), Offset: "-1", Bytes: bytes, Outcome: outcome, Kind: kind}
	if x >= 0 {
		m.Offset = streamcore.FormatOffset(uint64(x))
	}
	if err != nil {
		m.Error = err.Error()
	}
	r.stats.snapshot(m)
}

// DrainStats returns the measurements buffered since the last drain and clears them.
func (r *Replica) DrainStats() Stats {
	b := &r.stats
	b.mu.Lock()
	defer b.mu.Unlock()
	var st Stats
	st.Commit, st.Dropped.Commit = b.commits.drain()
	st.Checkpoint, st.Dropped.Checkpoint = b.checkpoints.drain()
	st.Snapshot, st.Dropped.Snapshot = b.snapshots.drain()
	st.Commits, st.Bytes, st.Retries = b.nCommits, b.bytes, b.retries
	b.nCommits, b.bytes, b.retries = 0, 0, 0
	return st
}
