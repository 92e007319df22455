package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"
)

func testSlot() *stableSlot {
	return &stableSlot{gen: 7, seg: 3, off: 4096, groups: map[uint64]map[string][]byte{
		0:       {"CurrentTerm": {0, 0, 0, 0, 0, 0, 0, 9}},
		12:      {"CurrentTerm": {0, 0, 0, 0, 0, 0, 0, 2}, "LastVoteCand": []byte("node-2"), "empty": {}},
		1 << 40: {"k": []byte("v")},
	}}
}

// slotImage encodes s into a full slot (zero padded), as the side file holds it.
func slotImage(t *testing.T, s *stableSlot) []byte {
	t.Helper()
	b, err := encodeSlot(s, stableSlotBytes)
	if err != nil {
		t.Fatal(err)
	}
	img := make([]byte, 4096)
	copy(img, b)
	return img
}

// reseal recomputes the slot checksum after a test edited the image.
func reseal(b []byte) []byte {
	n := binary.LittleEndian.Uint32(b[32:])
	binary.LittleEndian.PutUint32(b[36:], slotCRC(b[:36], b[slotHeaderSize:slotHeaderSize+int(n)]))
	return b
}

func TestStableSlotCodec(t *testing.T) {
	good := slotImage(t, testSlot())
	got, err := decodeSlot(good)
	if err != nil {
		t.Fatal(err)
	}
	if want := testSlot(); got.gen != want.gen || got.seg != want.seg || got.off != want.off || !reflect.DeepEqual(got.groups, want.groups) {
		t.Fatalf("round trip: %+v", got)
	}
	empty, err := decodeSlot(slotImage(t, &stableSlot{gen: 1}))
	if err != nil || len(empty.groups) != 0 {
		t.Fatalf("empty state: %+v %v", empty, err)
	}
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte{}, good...)) }
	cases := []struct {
		name string
		img  []byte
		want error
	}{
		{"zeros", make([]byte, 4096), errSlotEmpty},
		{"short", good[:slotHeaderSize-1], errCorrupt},
		{"magic", edit(func(b []byte) []byte { b[0] = 'X'; return b }), errCorrupt},
		{"payload bit flip", edit(func(b []byte) []byte { b[slotHeaderSize+5] ^= 1; return b }), errCorrupt},
		{"header bit flip", edit(func(b []byte) []byte { b[20] ^= 1; return b }), errCorrupt},
		{"length past the slot", edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[32:], 1<<30); return b }), errCorrupt},
		{"torn: image ends early", good[:slotHeaderSize+10], errCorrupt},
		{"generation 0", edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 0); return reseal(b) }), errCorrupt},
		{"group count too large", edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[slotHeaderSize:], 1000); return reseal(b) }), errCorrupt},
		{"group length overruns", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[slotHeaderSize+12:], 1<<20)
			return reseal(b)
		}), errCorrupt},
		{"trailing payload byte", edit(func(b []byte) []byte {
			n := binary.LittleEndian.Uint32(b[32:])
			binary.LittleEndian.PutUint32(b[32:], n+1)
			return reseal(b)
		}), errCorrupt},
		{"duplicate group", func() []byte {
			// Two copies of one group's block.
			one, _ := encodeSlot(&stableSlot{gen: 1, groups: map[uint64]map[string][]byte{5: {"a": []byte("b")}}}, 4096)
			block := one[slotHeaderSize+4:]
			b := append([]byte{}, one[:slotHeaderSize]...)
			b = appendUint32(b, 2)
			b = append(b, block...)
			b = append(b, block...)
			binary.LittleEndian.PutUint32(b[32:], uint32(len(b)-slotHeaderSize))
			return reseal(b)
		}(), errCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeSlot(tc.img); !errors.Is(err, tc.want) {
				t.Fatalf("decodeSlot = %v, want %v", err, tc.want)
			}
		})
	}
	big := &stableSlot{gen: 1, groups: map[uint64]map[string][]byte{1: {"k": make([]byte, 200)}}}
	if _, err := encodeSlot(big, 100); err == nil {
		t.Fatal("a state larger than the slot encoded")
	}
}

