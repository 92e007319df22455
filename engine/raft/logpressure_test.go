package raftengine

import (
	"testing"

	"github.com/hashicorp/raft"
)

// TestSizedLogTotals: the running total of held bytes (what a trim releases) follows
// stores, overwritten tails and every kind of range delete, and agrees with bytesAfter.
func TestSizedLogTotals(t *testing.T) {
	entry := func(i uint64, n int) *raft.Log { return &raft.Log{Index: i, Data: make([]byte, n)} }
	size := func(n int) int64 { return int64(n + entryOverhead) }
	type step struct {
		name  string
		do    func(l *sizedLog) error
		total int64
	}
	steps := []step{
		{"store 1..4", func(l *sizedLog) error {
			return l.StoreLogs([]*raft.Log{entry(1, 10), entry(2, 20), entry(3, 30), entry(4, 40)})
		}, size(10) + size(20) + size(30) + size(40)},
		{"overwrite the tail from 3", func(l *sizedLog) error { return l.StoreLog(entry(3, 5)) },
			size(10) + size(20) + size(5)},
		{"store 4", func(l *sizedLog) error { return l.StoreLog(entry(4, 7)) }, size(10) + size(20) + size(5) + size(7)},
		{"delete the prefix 1..2", func(l *sizedLog) error { return l.DeleteRange(1, 2) }, size(5) + size(7)},
		{"delete a range outside", func(l *sizedLog) error { return l.DeleteRange(9, 12) }, size(5) + size(7)},
		{"delete the tail 4..", func(l *sizedLog) error { return l.DeleteRange(4, 100) }, size(5)},
		{"store 4, 5", func(l *sizedLog) error { return l.StoreLogs([]*raft.Log{entry(4, 1), entry(5, 2)}) },
			size(5) + size(1) + size(2)},
		{"delete everything", func(l *sizedLog) error { return l.DeleteRange(1, 5) }, 0},
		{"a restore starts past the end", func(l *sizedLog) error { return l.StoreLog(entry(100, 3)) }, size(3)},
	}
	l, err := newSizedLog(raft.NewInmemStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if err := s.do(l); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := l.heldBytes(); got != s.total {
			t.Fatalf("%s: held %d bytes, want %d", s.name, got, s.total)
		}
		if got := l.bytesAfter(0); got != s.total {
			t.Fatalf("%s: bytesAfter(0) %d, held %d", s.name, got, s.total)
		}
	}
}
