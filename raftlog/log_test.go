package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// recorder collects Logf output so tests can assert what recovery reported.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) logf(format string, args ...any) {
	r.mu.Lock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

func openT(t testing.TB, dir string, opt Options) *Log {
	t.Helper()
	if opt.Logf == nil {
		opt.Logf = t.Logf
	}
	l, err := Open(dir, opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

// entry builds a deterministic entry; the term is a parameter so that
// rewritten indexes are distinguishable.
func entry(group, index, term uint64) *raft.Log {
	e := &raft.Log{
		Index:      index,
		Term:       term,
		Type:       raft.LogType(index % 6),
		Data:       []byte(fmt.Sprintf("g%d-i%d-t%d-%s", group, index, term, strings.Repeat("x", int(index%37)))),
		AppendedAt: time.Unix(1700000000+int64(index), int64(index*7919%1e9)).UTC(),
	}
	switch index % 4 {
	case 1:
		e.Extensions = []byte{byte(index), 0xff}
	case 2:
		e.Data = nil
	case 3:
		e.Data = []byte{}
		e.Extensions = []byte{}
		e.AppendedAt = time.Time{}
	}
	return e
}

func storeRange(t testing.TB, s *GroupStore, from, to, term uint64, batch int) {
	t.Helper()
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, entry(s.ID(), i, term))
		if len(logs) == batch || i == to {
			if err := s.StoreLogs(logs); err != nil {
				t.Fatalf("group %d StoreLogs: %v", s.ID(), err)
			}
			logs = logs[:0]
		}
	}
}

// checkEntries asserts indexes from..to hold the entries written with term.
func checkEntries(t testing.TB, s *GroupStore, from, to, term uint64) {
	t.Helper()
	for i := from; i <= to && to > 0; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatalf("group %d GetLog(%d): %v", s.ID(), i, err)
		}
		if want := entry(s.ID(), i, term); !reflect.DeepEqual(&got, want) {
			t.Fatalf("group %d index %d:\n got %+v\nwant %+v", s.ID(), i, got, *want)
		}
	}
}

// checkGroup asserts the group holds exactly first..last, written with term.
func checkGroup(t testing.TB, s *GroupStore, first, last, term uint64) {
	t.Helper()
	fi, _ := s.FirstIndex()
	li, _ := s.LastIndex()
	if fi != first || li != last {
		t.Fatalf("group %d: range %d..%d, want %d..%d", s.ID(), fi, li, first, last)
	}
	checkEntries(t, s, first, last, term)
	var got raft.Log
	if err := s.GetLog(last+1, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("group %d GetLog(last+1) = %v, want ErrLogNotFound", s.ID(), err)
	}
	if first > 1 {
		if err := s.GetLog(first-1, &got); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("group %d GetLog(first-1) = %v, want ErrLogNotFound", s.ID(), err)
		}
	}
}

// settle waits until the reaper has deleted every purged segment file.
func settle(t testing.TB, l *Log) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); l.stats.purged.Load() < l.stats.queuedPurge.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("purged segments were not deleted")
		}
		time.Sleep(time.Millisecond)
	}
}

func segFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseFsyncMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want FsyncMode
		ok   bool
	}{{"never", FsyncNever, true}, {"always", FsyncAlways, true}, {"", 0, false}, {"Always", 0, false}} {
		got, err := ParseFsyncMode(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseFsyncMode(%q) = %v, %v", tc.in, got, err)
		}
		if tc.ok && got.String() != tc.in {
			t.Errorf("String() = %q", got.String())
		}
	}
}

