package raftengine

// Raft-log pressure. Every group's log store is wrapped in a sizedLog that knows the size
// of each entry it holds, so the engine knows how many bytes of log the node holds that no
// snapshot covers yet. Past three quarters of the node's budget (raft.snapshot_log_budget)
// the lifecycle loop snapshots the group with the most such bytes, one at a time (raft
// then compacts its log). Over twice the budget, writes with a body are refused before
// they are proposed with 503 RaftLogPressure (not-applied marker, Retry-After: 1) until
// the log is below 1.5 times the budget.

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/streamcore"
)

// DefaultRaftLogBudget is the node's default snapshot log budget (1 GiB).
const DefaultRaftLogBudget = 1 << 30

// CodeRaftLogPressure is the error code of a write refused while the node's Raft log is
// over twice its budget; MarkerRaftLogPressure is its not-applied token.
const (
	CodeRaftLogPressure   = "RAFT_LOG_PRESSURE"
	MarkerRaftLogPressure = "RaftLogPressure"
)

// entryOverhead approximates an entry's framing and metadata in the journal.
const entryOverhead = 32

// sizedLog is a raft.LogStore that keeps the size of every entry it holds.
type sizedLog struct {
	raft.LogStore
	mu    sync.Mutex
	base  uint64   // index of sizes[0]
	sizes []uint32 // sizes of the entries base, base+1, ...
	total int64    // sum of sizes
}

// newSizedLog sizes the entries s holds: from the journal's index when ji is not nil
// (no I/O), else by reading each one.
func newSizedLog(s raft.LogStore, ji journalIndex) (*sizedLog, error) {
	l := &sizedLog{LogStore: s}
	if ji != nil {
		first, sizes := ji.EntrySizes()
		for i := range sizes {
			sizes[i] += entryOverhead // as entrySize counts
			l.total += int64(sizes[i])
		}
		l.base, l.sizes = first, sizes
		return l, nil
	}
	first, err := s.FirstIndex()
	if err != nil {
		return nil, err
	}
	last, err := s.LastIndex()
	if err != nil {
		return nil, err
	}
	if first == 0 || last < first {
		return l, nil
	}
	var e raft.Log
	for i := first; i <= last; i++ {
		if err := s.GetLog(i, &e); err != nil {
			return nil, fmt.Errorf("size log entry %d: %w", i, err)
		}
		l.record(&e)
	}
	return l, nil
}

func entrySize(e *raft.Log) uint32 { return uint32(len(e.Data) + len(e.Extensions) + entryOverhead) }

// record notes a stored entry. Called with mu held (or before sharing).
func (l *sizedLog) record(e *raft.Log) {
	end := l.base + uint64(len(l.sizes))
	switch {
	case len(l.sizes) == 0 || e.Index < l.base || e.Index > end:
		l.base, l.sizes, l.total = e.Index, l.sizes[:0], 0
	case e.Index < end:
		l.cut(int(e.Index - l.base)) // an overwritten tail
	}
	n := entrySize(e)
	l.sizes = append(l.sizes, n)
	l.total += int64(n)
}

// cut drops the sizes from position i on. Called with mu held.
func (l *sizedLog) cut(i int) {
	for _, s := range l.sizes[i:] {
		l.total -= int64(s)
	}
	l.sizes = l.sizes[:i]
}

