package raftlog

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitPrepared waits until the next segment is ready (prealloc.go).
func waitPrepared(t *testing.T, l *Log) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		l.prep.mu.Lock()
		ready := l.prep.ready
		l.prep.mu.Unlock()
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the next segment was never prepared")
		}
	}
}

// fillUntilRoll stores runs of 10 entries in s from next on until the active segment
// changes; it returns the next index.
func fillUntilRoll(t *testing.T, l *Log, s *GroupStore, next uint64) uint64 {
	t.Helper()
	before := l.Stats().ActiveSegment
	for l.Stats().ActiveSegment == before {
		storeRange(t, s, next, next+9, 1, 10)
		next += 10
	}
	return next
}

// frameBytes is where segment id's frames end.
func frameBytes(l *Log, id uint64) int64 {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	return l.segs[id].size
}

// copySegments copies the segment files of dir into to, as a crash leaves them.
func copySegments(t *testing.T, dir, to string) {
	t.Helper()
	for _, p := range segFiles(t, dir) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, filepath.Base(p)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// With FsyncAlways the roll takes a segment prepared full of zeros: the active file is
// SegmentBytes long from the start, sealed segments are cut back to their frames, and
// the journal reads back the same after a Close and after a crash (files copied as they
// are, zeros after the last frame), in either case without any tail reported damaged.
func TestPreparedSegments(t *testing.T) {
	dir := t.TempDir()
	const segBytes = 64 << 10
	opt := Options{SegmentBytes: segBytes, Fsync: FsyncAlways}
	l := openT(t, dir, opt)
	s := l.Group(1)
	next := uint64(1)
	for round := 0; round < 4; round++ {
		waitPrepared(t, l)
		next = fillUntilRoll(t, l, s, next)
	}
	if next < 40 {
		t.Fatalf("only %d entries", next)
	}
	st := l.Stats()
	active := filepath.Join(dir, segName(st.ActiveSegment))
	if got := fileSize(t, active); got != segBytes {
		t.Fatalf("active segment file is %d bytes, want the prepared %d", got, segBytes)
	}
	for id := st.ActiveSegment - 3; id < st.ActiveSegment; id++ {
		if got, want := fileSize(t, filepath.Join(dir, segName(id))), frameBytes(l, id); got != want {
			t.Fatalf("sealed segment %d: file %d bytes, frames %d", id, got, want)
		}
	}
	// A crash: the files as they are now.
	crashed := t.TempDir()
	copySegments(t, dir, crashed)
	os.WriteFile(filepath.Join(crashed, preallocName), make([]byte, 100), 0o644) // a cut-short preparation
	l.Close()

	c := openT(t, crashed, opt)
	if st := c.Stats(); st.TailDamage != "" || st.TruncatedBytes != 0 || st.CleanShutdown {
		t.Fatalf("after a crash: %+v", st)
	}
	checkGroup(t, c.Group(1), 1, next-1, 1)
	// Appends continue in the zeros, and read back after another crash-free reopen.
	storeRange(t, c.Group(1), next, next+4, 1, 5)
	c.Close()
	c = openT(t, crashed, opt)
	if st := c.Stats(); st.TailDamage != "" || !st.CleanShutdown {
		t.Fatalf("after a close: %+v", st)
	}
	checkGroup(t, c.Group(1), 1, next+4, 1)
	c.Close()

	l = openT(t, dir, opt)
	if st := l.Stats(); st.TailDamage != "" || !st.CleanShutdown {
		t.Fatalf("after a close: %+v", st)
	}
	checkGroup(t, l.Group(1), 1, next-1, 1)
	l.Close()
}

// A frame torn inside a prepared segment is cut like any torn tail: the bytes after the
// damage are not all zeros.
func TestTornFrameInPreparedSegment(t *testing.T) {
	dir := t.TempDir()
	opt := Options{SegmentBytes: 64 << 10, Fsync: FsyncAlways, Logf: func(string, ...any) {}}
	l := openT(t, dir, opt)
	s := l.Group(1)
	waitPrepared(t, l)
	next := fillUntilRoll(t, l, s, 1)
	id := l.Stats().ActiveSegment
	start := frameBytes(l, id)
	storeRange(t, s, next, next+9, 1, 10)
	path := filepath.Join(dir, segName(id))
	data, _ := os.ReadFile(path)
	l.Close()
	data[start+30] ^= 1 // inside the last record
	crashed := t.TempDir()
	copySegments(t, dir, crashed)
	os.WriteFile(filepath.Join(crashed, segName(id)), data, 0o644)
	c := openT(t, crashed, opt)
	defer c.Close()
	if st := c.Stats(); st.TailDamage != "corrupt" || st.TruncatedBytes != int64(len(data))-start {
		t.Fatalf("stats %+v", st)
	}
	checkGroup(t, c.Group(1), 1, next-1, 1)
}

// FsyncNever prepares nothing: its segments grow as they are written.
func TestNoPreparationWithoutFsync(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 64 << 10, Fsync: FsyncNever})
	defer l.Close()
	if l.prep != nil {
		t.Fatal("a preparer without fsync")
	}
	storeRange(t, l.Group(1), 1, 300, 1, 10)
	if _, err := os.Stat(filepath.Join(dir, preallocName)); !os.IsNotExist(err) {
		t.Fatalf("prepared file: %v", err)
	}
}