func TestPickSlot(t *testing.T) {
	at := func(gen uint64) []byte {
		s := testSlot()
		s.gen = gen
		return slotImage(t, s)
	}
	zero := make([]byte, 4096)
	torn := at(9)[:slotHeaderSize+3]
	torn = append(torn, make([]byte, 4096-len(torn))...)
	cases := []struct {
		name    string
		a, b    []byte
		wantGen uint64 // 0: no slot
		wantIdx int
		wantErr bool
	}{
		{"both empty", zero, zero, 0, -1, false},
		{"first only", at(1), zero, 1, 0, false},
		{"second only", zero, at(1), 1, 1, false},
		{"second newer", at(1), at(2), 2, 1, false},
		{"first newer", at(3), at(2), 3, 0, false},
		{"second torn", at(4), torn, 4, 0, false},
		{"first torn", torn, at(5), 5, 1, false},
		{"first write torn", torn, zero, 0, -1, false},
		{"both damaged", torn, torn, 0, -1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, idx, err := pickSlot(tc.a, tc.b)
			if tc.wantErr {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("err = %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gen := uint64(0)
			if s != nil {
				gen = s.gen
			}
			if gen != tc.wantGen || idx != tc.wantIdx {
				t.Fatalf("picked gen %d slot %d, want gen %d slot %d", gen, idx, tc.wantGen, tc.wantIdx)
			}
		})
	}
}

func FuzzDecodeSlot(f *testing.F) {
	f.Add(make([]byte, 64))
	b, _ := encodeSlot(testSlot(), stableSlotBytes)
	f.Add(b)
	f.Add(b[:len(b)-1])
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSlot(b)
		if err != nil {
			if s != nil {
				t.Fatal("a slot with an error")
			}
			return
		}
		// What decodes re-encodes to the same bytes (the encoding is canonical up to
		// groups with no values, which encodeSlot leaves out).
		for _, kv := range s.groups {
			if len(kv) == 0 {
				return
			}
		}
		again, err := encodeSlot(s, len(b))
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		s2, err := decodeSlot(again)
		if err != nil || !reflect.DeepEqual(s, s2) {
			t.Fatalf("re-decode: %+v %v", s2, err)
		}
	})
}

// faults plants err on op in l until cleared (nil).
func plant(l *Log, op string, err error) {
	if err == nil {
		l.fault.Store(nil)
		return
	}
	f := func(o string) error {
		if o == op {
			return err
		}
		return nil
	}
	l.fault.Store(&f)
}