func TestFieldsRoundTripExactly(t *testing.T) {
	l := openT(t, t.TempDir(), Options{})
	defer l.Close()
	s := l.Group(7)
	now := time.Now() // carries a monotonic reading and a local zone
	logs := []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte("cfg"), AppendedAt: now},
		{Index: 2, Term: 1, Type: raft.LogNoop},
		{Index: 3, Term: 2, Type: raft.LogCommand, Data: []byte{}, Extensions: []byte("ext")},
		{Index: 4, Term: 2, Type: raft.LogBarrier, Data: bytes.Repeat([]byte{0}, 5000), Extensions: []byte{}},
		{Index: 5, Term: 3, Type: raft.LogType(200), AppendedAt: time.Unix(-5, 999999999)},
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	for _, want := range logs {
		var got raft.Log
		if err := s.GetLog(want.Index, &got); err != nil {
			t.Fatal(err)
		}
		if !got.AppendedAt.Equal(want.AppendedAt) {
			t.Errorf("index %d AppendedAt %v, want %v", want.Index, got.AppendedAt, want.AppendedAt)
		}
		w := *want
		w.AppendedAt = w.AppendedAt.Round(0).UTC()
		if !reflect.DeepEqual(got, w) {
			t.Errorf("index %d:\n got %#v\nwant %#v", want.Index, got, w)
		}
	}
}

func TestRoundTripManyGroupsAndRestart(t *testing.T) {
	dir := t.TempDir()
	opt := Options{SegmentBytes: 64 << 10, Fsync: FsyncNever}
	l := openT(t, dir, opt)
	const groups, per = 60, 120
	for g := uint64(1); g <= groups; g++ {
		storeRange(t, l.Group(g), 1, per, 1, int(g%9)+1)
	}
	st := l.Stats()
	if st.Segments < 4 || st.LiveEntries != groups*per || st.Groups != groups {
		t.Fatalf("stats after writes: %+v", st)
	}
	for g := uint64(1); g <= groups; g++ {
		checkGroup(t, l.Group(g), 1, per, 1)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Group(1).StoreLog(entry(1, per+1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("StoreLog after Close: %v", err)
	}
	var e raft.Log
	if err := l.Group(1).GetLog(1, &e); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetLog after Close: %v", err)
	}

	l = openT(t, dir, opt)
	defer l.Close()
	st = l.Stats()
	if st.RecoveredEntries != groups*per || st.TailDamage != "" || st.RecoveredSegments != st.Segments {
		t.Fatalf("stats after restart: %+v", st)
	}
	for g := uint64(1); g <= groups; g++ {
		checkGroup(t, l.Group(g), 1, per, 1)
		storeRange(t, l.Group(g), per+1, per+5, 2, 5) // appends continue after recovery
		checkEntries(t, l.Group(g), 1, per, 1)
		checkEntries(t, l.Group(g), per+1, per+5, 2)
	}
}

func TestOpenRefusesSecondOpenAndBadOptions(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	defer l.Close()
	if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open: %v", err)
	}
	for _, opt := range []Options{{SegmentBytes: 100}, {SegmentBytes: 2 << 30}, {Fsync: 9}} {
		if _, err := Open(t.TempDir(), opt); err == nil {
			t.Errorf("Open(%+v) succeeded", opt)
		}
	}
}

