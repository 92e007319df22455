package raftengine

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/raftlog"
	"github.com/ursula-go/ursula/streamcore"
)

// BenchmarkProposeParallel is the default engine's append path without HTTP: a single
// voter with 16 groups on the node log (fsync never and always), 1 or 64 writers each
// appending 4 KiB to its own stream with producer headers, and the memory engine under
// the same load for reference. It reports appends per second, the process's CPU time
// per append (steadier than throughput on a shared machine) and, on the node log, its
// writes and records per append; batch=true shares entries between concurrent proposals
// (Config.BatchProposals).
func BenchmarkProposeParallel(b *testing.B) {
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("memory/writers=%d", writers), func(b *testing.B) {
			m := engine.NewMemory(time.Hour)
			defer m.Close()
			proposeParallel(b, m, writers)
		})
	}
	for _, mode := range []raftlog.FsyncMode{raftlog.FsyncNever, raftlog.FsyncAlways} {
		for _, c := range []struct {
			writers int
			batch   bool
		}{{1, false}, {64, false}, {64, true}} {
			writers, batch := c.writers, c.batch
			b.Run(fmt.Sprintf("fsync=%s/writers=%d/batch=%v", mode, writers, batch), func(b *testing.B) {
				dir := b.TempDir()
				l, err := raftlog.Open(dir+"/wal", raftlog.Options{Fsync: mode})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				e, err := Open(Config{NodeID: 1, GroupCount: 16, Dir: dir + "/raft", RaftLog: io.Discard, BatchProposals: batch,
					Stores: func(g uint64) (raft.LogStore, raft.StableStore, error) {
						s := l.Group(g)
						c, err := raft.NewLogCache(16, s) // as cmd/ursula wraps it
						return c, s, err
					}})
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close()
				waitReady(b, e)
				before := l.Stats()
				proposeParallel(b, e, writers)
				after := l.Stats()
				b.ReportMetric(float64(after.Writes-before.Writes)/float64(b.N), "writes/op")
				b.ReportMetric(float64(after.Records-before.Records)/float64(b.N), "records/op")
			})
		}
	}
}

func proposeParallel(b *testing.B, e engine.Engine, writers int) {
	ctx := context.Background()
	for w := range writers {
		if r, err := e.Propose(ctx, create(fmt.Sprintf("b/w%d", w))); err != nil || r.Status != http.StatusCreated {
			b.Fatalf("create: %v %+v", err, r)
		}
	}
	body := make([]byte, 4096)
	cpu0 := cpuTime()
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("b/w%d", w)
			for s := uint64(0); next.Add(1) <= int64(b.N); s++ {
				c := &streamcore.Command{Op: streamcore.OpAppend, Key: k, Now: time.Now().UnixMilli(), ContentType: "text/plain", Body: body,
					Producer: &streamcore.ProducerHeaders{ID: "p", Epoch: 1, Seq: s}}
				if r, err := e.Propose(ctx, c); err != nil || r.Err != nil {
					b.Errorf("append: %v %+v", err, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
