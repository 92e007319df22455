package raftlog

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkStoreLogs appends 4 KiB entries, one per StoreLogs call, from 1 or
// 64 goroutines (one group each). Groups compact their prefix as raft would,
// so segments are purged during the run. Reported: throughput (MB/s), mean
// call latency, writes and fsyncs per call (group commit shows as < 1).
func BenchmarkStoreLogs(b *testing.B) {
	for _, mode := range []FsyncMode{FsyncNever, FsyncAlways} {
		for _, groups := range []int{1, 64} {
			b.Run(fmt.Sprintf("fsync=%s/groups=%d", mode, groups), func(b *testing.B) {
				benchStoreLogs(b, mode, groups)
			})
		}
	}
}

func benchStoreLogs(b *testing.B, mode FsyncMode, groups int) {
	l, err := Open(b.TempDir(), Options{Fsync: mode, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	start := l.Stats()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var totalLatency, maxLatency time.Duration
	b.ResetTimer()
	for g := 0; g < groups; g++ {
		n := b.N / groups
		if g < b.N%groups {
			n++
		}
		wg.Add(1)
		go func(s *GroupStore, n int) {
			defer wg.Done()
			e := &raft.Log{Term: 1, Data: data}
			logs := []*raft.Log{e}
			var lat, worst time.Duration
			for i := 1; i <= n; i++ {
				e.Index = uint64(i)
				t0 := time.Now()
				if err := s.StoreLogs(logs); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(t0)
				lat += d
				worst = max(worst, d)
				if i%1024 == 0 {
					if err := s.DeleteRange(1, uint64(i-256)); err != nil {
						b.Error(err)
						return
					}
				}
			}
			mu.Lock()
			totalLatency += lat
			maxLatency = max(maxLatency, worst)
			mu.Unlock()
		}(l.Group(uint64(g+1)), n)
	}
	wg.Wait()
	b.StopTimer()
	st := l.Stats()
	calls := float64(b.N)
	b.ReportMetric(float64(totalLatency.Microseconds())/calls, "us/call")
	b.ReportMetric(float64(maxLatency.Microseconds()), "max-us/call")
	b.ReportMetric(float64(st.Writes-start.Writes)/calls, "writes/call")
	b.ReportMetric(float64(st.Fsyncs-start.Fsyncs)/calls, "fsyncs/call")
}

// BenchmarkGetLog reads back recent 4 KiB entries (pread from the page cache).
func BenchmarkGetLog(b *testing.B) {
	l, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s := l.Group(1)
	data := make([]byte, 4096)
	const n = 4096
	for i := uint64(1); i <= n; i += 64 {
		var logs []*raft.Log
		for j := i; j < i+64; j++ {
			logs = append(logs, &raft.Log{Index: j, Term: 1, Data: data})
		}
		if err := s.StoreLogs(logs); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	var e raft.Log
	for i := 0; i < b.N; i++ {
		if err := s.GetLog(uint64(i%n)+1, &e); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRecoveryTime writes NODELOG_RECOVERY_MB megabytes (e.g. 1024) of 4 KiB
// entries over 256 groups, then measures Open and the index memory. Skipped
// unless the variable is set: it is a measurement, not a unit test.
//
//	NODELOG_RECOVERY_MB=1024 go test ./raftlog -run TestRecoveryTime -v
func TestRecoveryTime(t *testing.T) {
	mb, _ := strconv.Atoi(os.Getenv("NODELOG_RECOVERY_MB"))
	if mb <= 0 {
		t.Skip("set NODELOG_RECOVERY_MB to run")
	}
	dir := t.TempDir()
	const groups, batch = 256, 16
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i * 7)
	}
	l := openT(t, dir, Options{})
	total := int64(mb) << 20
	perGroup := int(total / int64(groups) / int64(len(data)+entryHeaderSize))
	t0 := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < groups; g++ {
		wg.Add(1)
		go func(s *GroupStore) {
			defer wg.Done()
			logs := make([]*raft.Log, batch)
			for i := range logs {
				logs[i] = &raft.Log{Term: 3, Data: data, AppendedAt: time.Now()}
			}
			for i := 1; i <= perGroup; i += batch {
				k := min(batch, perGroup-i+1)
				for j := 0; j < k; j++ {
					logs[j].Index = uint64(i + j)
				}
				if err := s.StoreLogs(logs[:k]); err != nil {
					t.Error(err)
					return
				}
			}
		}(l.Group(uint64(g + 1)))
	}
	wg.Wait()
	st := l.Stats()
	t.Logf("wrote %d MB in %d segments, %d entries in %v", st.Bytes>>20, st.Segments, st.LiveEntries, time.Since(t0))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = nil
	runtime.GC()
	runtime.GC() // a second cycle empties sync.Pool's victim cache
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 = time.Now()
	l = openT(t, dir, Options{})
	openTime := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&after)
	defer l.Close()
	st = l.Stats()
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("Open: %v (recovery %v) for %d MB, %d records, %d entries; heap +%d KB = %.1f bytes/entry",
		openTime, st.RecoveryDuration, st.Bytes>>20, st.RecoveredRecords, st.RecoveredEntries, heap>>10, float64(heap)/float64(st.RecoveredEntries))
	if st.RecoveredEntries != int64(groups*perGroup) {
		t.Fatalf("recovered %d entries, want %d", st.RecoveredEntries, groups*perGroup)
	}
	// Again, now that the files were just read (page cache warm).
	l.Close()
	t0 = time.Now()
	l = openT(t, dir, Options{})
	t.Logf("warm Open: %v", time.Since(t0))
	l.Close()
	if dropCache(dir) {
		t0 = time.Now()
		l = openT(t, dir, Options{})
		t.Logf("cold Open (journal evicted from the page cache): %v", time.Since(t0))
	} else {
		l = openT(t, dir, Options{})
	}
	checkLast := l.Group(groups)
	var e raft.Log
	if err := checkLast.GetLog(uint64(perGroup), &e); err != nil || len(e.Data) != len(data) {
		t.Fatalf("last entry: %v", err)
	}
}
