package raftengine

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"testing/iotest"
	"time"

	"github.com/hashicorp/raft"
)

// scanJournal is an in-memory log store with the journal's bodiless reads; it counts
// which reads came back without a body.
type scanJournal struct {
	*raft.InmemStore
	meta []uint64
}

func (j *scanJournal) EntrySizes() (uint64, []uint32) {
	first, _ := j.FirstIndex()
	last, _ := j.LastIndex()
	var sizes []uint32
	for i := first; i <= last && last > 0; i++ {
		var e raft.Log
		j.GetLog(i, &e)
		sizes = append(sizes, uint32(len(e.Data)+len(e.Extensions)))
	}
	return first, sizes
}

func (j *scanJournal) GetLogMeta(index uint64, out *raft.Log) error {
	if err := j.GetLog(index, out); err != nil {
		return err
	}
	out.Data, out.Extensions = nil, nil
	j.meta = append(j.meta, index)
	return nil
}

// TestStartScanLog: only NewRaft's own reads (GetLog(last), then snap+1..last in order)
// come back without a body, and only for command entries; anything else disarms it.
func TestStartScanLog(t *testing.T) {
	cases := []struct {
		name     string
		snap     uint64 // newest snapshot's index, 0 for none
		calls    []uint64
		bodiless []uint64 // calls answered without a body
	}{
		{"whole scan", 0, []uint64{6, 1, 2, 3, 4, 5, 6, 3, 6}, []uint64{6, 1, 2, 4, 5, 6}}, // 3 is a configuration
		{"after a snapshot", 4, []uint64{6, 5, 6, 5}, []uint64{6, 5, 6}},
		{"snapshot at the end", 6, []uint64{6, 6}, []uint64{6}},
		{"older snapshot restored", 4, []uint64{6, 1, 2}, []uint64{6}},
		{"out of order", 0, []uint64{6, 1, 4, 5}, []uint64{6, 1}},
		{"no last read first", 0, []uint64{1, 6}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := &scanJournal{InmemStore: raft.NewInmemStore()}
			for i := uint64(1); i <= 6; i++ {
				e := &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprint("body", i))}
				if i == 3 {
					e.Type, e.Data = raft.LogConfiguration, []byte("configuration")
				}
				j.StoreLog(e)
			}
			snaps := raft.NewInmemSnapshotStore()
			if c.snap > 0 {
				sink, err := snaps.Create(raft.SnapshotVersionMax, c.snap, 1, raft.Configuration{}, 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				sink.Close()
			}
			s := scanLog(t, j, snaps, nil, nil)
			var bodiless []uint64
			for _, i := range c.calls {
				var e raft.Log
				if err := s.GetLog(i, &e); err != nil {
					t.Fatal(err)
				}
				if e.Index != i || e.Term != 1 {
					t.Fatalf("GetLog(%d) = index %d term %d", i, e.Index, e.Term)
				}
				if e.Data == nil {
					bodiless = append(bodiless, i)
				} else if want := fmt.Sprint("body", i); i != 3 && string(e.Data) != want {
					t.Fatalf("GetLog(%d) data %q, want %q", i, e.Data, want)
				}
			}
			if fmt.Sprint(bodiless) != fmt.Sprint(c.bodiless) {
				t.Fatalf("bodiless answers %v, want %v", bodiless, c.bodiless)
			}
			s.disarm()
			var e raft.Log
			if s.GetLog(c.calls[len(c.calls)-1], &e); e.Data == nil {
				t.Fatal("a read after disarm came back without a body")
			}
		})
	}
}

// TestSizedLogFromJournalIndex: sizes taken from the journal's index equal the sizes of
// reading every entry.
func TestSizedLogFromJournalIndex(t *testing.T) {
	j := &scanJournal{InmemStore: raft.NewInmemStore()}
	for i := uint64(5); i <= 9; i++ {
		j.StoreLog(&raft.Log{Index: i, Term: 1, Data: make([]byte, i*100), Extensions: make([]byte, i)})
	}
	read, err := newSizedLog(j, nil)
	if err != nil {
		t.Fatal(err)
	}
	indexed, err := newSizedLog(j, j)
	if err != nil {
		t.Fatal(err)
	}
	if read.base != indexed.base || fmt.Sprint(read.sizes) != fmt.Sprint(indexed.sizes) {
		t.Fatalf("from the index %d %v, by reading %d %v", indexed.base, indexed.sizes, read.base, read.sizes)
	}
	if read.heldBytes() == 0 || read.heldBytes() != indexed.heldBytes() {
		t.Fatalf("held bytes from the index %d, by reading %d", indexed.heldBytes(), read.heldBytes())
	}
}

// TestJournalIndexBehindLogCache: the journal is found behind a raft.LogCache through
// the stable store, and nothing is found for stores without it.
func TestJournalIndexBehindLogCache(t *testing.T) {
	j := &scanJournal{InmemStore: raft.NewInmemStore()}
	c, err := raft.NewLogCache(4, j)
	if err != nil {
		t.Fatal(err)
	}
	if journalIndexOf(c, j) != j {
		t.Fatal("journal behind a LogCache not found through the stable store")
	}
	if other := raft.NewInmemStore(); journalIndexOf(other, other) != nil {
		t.Fatal("an in-memory store taken for the journal")
	}
}