// TestStableWritesSurviveJournalFaults: with the journal's writes or fsyncs failing
// (ENOSPC with no reserve left, EIO), Set and SetUint64 still succeed, the values are
// durable (found after a reopen) and newer journal records still win over the side file.
func TestStableWritesSurviveJournalFaults(t *testing.T) {
	for _, tc := range []struct {
		op     string
		err    error
		sticky bool // the journal fails for good (EIO); ENOSPC leaves it usable
	}{
		{"write", syscall.ENOSPC, false},
		{"fsync", syscall.ENOSPC, true}, // any fsync error is sticky
		{"write", syscall.EIO, true},
		{"fsync", syscall.EIO, true},
	} {
		t.Run(fmt.Sprintf("%s-%v", tc.op, tc.err), func(t *testing.T) {
			dir := t.TempDir()
			l := openT(t, dir, Options{SegmentBytes: 8 << 10})
			os.Remove(filepath.Join(dir, reserveName)) // the reserve is used up
			l.reserved = false
			for g := uint64(1); g <= 3; g++ {
				storeRange(t, l.Group(g), 1, 20, 1, 5)
				if err := l.Group(g).SetUint64([]byte("CurrentTerm"), 1); err != nil {
					t.Fatal(err)
				}
			}
			plant(l, tc.op, tc.err)
			// Under fsync=never an append does not fsync: only a write fault fails it.
			if err := l.Group(1).StoreLog(entry(1, 21, 2)); (err == nil) != (tc.op == "fsync") {
				t.Fatalf("StoreLog through the %s fault: %v", tc.op, err)
			}
			for g := uint64(1); g <= 3; g++ {
				if err := l.Group(g).SetUint64([]byte("CurrentTerm"), 10+g); err != nil {
					t.Fatalf("SetUint64 through %v: %v", tc.err, err)
				}
				if err := l.Group(g).Set([]byte("LastVoteCand"), []byte(fmt.Sprintf("n%d", g))); err != nil {
					t.Fatalf("Set through %v: %v", tc.err, err)
				}
			}
			if st := l.Stats(); st.SideWrites != 6 {
				t.Fatalf("side writes = %d, want 6", st.SideWrites)
			}
			if v, _ := l.Group(2).GetUint64([]byte("CurrentTerm")); v != 12 {
				t.Fatalf("Get after a side write = %d", v)
			}
			plant(l, "", nil)
			if !tc.sticky {
				// The disk has room again: the journal takes writes, and a newer value
				// there wins over the side file at the next Open.
				if err := l.Group(3).SetUint64([]byte("CurrentTerm"), 99); err != nil {
					t.Fatal(err)
				}
				storeRange(t, l.Group(1), 21, 30, 2, 5)
				if st := l.Stats(); st.SideWrites != 6 {
					t.Fatalf("a write went to the side file with room in the journal: %d", st.SideWrites)
				}
			}
			l.Close()
			l = openT(t, dir, Options{SegmentBytes: 8 << 10})
			defer l.Close()
			if !l.Stats().StableSideApplied {
				t.Fatal("recovery did not use the side file")
			}
			for g := uint64(1); g <= 3; g++ {
				want := 10 + g
				if g == 3 && !tc.sticky {
					want = 99
				}
				if v, _ := l.Group(g).GetUint64([]byte("CurrentTerm")); v != want {
					t.Fatalf("group %d CurrentTerm after reopen = %d, want %d", g, v, want)
				}
				if v, _ := l.Group(g).Get([]byte("LastVoteCand")); string(v) != fmt.Sprintf("n%d", g) {
					t.Fatalf("group %d LastVoteCand after reopen = %q", g, v)
				}
			}
			last := uint64(20)
			if tc.op == "fsync" {
				last = 21
			}
			if !tc.sticky {
				last = 30
			}
			if n, _ := l.Group(1).LastIndex(); n != last {
				t.Fatalf("group 1 last index %d, want %d", n, last)
			}
		})
	}
}

// TestStableSideAfterCutTail: a side slot written at a journal position that a crash then
// cut away must not override stable records written after the restart.
func TestStableSideAfterCutTail(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	s := l.Group(1)
	storeRange(t, s, 1, 10, 1, 5)
	cut, _ := os.ReadFile(filepath.Join(dir, segName(1))) // the synced prefix
	storeRange(t, s, 11, 40, 1, 5)                        // unsynced (fsync=never)
	plant(l, "write", syscall.ENOSPC)
	os.Remove(filepath.Join(dir, reserveName))
	l.reserved = false
	if err := s.SetUint64([]byte("CurrentTerm"), 5); err != nil {
		t.Fatal(err)
	}
	plant(l, "", nil)
	// A host crash keeps only the synced prefix of the segment, and the side file.
	crashed := t.TempDir()
	writeSeg(t, crashed, 1, cut)
	side, _ := os.ReadFile(filepath.Join(dir, stableSideName))
	os.WriteFile(filepath.Join(crashed, stableSideName), side, 0o644)
	l.Close()
	l = openT(t, crashed, Options{})
	if v, _ := l.Group(1).GetUint64([]byte("CurrentTerm")); v != 5 {
		t.Fatalf("CurrentTerm from the side file = %d", v)
	}
	// Written after the restart, at a journal offset below the slot's old position.
	if err := l.Group(1).SetUint64([]byte("CurrentTerm"), 6); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openT(t, crashed, Options{})
	defer l.Close()
	if v, _ := l.Group(1).GetUint64([]byte("CurrentTerm")); v != 6 {
		t.Fatalf("CurrentTerm = %d: the side file overrode a newer journal record", v)
	}
}