// heldBytes is the size of every entry the store holds (what a snapshot keeping few
// trailing entries lets the journal release).
func (l *sizedLog) heldBytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// IsMonotonic forwards raft.MonotonicLogStore.
func (l *sizedLog) IsMonotonic() bool {
	m, ok := l.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (l *sizedLog) StoreLog(e *raft.Log) error {
	if err := l.LogStore.StoreLog(e); err != nil {
		return err
	}
	l.mu.Lock()
	l.record(e)
	l.mu.Unlock()
	return nil
}

func (l *sizedLog) StoreLogs(es []*raft.Log) error {
	if err := l.LogStore.StoreLogs(es); err != nil {
		return err
	}
	l.mu.Lock()
	for _, e := range es {
		l.record(e)
	}
	l.mu.Unlock()
	return nil
}

func (l *sizedLog) DeleteRange(lo, hi uint64) error {
	if err := l.LogStore.DeleteRange(lo, hi); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	end := l.base + uint64(len(l.sizes)) // one past the last
	switch {
	case len(l.sizes) == 0 || hi < l.base || lo >= end:
	case lo <= l.base && hi+1 >= end:
		l.sizes, l.total = l.sizes[:0], 0
	case lo <= l.base:
		k := int(hi + 1 - l.base)
		for _, s := range l.sizes[:k] {
			l.total -= int64(s)
		}
		l.sizes = append([]uint32(nil), l.sizes[k:]...)
		l.base = hi + 1
	default:
		l.cut(int(lo - l.base)) // a tail (a conflict with the leader)
	}
	return nil
}

// bytesAfter is the size of the entries after index.
func (l *sizedLog) bytesAfter(index uint64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	start := 0
	if index >= l.base {
		start = int(min(index-l.base+1, uint64(len(l.sizes))))
	}
	for _, s := range l.sizes[start:] {
		n += int64(s)
	}
	return n
}

// logPressure is the node's Raft-log budget and state.
type logPressure struct {
	budget   atomic.Int64
	bytes    atomic.Int64 // unsnapshotted log bytes at the last check
	over     atomic.Bool  // writes with a body are refused
	building atomic.Bool  // a pressure snapshot runs
	noDriver atomic.Bool  // tests: no pressure snapshots
	refused  atomic.Uint64
	builds   atomic.Uint64
}

// SetRaftLogBudget sets the node's Raft-log budget in bytes (<= 0: the default).
func (e *Engine) SetRaftLogBudget(n int64) {
	if n <= 0 {
		n = DefaultRaftLogBudget
	}
	e.life.press.budget.Store(n)
}

func (g *group) unsnapshotted() int64 {
	idx, _ := strconv.ParseUint(g.r.Stats()["last_snapshot_index"], 10, 64)
	return g.logs.bytesAfter(idx)
}

// checkLogPressure runs on every lifecycle tick.
func (e *Engine) checkLogPressure() {
	p := &e.life.press
	budget := p.budget.Load()
	var total, most int64
	var big *group
	for _, g := range e.groups {
		n := g.unsnapshotted()
		total += n
		if n > most && g.stop.Load() == nil {
			most, big = n, g
		}
	}
	p.bytes.Store(total)
	switch {
	case total > 2*budget:
		if !p.over.Swap(true) {
			e.cfg.Logger.Warn("raft log over twice its budget: writes with a body are refused until snapshots bring it below 1.5 times the budget", "bytes", total, "budget", budget)
		}
	case total < budget+budget/2:
		if p.over.Swap(false) {
			e.cfg.Logger.Info("raft log back under 1.5 times its budget: writes resume", "bytes", total, "budget", budget)
		}
	}
	if p.noDriver.Load() || big == nil || total <= budget/4*3 || !p.building.CompareAndSwap(false, true) {
		return
	}
	p.builds.Add(1)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer p.building.Store(false)
		if err := big.r.Snapshot().Error(); err != nil && err != raft.ErrNothingNewToSnapshot {
			e.cfg.Logger.Warn("raft log pressure snapshot failed", "group", big.id, "err", err)
		}
	}()
}

// logPressureRefusal refuses a write with a body while the log is over twice its budget.
func (e *Engine) logPressureRefusal() error {
	p := &e.life.press
	if !p.over.Load() {
		return nil
	}
	p.refused.Add(1)
	return streamcore.Errorf(http.StatusServiceUnavailable, CodeRaftLogPressure,
		"the node's Raft log (%d bytes not covered by a snapshot) is over twice its budget of %d bytes; writes resume once snapshots bring it below 1.5 times the budget",
		p.bytes.Load(), p.budget.Load()).
		With(streamcore.HdrRetryAfter, "1").With(streamcore.HdrNotApplied, MarkerRaftLogPressure)
}

// RaftLogPressure reports the node's Raft-log bytes not covered by a snapshot, its budget
// and whether writes are refused (metrics, status).
func (e *Engine) RaftLogPressure() (bytes, budget int64, over bool) {
	p := &e.life.press
	return p.bytes.Load(), p.budget.Load(), p.over.Load()
}
