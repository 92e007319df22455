package server

import (
	"context"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// Memory return: after a burst (many large bodies at once) the Go heap shrinks, but the
// runtime gives the freed pages back to the OS only gradually, and an idle process may not
// even collect the burst's garbage for minutes (a collection starts from allocation). So
// ReleaseMemory looks every interval: when no collection ran since its last look (the node
// is idle) and the heap holds more than minFree beyond the live heap it measured after its
// own last return, it returns the memory at once with debug.FreeOSMemory (a full
// collection). Under load collections run anyway and it stays out of the way; while idle
// it runs once per burst, not on every tick. An idle node also unmaps the stream-byte
// arenas kept for reuse (streamcore.ReleaseArenas).

// Defaults of the memory return ([limits] free_memory_interval, free_memory_min_bytes).
const (
	DefaultFreeMemoryInterval = 30 * time.Second
	DefaultFreeMemoryMinBytes = 64 << 20
)

// heapHeldMetrics sum to the heap memory the process holds from the OS (objects, live or
// garbage, plus unused and free spans); gcCyclesMetric counts collections.
var heapHeldMetrics = []string{
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
}

const gcCyclesMetric = "/gc/cycles/total:gc-cycles"

// heapHeld returns the heap bytes held from the OS and the number of collections so far.
func heapHeld() (held, cycles uint64) {
	s := make([]rtmetrics.Sample, 0, len(heapHeldMetrics)+1)
	for _, n := range heapHeldMetrics {
		s = append(s, rtmetrics.Sample{Name: n})
	}
	s = append(s, rtmetrics.Sample{Name: gcCyclesMetric})
	rtmetrics.Read(s)
	for i, v := range s {
		if v.Value.Kind() != rtmetrics.KindUint64 {
			continue
		}
		if i < len(heapHeldMetrics) {
			held += v.Value.Uint64()
		} else {
			cycles = v.Value.Uint64()
		}
	}
	return held, cycles
}

// ReleaseMemory returns heap memory to the OS as described above, every interval, until
// ctx ends. It returns at once when interval <= 0.
func ReleaseMemory(ctx context.Context, interval time.Duration, minFree uint64) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var live uint64 // the heap held right after the last return
	_, lastCycles := heapHeld()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			held, cycles := heapHeld()
			idle := cycles == lastCycles
			lastCycles = cycles
			if idle {
				streamcore.ReleaseArenas() // stream-byte arenas kept for reuse
			}
			if idle && held > live+minFree {
				debug.FreeOSMemory()
				live, lastCycles = heapHeld()
			}
		}
	}
}
