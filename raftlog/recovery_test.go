package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// journalWithTail writes a small journal in one segment and returns its
// directory, the file bytes and the offset where the last record starts.
// Groups 1..3 hold 1..20; the last record is group 1's entries 21..22.
func journalWithTail(t *testing.T, mode FsyncMode) (dir string, data []byte, lastStart int) {
	t.Helper()
	dir = t.TempDir()
	l := openT(t, dir, Options{Fsync: mode})
	for g := uint64(1); g <= 3; g++ {
		storeRange(t, l.Group(g), 1, 20, 1, 3)
		if err := l.Group(g).SetUint64([]byte("CurrentTerm"), g); err != nil {
			t.Fatal(err)
		}
	}
	lastStart = int(l.Stats().Bytes)
	storeRange(t, l.Group(1), 21, 22, 2, 2)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, segName(1)))
	if err != nil {
		t.Fatal(err)
	}
	// Drop Close's shutdown record: the tests damage the last data record.
	data = data[:len(data)-frameHeaderSize]
	return dir, data, lastStart
}

func writeSeg(t *testing.T, dir string, id uint64, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, segName(id)), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkBeforeTail asserts the state written before the last record.
func checkBeforeTail(t *testing.T, l *Log) {
	t.Helper()
	for g := uint64(1); g <= 3; g++ {
		checkGroup(t, l.Group(g), 1, 20, 1)
		if v, _ := l.Group(g).GetUint64([]byte("CurrentTerm")); v != g {
			t.Fatalf("group %d term %d", g, v)
		}
	}
}

func TestTornTailEveryByte(t *testing.T) {
	_, data, lastStart := journalWithTail(t, FsyncNever)
	for cut := lastStart; cut < len(data); cut++ {
		dir := t.TempDir()
		writeSeg(t, dir, 1, data[:cut])
		rec := &recorder{}
		l := openT(t, dir, Options{Fsync: FsyncNever, Logf: rec.logf})
		st := l.Stats()
		wantDamage, wantCut := "torn", int64(cut-lastStart)
		if cut == lastStart {
			wantDamage = ""
		}
		if st.TailDamage != wantDamage || st.TruncatedBytes != wantCut {
			t.Fatalf("cut at %d: damage %q, truncated %d; want %q, %d", cut, st.TailDamage, st.TruncatedBytes, wantDamage, wantCut)
		}
		if wantDamage != "" && !strings.Contains(rec.text(), "cutting") {
			t.Fatalf("cut at %d: nothing logged: %q", cut, rec.text())
		}
		checkBeforeTail(t, l)
		// The journal continues cleanly after the cut.
		storeRange(t, l.Group(1), 21, 22, 3, 2)
		l.Close()
		l = openT(t, dir, Options{Fsync: FsyncNever})
		if st := l.Stats(); st.TailDamage != "" {
			t.Fatalf("cut at %d: damage after rewrite: %+v", cut, st)
		}
		checkEntries(t, l.Group(1), 21, 22, 3)
		l.Close()
	}
}

func TestBitFlipInTailIsCut(t *testing.T) {
	_, data, lastStart := journalWithTail(t, FsyncNever)
	for pos := lastStart; pos < len(data); pos++ {
		dir := t.TempDir()
		bad := append([]byte(nil), data...)
		bad[pos] ^= 1 << (pos % 8)
		writeSeg(t, dir, 1, bad)
		l := openT(t, dir, Options{Fsync: FsyncNever, Logf: func(string, ...any) {}})
		st := l.Stats()
		if st.TailDamage != "corrupt" || st.TruncatedBytes != int64(len(data)-lastStart) {
			t.Fatalf("flip at %d: %+v", pos, st)
		}
		checkBeforeTail(t, l)
		l.Close()
	}
}

func TestGarbageAfterTailIsCut(t *testing.T) {
	_, data, _ := journalWithTail(t, FsyncNever)
	for _, junk := range [][]byte{append(make([]byte, 4095), 1), []byte("NL"), []byte(strings.Repeat("NLgarbage", 50))} {
		dir := t.TempDir()
		writeSeg(t, dir, 1, append(append([]byte(nil), data...), junk...))
		l := openT(t, dir, Options{Logf: func(string, ...any) {}})
		if st := l.Stats(); st.TruncatedBytes != int64(len(junk)) {
			t.Fatalf("junk %d bytes: %+v", len(junk), st)
		}
		checkEntries(t, l.Group(1), 1, 20, 1)
		checkEntries(t, l.Group(1), 21, 22, 2)
		checkGroup(t, l.Group(3), 1, 20, 1)
		l.Close()
	}
}

