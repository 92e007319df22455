package raftengine

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/racetest"
	"github.com/ursula-go/ursula/streamcore"
)

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestRaftBytesPerIdleStream reports what an idle stream costs on the raft engine (a single
// voter on the node journal, the default engine): its state plus what Raft and the journal
// keep for its create. The goal is under 2 KB; the test fails only far above it.
func TestRaftBytesPerIdleStream(t *testing.T) {
	n := 20000
	if racetest.Enabled {
		n = 4000
	}
	dir := t.TempDir()
	stores, l := nodelogStores(t, dir+"/wal")
	defer l.Close()
	e, err := Open(Config{NodeID: 1, GroupCount: 16, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitReady(t, e)
	ctx := context.Background()
	before := liveHeap()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				c := &streamcore.Command{Op: streamcore.OpCreate, Key: fmt.Sprintf("bucket-%d/stream-%06d", i%8, i), Now: time.Now().UnixMilli(),
					ContentType: "application/octet-stream", TTL: -1, NewIncarnation: uint64(i + 1)}
				if res, err := e.Propose(ctx, c); err != nil || res.Err != nil {
					errs <- fmt.Errorf("create %d: %v %v", i, err, res.Err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := liveHeap()
	per := float64(int64(after)-int64(before)) / float64(n)
	t.Logf("raft engine: %.0f bytes of heap per idle stream (%d streams)", per, n)
	if per > 8<<10 {
		t.Fatalf("an idle stream costs %.0f bytes", per)
	}
}