func TestStoreLogsValidation(t *testing.T) {
	l := openT(t, t.TempDir(), Options{})
	defer l.Close()
	s := l.Group(1)
	storeRange(t, s, 1, 10, 1, 10)
	for name, logs := range map[string][]*raft.Log{
		"non-consecutive": {entry(1, 11, 1), entry(1, 13, 1)},
		"index 0":         {{Index: 0}},
	} {
		if err := s.StoreLogs(logs); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := s.DeleteRange(3, 5); err == nil {
		t.Error("DeleteRange inside the log accepted")
	}
	// Overwriting at or below the last index replaces the suffix.
	storeRange(t, s, 8, 12, 2, 5)
	if li, _ := s.LastIndex(); li != 12 {
		t.Fatalf("LastIndex %d", li)
	}
	checkEntries(t, s, 1, 7, 1)
	checkEntries(t, s, 8, 12, 2)
	// A gap (raft past a restored snapshot) starts the log anew.
	storeRange(t, s, 20, 22, 3, 3)
	checkGroup(t, s, 20, 22, 3)
}

func TestDeleteRangeAndPurge(t *testing.T) {
	dir := t.TempDir()
	// No prepared segments: leaving segment 1 early for one (whenever it is ready) could
	// leave group 1's first entries alone there, and the layout below must hold both.
	opt := Options{SegmentBytes: 4 << 10, Fsync: FsyncAlways, noPrepare: true}
	l := openT(t, dir, opt)
	a, b := l.Group(1), l.Group(2)
	for i := uint64(1); i <= 400; i += 10 { // interleaved: every segment holds both
		storeRange(t, a, i, i+9, 1, 7)
		storeRange(t, b, i, i+9, 1, 5)
	}
	before := len(segFiles(t, dir))
	if before < 6 {
		t.Fatalf("want several segments, have %d", before)
	}

	// Prefix compaction of only one group purges nothing: b still needs them.
	if err := a.DeleteRange(1, 350); err != nil {
		t.Fatal(err)
	}
	settle(t, l)
	if n := len(segFiles(t, dir)); n != before {
		t.Fatalf("purged with group 2 still holding segment 1: %d -> %d", before, n)
	}
	if st := l.Stats(); st.OldestSegmentPinnedBy != 2 {
		t.Fatalf("OldestSegmentPinnedBy = %d, want 2", st.OldestSegmentPinnedBy)
	}
	if err := b.DeleteRange(1, 350); err != nil {
		t.Fatal(err)
	}
	settle(t, l)
	after := len(segFiles(t, dir))
	if after >= before-2 {
		t.Fatalf("prefix deletes purged too little: %d -> %d segments", before, after)
	}
	if l.Stats().PurgedSegments != uint64(before-after) {
		t.Fatalf("PurgedSegments %d, want %d", l.Stats().PurgedSegments, before-after)
	}
	checkGroup(t, a, 351, 400, 1)
	checkGroup(t, b, 351, 400, 1)

	// Suffix truncation (raft conflict) then new entries with a new term.
	if err := a.DeleteRange(381, 400); err != nil {
		t.Fatal(err)
	}
	checkGroup(t, a, 351, 380, 1)
	// b: truncate a suffix and leave it short.
	if err := b.DeleteRange(391, 450); err != nil {
		t.Fatal(err)
	}
	storeRange(t, a, 381, 390, 5, 4)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openT(t, dir, opt)
	a, b = l.Group(1), l.Group(2)
	checkGroup(t, b, 351, 390, 1) // the deleted suffix is not resurrected
	fi, _ := a.FirstIndex()
	li, _ := a.LastIndex()
	if fi != 351 || li != 390 {
		t.Fatalf("group 1 range %d..%d", fi, li)
	}
	checkEntries(t, a, 351, 380, 1)
	checkEntries(t, a, 381, 390, 5)

	// Deleting everything lets every non-active segment go.
	if err := a.DeleteRange(1, 1000); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteRange(351, 390); err != nil {
		t.Fatal(err)
	}
	settle(t, l)
	if n := len(segFiles(t, dir)); n != 1 {
		t.Fatalf("%d segments left after deleting everything", n)
	}
	checkGroup(t, a, 0, 0, 0)
	// After a full delete (snapshot restore) a group may start at any index.
	storeRange(t, a, 1000, 1010, 9, 11)
	l.Close()
	l = openT(t, dir, opt)
	defer l.Close()
	checkGroup(t, l.Group(1), 1000, 1010, 9)
	checkGroup(t, l.Group(2), 0, 0, 0)
}

func TestStableValues(t *testing.T) {
	dir := t.TempDir()
	opt := Options{SegmentBytes: 8 << 10}
	l := openT(t, dir, opt)
	s := l.Group(3)
	if _, err := s.Get([]byte("LastVoteCand")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a missing key: %v (raft compares the text \"not found\")", err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); v != 0 || err != nil {
		t.Fatalf("GetUint64 of a missing key: %d, %v", v, err)
	}
	fsyncs := l.Stats().Fsyncs
	for g := uint64(1); g <= 20; g++ {
		st := l.Group(g)
		if err := st.SetUint64([]byte("CurrentTerm"), g*100); err != nil {
			t.Fatal(err)
		}
		if err := st.Set([]byte("LastVoteCand"), []byte(fmt.Sprintf("node-%d", g))); err != nil {
			t.Fatal(err)
		}
		if err := st.Set([]byte("empty"), []byte{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Stats().Fsyncs - fsyncs; got < 1 {
		t.Fatalf("stable writes under fsync=never did not fsync (%d)", got)
	}
	if err := l.Group(5).SetUint64([]byte("CurrentTerm"), 777); err != nil { // overwrite
		t.Fatal(err)
	}
	// Roll many segments with log traffic, then compact so the segments that
	// held the Set records are purged.
	data := l.Group(99)
	storeRange(t, data, 1, 600, 1, 10)
	if err := data.DeleteRange(1, 600); err != nil {
		t.Fatal(err)
	}
	// Under fsync=never the dead segments go at the next fsync.
	if err := l.Group(98).Set([]byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	settle(t, l)
	st := l.Stats()
	if st.PurgedSegments == 0 || st.Segments != 1 {
		t.Fatalf("expected purge down to one segment: %+v", st)
	}
	check := func(l *Log) {
		t.Helper()
		for g := uint64(1); g <= 20; g++ {
			want := g * 100
			if g == 5 {
				want = 777
			}
			if v, err := l.Group(g).GetUint64([]byte("CurrentTerm")); v != want || err != nil {
				t.Fatalf("group %d CurrentTerm = %d, %v", g, v, err)
			}
			if v, err := l.Group(g).Get([]byte("LastVoteCand")); string(v) != fmt.Sprintf("node-%d", g) || err != nil {
				t.Fatalf("group %d LastVoteCand = %q, %v", g, v, err)
			}
			if v, err := l.Group(g).Get([]byte("empty")); v == nil || len(v) != 0 || err != nil {
				t.Fatalf("group %d empty = %v, %v", g, v, err)
			}
		}
	}
	check(l)
	l.Close()
	l = openT(t, dir, opt)
	defer l.Close()
	check(l)
	if _, err := l.Group(1).GetUint64([]byte("LastVoteCand")); err == nil {
		t.Fatal("GetUint64 of a non-8-byte value succeeded")
	}
}

// TestCheckpointLargerThanSegment: many stable values must not make the
// journal roll forever when the checkpoint alone exceeds SegmentBytes.
func TestCheckpointLargerThanSegment(t *testing.T) {
	dir := t.TempDir()
	opt := Options{SegmentBytes: 4 << 10}
	l := openT(t, dir, opt)
	for g := uint64(1); g <= 100; g++ {
		if err := l.Group(g).Set([]byte("k"), bytes.Repeat([]byte{byte(g)}, 80)); err != nil {
			t.Fatal(err)
		}
	}
	storeRange(t, l.Group(1000), 1, 50, 1, 3)
	if st := l.Stats(); st.Segments > 60 {
		t.Fatalf("%d segments", st.Segments)
	}
	l.Close()
	l = openT(t, dir, opt)
	defer l.Close()
	if v, _ := l.Group(100).Get([]byte("k")); !bytes.Equal(v, bytes.Repeat([]byte{100}, 80)) {
		t.Fatalf("value %v", v)
	}
	checkGroup(t, l.Group(1000), 1, 50, 1)
}

func TestConcurrentGroups(t *testing.T) {
	for _, mode := range []FsyncMode{FsyncNever, FsyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			opt := Options{SegmentBytes: 256 << 10, Fsync: mode}
			l := openT(t, dir, opt)
			const workers, groupsPer, n = 16, 4, 40
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := uint64(1); i <= n; i++ {
						for k := 0; k < groupsPer; k++ {
							g := uint64(w*groupsPer + k + 1)
							s := l.Group(g)
							if err := s.StoreLogs([]*raft.Log{entry(g, i, 1)}); err != nil {
								errs <- err
								return
							}
							var got raft.Log
							if err := s.GetLog(i, &got); err != nil || got.Index != i {
								errs <- fmt.Errorf("group %d GetLog(%d): %v", g, i, err)
								return
							}
							if i%20 == 0 {
								if err := s.DeleteRange(1, i-10); err != nil {
									errs <- err
									return
								}
								if err := s.SetUint64([]byte("CurrentTerm"), i); err != nil {
									errs <- err
									return
								}
							}
						}
					}
				}(w)
			}
			// A concurrent reader of stats and indexes.
			stop, stopped := make(chan struct{}), make(chan struct{})
			go func(l *Log) {
				defer close(stopped)
				for {
					select {
					case <-stop:
						return
					default:
						l.Stats()
						l.Group(1).LastIndex()
					}
				}
			}(l)
			wg.Wait()
			close(stop)
			<-stopped
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			st := l.Stats()
			t.Logf("requests %d, writes %d, fsyncs %d", st.Requests, st.Writes, st.Fsyncs)
			if st.Writes >= st.Requests {
				t.Errorf("no group commit: %d writes for %d requests", st.Writes, st.Requests)
			}
			l.Close()
			l = openT(t, dir, opt)
			defer l.Close()
			for g := uint64(1); g <= workers*groupsPer; g++ {
				checkGroup(t, l.Group(g), n-9, n, 1)
				if v, _ := l.Group(g).GetUint64([]byte("CurrentTerm")); v != n {
					t.Fatalf("group %d term %d", g, v)
				}
			}
		})
	}
}

// A quiet group that never compacts must not pin old segments forever: its
// few live entries are copied forward and the segments are purged.
func TestQuietGroupCopiedForward(t *testing.T) {
	dir := t.TempDir()
	opt := Options{SegmentBytes: 32 << 10}
	l := openT(t, dir, opt)
	quiet, busy := l.Group(7), l.Group(8)
	storeRange(t, quiet, 1, 12, 1, 5)
	if err := quiet.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	// Readers of the quiet group must never miss an entry while it moves.
	stop, readErr := make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(readErr)
		for k := uint64(0); ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			var e raft.Log
			if err := quiet.GetLog(k%12+1, &e); err != nil || !reflect.DeepEqual(&e, entry(7, k%12+1, 1)) {
				readErr <- fmt.Errorf("quiet GetLog(%d): %v", k%12+1, err)
				return
			}
		}
	}()
	for i := uint64(1); i <= 6000; i += 50 {
		storeRange(t, busy, i, i+49, 1, 10)
		if err := busy.DeleteRange(1, i+39); err != nil { // keep a short tail, like raft's TrailingLogs
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Segments > 4 || st.CopiedEntries == 0 {
		t.Fatalf("quiet group still pins segments: %+v", st)
	}
	checkGroup(t, quiet, 1, 12, 1)
	checkGroup(t, busy, 5991, 6000, 1)
	l.Close()
	l = openT(t, dir, opt)
	defer l.Close()
	checkGroup(t, l.Group(7), 1, 12, 1)
	checkGroup(t, l.Group(8), 5991, 6000, 1)
	if v, _ := l.Group(7).GetUint64([]byte("CurrentTerm")); v != 3 {
		t.Fatalf("term %d", v)
	}
}

// Batches bigger than a record are split into a run of records, and an
// entry bigger than the recovery window still replays.
func TestLargeBatchesAndEntries(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4 << 20})
	s := l.Group(1)
	mk := func(i uint64, size int) *raft.Log {
		return &raft.Log{Index: i, Term: 1, Data: bytes.Repeat([]byte{byte(i)}, size)}
	}
	var logs []*raft.Log
	for i := uint64(1); i <= 300; i++ {
		logs = append(logs, mk(i, 8<<10))
	}
	logs = append(logs, mk(301, 5<<20), mk(302, 10))
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if r := l.Stats().Records; r < 4 {
		t.Fatalf("%d records for a 7.5 MiB batch", r)
	}
	check := func(s *GroupStore) {
		t.Helper()
		for _, want := range logs {
			var got raft.Log
			if err := s.GetLog(want.Index, &got); err != nil || !bytes.Equal(got.Data, want.Data) {
				t.Fatalf("index %d: %v, %d bytes", want.Index, err, len(got.Data))
			}
		}
	}
	check(s)
	l.Close()
	l = openT(t, dir, Options{SegmentBytes: 4 << 20})
	defer l.Close()
	check(l.Group(1))
}

