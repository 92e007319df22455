package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/internal/racetest"
	"github.com/ursula-go/ursula/streamcore"
)

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BytesPerIdleStream creates n streams through e (each created, never written to) and
// returns the live heap they added, per stream.
func BytesPerIdleStream(t testing.TB, e engine.Engine, n int) float64 {
	t.Helper()
	ctx := context.Background()
	before := heapInUse()
	now := time.Now().UnixMilli()
	for i := 0; i < n; i++ {
		c := &streamcore.Command{Op: streamcore.OpCreate, Key: fmt.Sprintf("bucket-%d/stream-%06d", i%8, i), Now: now,
			ContentType: "application/octet-stream", TTL: -1, NewIncarnation: uint64(i + 1)}
		res, err := e.Propose(ctx, c)
		if err != nil || res.Err != nil {
			t.Fatalf("create %d: %v %v", i, err, res.Err)
		}
	}
	after := heapInUse()
	runtime.KeepAlive(e)
	return float64(int64(after)-int64(before)) / float64(n)
}

// TestMemoryBytesPerIdleStream reports what an idle stream costs on the memory engine (the
// goal is under 2 KB) and fails only far above it.
func TestMemoryBytesPerIdleStream(t *testing.T) {
	n := 20000
	if racetest.Enabled {
		n = 5000
	}
	e := engine.NewMemory(0)
	defer e.Close()
	per := BytesPerIdleStream(t, e, n)
	t.Logf("memory engine: %.0f bytes of heap per idle stream (%d streams)", per, n)
	if per > 8<<10 {
		t.Fatalf("an idle stream costs %.0f bytes", per)
	}
}