// Damage in the middle of the last segment with valid frames after it: if
// one of them was written after an fsync that covered the damaged bytes, the
// damage hit synced data and Open refuses (in either mode); if all of them
// were written since the last fsync, it is a torn write and all is cut.
func TestDamageInsideLastSegment(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   FsyncMode
		syncs  bool // a stable write (always synced) after each group's entries
		refuse bool
	}{
		{"always", FsyncAlways, false, true},
		{"never with a synced write after the damage", FsyncNever, true, true},
		{"never with only unsynced writes after the damage", FsyncNever, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openT(t, dir, Options{Fsync: tc.mode, noPrepare: true}) // all in segment 1
			var mid int
			for g := uint64(1); g <= 3; g++ {
				if g == 2 {
					mid = int(l.Stats().Bytes) + 30 // inside group 2's first record
				}
				storeRange(t, l.Group(g), 1, 20, 1, 3)
				if tc.syncs {
					if err := l.Group(g).SetUint64([]byte("CurrentTerm"), g); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Simulate a crash: the files as they are, without Close.
			data, _ := os.ReadFile(filepath.Join(dir, segName(1)))
			l.Close()
			data[mid] ^= 0x40
			crashed := t.TempDir()
			writeSeg(t, crashed, 1, data)
			rec := &recorder{}
			l, err := Open(crashed, Options{Fsync: tc.mode, Logf: rec.logf})
			if tc.refuse {
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "synced") {
					t.Fatalf("Open = %v, want ErrCorrupt about synced data", err)
				}
				if got, _ := os.ReadFile(filepath.Join(crashed, segName(1))); len(got) != len(data) {
					t.Fatal("refused open modified the segment")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if st := l.Stats(); st.TailDamage != "corrupt" || st.TruncatedBytes != int64(len(data)-(mid-30)) {
				t.Fatalf("stats %+v", st)
			}
			if !strings.Contains(rec.text(), "never synced frames follow") {
				t.Fatalf("log does not say unsynced frames were cut: %q", rec.text())
			}
			checkGroup(t, l.Group(1), 1, 20, 1) // written before the damage
			if li, _ := l.Group(3).LastIndex(); li != 0 {
				t.Fatalf("group 3 (written after the damage) last index %d", li)
			}
		})
	}
}

func sealedJournal(t *testing.T) (string, Options) {
	t.Helper()
	dir := t.TempDir()
	opt := Options{SegmentBytes: 4 << 10, Fsync: FsyncNever, Logf: func(string, ...any) {}}
	l := openT(t, dir, opt)
	storeRange(t, l.Group(1), 1, 200, 1, 4)
	if err := l.Group(1).SetUint64([]byte("CurrentTerm"), 4); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if n := len(segFiles(t, dir)); n < 3 {
		t.Fatalf("%d segments", n)
	}
	return dir, opt
}

func TestRefuseDamagedSealedSegment(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string
	}{
		{"bit flip in a frame", func(t *testing.T, dir string) { flipByte(t, dir, 1, 1000) }, "sealed segment"},
		{"bit flip in the header", func(t *testing.T, dir string) { flipByte(t, dir, 2, 3) }, "sealed segment"},
		{"torn sealed segment", func(t *testing.T, dir string) {
			p := filepath.Join(dir, segName(1))
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()-5)
		}, "sealed segment"},
		{"missing segment", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, segName(2))) }, "missing"},
		{"stray file", func(t *testing.T, dir string) { os.WriteFile(filepath.Join(dir, "7.seg"), nil, 0o644) }, "unexpected file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, opt := sealedJournal(t)
			tc.damage(t, dir)
			_, err := Open(dir, opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func flipByte(t *testing.T, dir string, seg uint64, pos int) {
	t.Helper()
	p := filepath.Join(dir, segName(seg))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[pos] ^= 0x10
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestUnknownVersion(t *testing.T) {
	dir, opt := sealedJournal(t)
	p := filepath.Join(dir, segName(1))
	b, _ := os.ReadFile(p)
	binary.LittleEndian.PutUint32(b[8:12], 2)
	binary.LittleEndian.PutUint32(b[28:32], crc32.Checksum(b[0:28], castagnoli))
	os.WriteFile(p, b, 0o644)
	_, err := Open(dir, opt)
	var verr *VersionError
	if !errors.As(err, &verr) || verr.Version != 2 {
		t.Fatalf("Open = %v, want a VersionError for version 2", err)
	}
}

// A crash while creating the next segment leaves a short header: it is
// rewritten, and nothing written before is lost (the stable checkpoint of
// the previous segment still holds every value).
func TestTornSegmentHeader(t *testing.T) {
	dir, opt := sealedJournal(t)
	next := uint64(len(segFiles(t, dir)) + 1)
	hdr := make([]byte, segHeaderSize)
	encodeSegHeader(hdr, next)
	writeSeg(t, dir, next, hdr[:11])
	l := openT(t, dir, opt)
	defer l.Close()
	if st := l.Stats(); st.TailDamage != "torn" || st.ActiveSegment != next {
		t.Fatalf("stats %+v", st)
	}
	checkGroup(t, l.Group(1), 1, 200, 1)
	if v, _ := l.Group(1).GetUint64([]byte("CurrentTerm")); v != 4 {
		t.Fatalf("term %d", v)
	}
	storeRange(t, l.Group(1), 201, 210, 1, 5)
	checkEntries(t, l.Group(1), 195, 210, 1)
}

// A DeleteRange suffix followed by a crash (no Close) must stay deleted.
func TestSuffixDeleteSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	s := l.Group(1)
	storeRange(t, s, 1, 50, 1, 10)
	if err := s.DeleteRange(41, 50); err != nil {
		t.Fatal(err)
	}
	// Simulate kill -9: copy the files as they are now, without Close.
	crashed := t.TempDir()
	b, _ := os.ReadFile(filepath.Join(dir, segName(1)))
	writeSeg(t, crashed, 1, b)
	l.Close()
	l = openT(t, crashed, Options{})
	defer l.Close()
	checkGroup(t, l.Group(1), 1, 40, 1)
	var e raft.Log
	if err := l.Group(1).GetLog(45, &e); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("deleted entry resurrected: %v", err)
	}
}

// A failed write ends the journal: the error is sticky (retrying a failed
// write or fsync is unsafe) and the next Open keeps the verified prefix.
// Stable writes still succeed, through the side file, and survive the reopen.
func TestWriteFailureIsSticky(t *testing.T) {
	dir := t.TempDir()
	rec := &recorder{}
	l := openT(t, dir, Options{Logf: rec.logf})
	s := l.Group(1)
	storeRange(t, s, 1, 10, 1, 5)
	l.active.f.Close() // every later write fails
	if err := s.StoreLog(entry(1, 11, 1)); err == nil {
		t.Fatal("write to a closed file succeeded")
	}
	if err := s.StoreLog(entry(1, 11, 1)); err == nil {
		t.Fatal("write after a failure succeeded")
	}
	if err := l.Group(2).SetUint64([]byte("CurrentTerm"), 1); err != nil {
		t.Fatalf("a stable write after a failure failed: %v", err)
	}
	if !strings.Contains(rec.text(), "journal failed") {
		t.Fatalf("failure not logged: %q", rec.text())
	}
	if err := l.Close(); err == nil {
		t.Fatal("Close of a failed journal returned nil")
	}
	l = openT(t, dir, Options{})
	defer l.Close()
	checkGroup(t, l.Group(1), 1, 10, 1)
	if v, _ := l.Group(2).GetUint64([]byte("CurrentTerm")); v != 1 {
		t.Fatalf("the stable write made after the failure is lost: %d", v)
	}
}

func TestCleanShutdownReported(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	if !l.Stats().CleanShutdown {
		t.Fatal("new journal not reported clean")
	}
	storeRange(t, l.Group(1), 1, 5, 1, 5)
	crashed := t.TempDir() // the files as a kill -9 would leave them
	b, _ := os.ReadFile(filepath.Join(dir, segName(1)))
	writeSeg(t, crashed, 1, b)
	l.Close()

	l = openT(t, dir, Options{})
	if st := l.Stats(); !st.CleanShutdown || st.Groups != 1 {
		t.Fatalf("after Close: %+v", st)
	}
	storeRange(t, l.Group(1), 6, 8, 1, 5) // appends follow the shutdown record
	l.Close()
	l = openT(t, dir, Options{})
	checkGroup(t, l.Group(1), 1, 8, 1)
	l.Close()

	l = openT(t, crashed, Options{})
	defer l.Close()
	if st := l.Stats(); st.CleanShutdown {
		t.Fatalf("after a crash: %+v", st)
	}
	checkGroup(t, l.Group(1), 1, 5, 1)
}

// With FsyncAlways, a host crash in the middle of the final write may keep
// later records of that write and lose earlier ones. None of it was
// acknowledged, so it is cut rather than refused.
func TestTornFinalWriteWithLaterRecordsIsCut(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{Fsync: FsyncAlways, noPrepare: true}) // all in segment 1
	s := l.Group(1)
	storeRange(t, s, 1, 10, 1, 5)
	start := int(l.Stats().Bytes)
	var logs []*raft.Log
	for i := uint64(11); i <= 40; i++ { // ~3 MiB: a run of records in one write
		logs = append(logs, &raft.Log{Index: i, Term: 1, Data: bytes.Repeat([]byte{byte(i)}, 100<<10)})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, segName(1)))
	l.Close()
	if l.Stats().Records < 4 {
		t.Fatalf("want the batch split into records: %+v", l.Stats())
	}
	data[start+100] ^= 1 // inside the first record of the final write
	crashed := t.TempDir()
	writeSeg(t, crashed, 1, data)
	l = openT(t, crashed, Options{Fsync: FsyncAlways, Logf: func(string, ...any) {}})
	defer l.Close()
	if st := l.Stats(); st.TailDamage != "corrupt" || st.TruncatedBytes != int64(len(data)-start) {
		t.Fatalf("stats %+v", st)
	}
	checkGroup(t, l.Group(1), 1, 10, 1)
}