// TestGetLogMetaAndEntrySizes: the bodiless reads agree with GetLog, live and after a
// restart, and EntrySizes follows the live range (truncations, prefix deletes).
func TestGetLogMetaAndEntrySizes(t *testing.T) {
	dir := t.TempDir()
	check := func(s *GroupStore, first, last uint64, termOf func(uint64) uint64) {
		t.Helper()
		gotFirst, sizes := s.EntrySizes()
		if last == 0 {
			if gotFirst != 0 || len(sizes) != 0 {
				t.Fatalf("empty log: EntrySizes = %d, %v", gotFirst, sizes)
			}
			return
		}
		if gotFirst != first || uint64(len(sizes)) != last-first+1 {
			t.Fatalf("EntrySizes: first %d, %d sizes; want %d, %d", gotFirst, len(sizes), first, last-first+1)
		}
		for i := first; i <= last; i++ {
			want := entry(s.ID(), i, termOf(i))
			if n := sizes[i-first]; n != uint32(len(want.Data)+len(want.Extensions)) {
				t.Fatalf("index %d: size %d, want %d", i, n, len(want.Data)+len(want.Extensions))
			}
			var got raft.Log
			if err := s.GetLogMeta(i, &got); err != nil {
				t.Fatalf("GetLogMeta(%d): %v", i, err)
			}
			w := *want
			w.Data, w.Extensions = nil, nil
			if !reflect.DeepEqual(got, w) {
				t.Fatalf("GetLogMeta(%d):\n got %+v\nwant %+v", i, got, w)
			}
		}
		var got raft.Log
		for _, i := range []uint64{first - 1, last + 1} {
			if err := s.GetLogMeta(i, &got); !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatalf("GetLogMeta(%d) = %v, want ErrLogNotFound", i, err)
			}
		}
	}
	l := openT(t, dir, Options{})
	s := l.Group(3)
	one := func(uint64) uint64 { return 1 }
	check(s, 0, 0, one)
	storeRange(t, s, 1, 40, 1, 7)
	check(s, 1, 40, one)
	if err := s.DeleteRange(1, 9); err != nil {
		t.Fatal(err)
	}
	storeRange(t, s, 31, 50, 2, 5)                         // replaces 31..40
	rewritten := func(i uint64) uint64 { return 1 + i/31 } // 31.. written again with term 2
	check(s, 10, 50, rewritten)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openT(t, dir, Options{})
	defer l.Close()
	check(l.Group(3), 10, 50, rewritten)
}