// Zeros after the last frame are room, not damage, in either mode (a crash can leave
// blocks allocated before their data reached them): nothing is cut, and appends continue
// where the frames end.
func TestZeroTailIsNotDamage(t *testing.T) {
	_, data, _ := journalWithTail(t, FsyncNever)
	dir := t.TempDir()
	writeSeg(t, dir, 1, append(append([]byte(nil), data...), make([]byte, 4096)...))
	l := openT(t, dir, Options{Logf: func(string, ...any) {}})
	if st := l.Stats(); st.TailDamage != "" || st.TruncatedBytes != 0 || st.Bytes != int64(len(data)) {
		t.Fatalf("stats %+v", st)
	}
	checkEntries(t, l.Group(1), 1, 20, 1)
	storeRange(t, l.Group(4), 1, 5, 1, 5)
	l.Close()
	l = openT(t, dir, Options{})
	defer l.Close()
	if st := l.Stats(); st.TailDamage != "" || !st.CleanShutdown {
		t.Fatalf("after a close: %+v", st)
	}
	checkEntries(t, l.Group(1), 1, 20, 1)
	checkGroup(t, l.Group(4), 1, 5, 1)
}

// The segment active at Open is left for a prepared one as soon as that is ready, once:
// a node writing little gets the faster fsyncs without filling 64 MiB first. A reopen
// on a prepared segment stays on it.
func TestLeavesOpenSegmentForPrepared(t *testing.T) {
	dir := t.TempDir()
	const segBytes = 64 << 10
	opt := Options{SegmentBytes: segBytes, Fsync: FsyncAlways}
	l := openT(t, dir, opt)
	s := l.Group(1)
	storeRange(t, s, 1, 2, 1, 2)
	waitPrepared(t, l)
	storeRange(t, s, 3, 4, 1, 2)
	if id := l.Stats().ActiveSegment; id != 2 {
		t.Fatalf("active segment %d, want the prepared 2", id)
	}
	if got := fileSize(t, filepath.Join(dir, segName(2))); got != segBytes {
		t.Fatalf("segment 2 is %d bytes, want %d", got, segBytes)
	}
	waitPrepared(t, l) // the next one: it waits for segment 2 to fill
	storeRange(t, s, 5, 6, 1, 2)
	if id := l.Stats().ActiveSegment; id != 2 {
		t.Fatalf("left a prepared segment early: active %d", id)
	}
	l.Close()

	l = openT(t, dir, opt)
	defer l.Close()
	waitPrepared(t, l)
	storeRange(t, l.Group(1), 7, 8, 1, 2)
	if id := l.Stats().ActiveSegment; id != 2 {
		t.Fatalf("a reopen on a prepared segment rolled: active %d", id)
	}
	checkGroup(t, l.Group(1), 1, 8, 1)
}

// Under disk pressure no preparation starts: the zeros would take room the journal's own
// writes need.
func TestNoPreparationUnderDiskPressure(t *testing.T) {
	dir := t.TempDir()
	g, err := NewDiskGuard(dir, -1, 1<<62) // no floor; resumes only past 4 EiB free
	if err != nil {
		t.Fatal(err)
	}
	g.NoSpace()
	l := openT(t, dir, Options{SegmentBytes: 4 << 10, Fsync: FsyncAlways, Guard: g})
	defer l.Close()
	storeRange(t, l.Group(1), 1, 400, 1, 10) // several rolls, none of them prepared
	if l.Stats().ActiveSegment < 3 {
		t.Fatalf("want rolls: %+v", l.Stats())
	}
	if _, err := os.Stat(filepath.Join(dir, preallocName)); !os.IsNotExist(err) {
		t.Fatalf("a segment was prepared under disk pressure: %v", err)
	}
	id := l.Stats().ActiveSegment
	if got := fileSize(t, filepath.Join(dir, segName(id))); got != frameBytes(l, id) {
		t.Fatalf("the active segment is %d bytes: prepared", got)
	}
	checkGroup(t, l.Group(1), 1, 400, 1)
}