// A side file that cannot be read at its full size is an error, not silently ignored.
func TestStableSideShort(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	l.Close()
	if err := os.Truncate(filepath.Join(dir, stableSideName), 100); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(dir, Options{Logf: t.Logf}); err == nil {
		l.Close()
		t.Fatal("Open with a short side file succeeded")
	}
}

// TestCompactionReleasesActiveSegment: a prefix delete that leaves the (only, active)
// segment mostly dead rolls it early, so the disk space comes back at once instead of
// when the segment fills up; under fsync=never too.
func TestCompactionReleasesActiveSegment(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{}) // 64 MiB segments, fsync=never
	defer l.Close()
	s, quiet := l.Group(1), l.Group(2)
	storeRange(t, quiet, 1, 3, 1, 3)
	big := make([]byte, 64<<10)
	var logs []*raft.Log
	for i := uint64(1); i <= 128; i++ { // 8 MiB
		logs = append(logs, &raft.Log{Index: i, Term: 1, Data: big})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	before := l.Stats().Bytes
	if err := s.DeleteRange(1, 120); err != nil {
		t.Fatal(err)
	}
	settle(t, l)
	st := l.Stats()
	if st.Bytes > before/4 || st.Segments != 1 {
		t.Fatalf("journal holds %d bytes in %d segments after compaction (%d before)", st.Bytes, st.Segments, before)
	}
	t.Logf("journal bytes %d before compaction, %d after", before, st.Bytes)
	checkGroup(t, quiet, 1, 3, 1)
	var e raft.Log
	if err := s.GetLog(128, &e); err != nil || len(e.Data) != len(big) {
		t.Fatalf("live entry after the roll: %v", err)
	}
	l.Close()
	l = openT(t, dir, Options{})
	if first, _ := l.Group(1).FirstIndex(); first != 121 {
		t.Fatalf("first index after reopen %d", first)
	}
	checkGroup(t, l.Group(2), 1, 3, 1)
}

// TestRaftSurvivesFailingJournal: a single voter on a journal whose writes all fail
// (ENOSPC with the reserve gone) loses its leadership on every append and campaigns
// again and again; each campaign saves a new term, which used to make raft panic ("failed
// to save current term"). The terms go to the side file, survive a reopen, and once the
// disk takes writes again the node leads and applies.
func TestRaftSurvivesFailingJournal(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	conf := raft.DefaultConfig()
	conf.LocalID = "n1"
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Off, Output: io.Discard})
	store := l.Group(1)
	addr, trans := raft.NewInmemTransport("n1")
	r, err := raft.NewRaft(conf, &sumFSM{}, store, store, raft.NewInmemSnapshotStore(), trans)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown()
	if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{ID: "n1", Address: addr}}}).Error(); err != nil {
		t.Fatal(err)
	}
	apply := func() error { return r.Apply([]byte("x"), time.Second).Error() }
	waitUntil := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !f(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
		}
	}
	waitUntil("a leader applies", func() bool { return apply() == nil })
	term0 := r.CurrentTerm()
	os.Remove(filepath.Join(dir, reserveName))
	plant(l, "write", syscall.ENOSPC)
	waitUntil("raft campaigns through the failing journal", func() bool {
		apply() // fails: the leader steps down and campaigns again
		return r.CurrentTerm() >= term0+3
	})
	if l.Stats().SideWrites == 0 {
		t.Fatal("no stable write went to the side file")
	}
	plant(l, "", nil)
	waitUntil("the node leads and applies again", func() bool { return apply() == nil })
	term := r.CurrentTerm()
	if err := r.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openT(t, dir, Options{})
	defer l.Close()
	if v, _ := l.Group(1).GetUint64([]byte("CurrentTerm")); v < term {
		t.Fatalf("CurrentTerm after reopen %d, raft was at %d", v, term)
	}
}