// TestIdleWriterTakesRunnableRequests: shortly after a write that had company, a caller
// that finds the journal idle yields once before its write, so requests of goroutines
// that were already runnable go in the same write. With one processor and no yield, each
// of them would find the journal idle again after the previous write and write alone.
func TestIdleWriterTakesRunnableRequests(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer func(w time.Duration) { busyWindow = w }(busyWindow)
	busyWindow = time.Minute // a slow machine may take the window between rounds
	l := openT(t, t.TempDir(), Options{Fsync: FsyncNever})
	defer l.Close()
	const writers, rounds = 8, 20
	store := func(index uint64) {
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := uint64(1); w <= writers; w++ {
			wg.Add(1)
			go func(g uint64) {
				defer wg.Done()
				if err := l.Group(g).StoreLogs([]*raft.Log{entry(g, index, 1)}); err != nil {
					errs <- err
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	if !l.companyAt.IsZero() {
		t.Fatal("a fresh journal had company")
	}
	// A write with company: the requests queue while a write is under way (held here),
	// and the flusher takes them in one batch.
	l.qmu.Lock()
	l.writing = true
	l.qmu.Unlock()
	done := make(chan struct{})
	go func() { store(1); close(done) }()
	for queued := 0; queued < writers; {
		runtime.Gosched()
		l.qmu.Lock()
		queued = len(l.queue)
		l.qmu.Unlock()
	}
	l.qmu.Lock()
	l.writing = false
	l.qcond.Signal()
	l.qmu.Unlock()
	<-done
	for round := uint64(2); round <= rounds; round++ {
		before := l.Stats()
		store(round)
		after := l.Stats()
		if req, wr := after.Requests-before.Requests, after.Writes-before.Writes; req != writers || wr > 2 {
			t.Fatalf("round %d: %d requests took %d writes, want all %d in at most 2", round, req, wr, writers)
		}
	}
	for g := uint64(1); g <= writers; g++ {
		checkGroup(t, l.Group(g), 1, rounds, 1)
	}
	// A lone write does not count as company.
	l.qmu.Lock()
	l.companyAt = time.Time{}
	l.qmu.Unlock()
	storeRange(t, l.Group(100), 1, 2, 1, 1)
	if !l.companyAt.IsZero() {
		t.Fatal("lone writes counted as company")
	}
}