// replayLog is a group's start-scan log over entries 1 to 6 with snaps as its snapshots,
// as raft.NewRaft leaves it (disarmed), taking turns on turn.
func replayLog(t *testing.T, snaps raft.SnapshotStore, turn chan struct{}, stop <-chan struct{}) *startScanLog {
	t.Helper()
	j := &scanJournal{InmemStore: raft.NewInmemStore()}
	for i := uint64(1); i <= 6; i++ {
		j.StoreLog(&raft.Log{Index: i, Term: 1, Data: []byte("x")})
	}
	s := scanLog(t, j, snaps, turn, stop)
	s.disarm() // NewRaft returned
	return s
}

// scanLog is the start-scan log over j as openGroup builds it (a sized log over j).
func scanLog(t *testing.T, j *scanJournal, snaps raft.SnapshotStore, turn chan struct{}, stop <-chan struct{}) *startScanLog {
	t.Helper()
	sized, err := newSizedLog(j, j)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newStartScanLog(sized, j, snaps, turn, stop)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readEntry reads entry i whole through s.
func readEntry(t *testing.T, s *startScanLog, i uint64) {
	t.Helper()
	var e raft.Log
	if err := s.GetLog(i, &e); err != nil || e.Data == nil {
		t.Fatalf("GetLog(%d) = %v, data %q", i, err, e.Data)
	}
}

// TestReplayTurn: after NewRaft, a group takes the node's replay turn at its first
// replayed read and gives it back after reading the log's last entry at open; a group
// waiting for it gives up when the engine stops.
func TestReplayTurn(t *testing.T) {
	turn := make(chan struct{}, 1)
	stop := make(chan struct{})
	open := func(stop <-chan struct{}) *startScanLog {
		t.Helper()
		return replayLog(t, raft.NewInmemSnapshotStore(), turn, stop)
	}
	read := func(s *startScanLog, i uint64) { t.Helper(); readEntry(t, s, i) }
	a, b := open(stop), open(stop)
	read(a, 1)
	if len(turn) != 1 || !a.holding {
		t.Fatal("the first replayed read did not take the turn")
	}
	read(a, 5)
	read(a, 6)
	if len(turn) != 0 || a.holding {
		t.Fatal("reading the last entry did not give the turn back")
	}
	read(a, 2) // after its replay: no turn taken again
	if len(turn) != 0 {
		t.Fatal("a read after the replay took the turn")
	}
	read(b, 3)
	if !b.holding {
		t.Fatal("b did not take the free turn")
	}
	// d waits for b's turn; a second reader of d meanwhile does not wait.
	d := open(stop)
	took := make(chan error, 1)
	go func() {
		var e raft.Log
		took <- d.GetLog(1, &e)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		d.mu.Lock()
		waiting := d.waiting
		d.mu.Unlock()
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("d never waited for the turn")
		}
	}
	read(d, 2)
	read(b, 6) // b's last entry: the turn passes to d
	select {
	case err := <-took:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("d did not get the turn b gave back")
	}
	d.mu.Lock()
	holding := d.holding
	d.mu.Unlock()
	if !holding {
		t.Fatal("d read without the turn it waited for")
	}
	c := open(stop)
	close(stop)
	read(c, 1) // waits for the turn only until the engine stops
	if c.holding || !c.finished {
		t.Fatal("c holds the turn d holds")
	}
}

// TestReplayTurnAfterSnapshot: reads of entries a snapshot covers are not the replay.
// A restored group whose snapshot covers its whole log replays nothing and never takes
// the turn (it used to, on a read of its first entry, and kept it: every other group then
// waited 30 s); one with entries past its snapshot takes it for those only.
func TestReplayTurnAfterSnapshot(t *testing.T) {
	turn := make(chan struct{}, 1)
	stop := make(chan struct{})
	defer close(stop)
	open := func(snapAt uint64) *startScanLog {
		t.Helper()
		snaps := raft.NewInmemSnapshotStore()
		_, trans := raft.NewInmemTransport("a")
		sink, err := snaps.Create(raft.SnapshotVersionMax, snapAt, 1, raft.Configuration{}, 1, trans)
		if err != nil {
			t.Fatal(err)
		}
		sink.Write([]byte("state"))
		if err := sink.Close(); err != nil {
			t.Fatal(err)
		}
		return replayLog(t, snaps, turn, stop)
	}
	read := func(s *startScanLog, i uint64) { t.Helper(); readEntry(t, s, i) }
	whole := open(6)
	read(whole, 1) // raft reads no further: a turn taken here would never be given back
	if len(turn) != 0 || whole.holding || !whole.finished {
		t.Fatalf("a group with nothing to replay: turn taken %d, holding %v, finished %v", len(turn), whole.holding, whole.finished)
	}
	part := open(4)
	read(part, 2) // covered by the snapshot
	if len(turn) != 0 || part.holding {
		t.Fatal("a read below the snapshot took the turn")
	}
	read(part, 5)
	if len(turn) != 1 || !part.holding {
		t.Fatal("the first entry past the snapshot did not take the turn")
	}
	read(part, 6)
	if len(turn) != 0 || part.holding {
		t.Fatal("the last entry did not give the turn back")
	}
}

// TestReadSnapshot: the whole snapshot comes back whatever the hint (exact, short, long,
// none), and a read error is returned.
func TestReadSnapshot(t *testing.T) {
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, hint := range []int64{0, int64(len(data)), 100, int64(len(data)) * 3, -1} {
		got, err := readSnapshot(iotest.HalfReader(bytes.NewReader(data)), hint)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("hint %d: %d bytes, err %v", hint, len(got), err)
		}
	}
	boom := errors.New("boom")
	if _, err := readSnapshot(iotest.ErrReader(boom), 10); !errors.Is(err, boom) {
		t.Fatalf("read error: %v", err)
	}
}
