package server

import (
	"context"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"
)

// Memory return: after a burst (many large bodies at once) the Go heap shrinks, but the
// runtime gives the freed pages back to the OS only gradually. ReleaseMemory checks every
// interval how much free heap the process still holds and, past minFree, returns it at once
// with debug.FreeOSMemory (a full collection: rare by design, only after the heap shrank).

// Defaults of the memory return ([limits] free_memory_interval, free_memory_min_bytes).
const (
	DefaultFreeMemoryInterval = 30 * time.Second
	DefaultFreeMemoryMinBytes = 64 << 20
)

// heapFreeMetric is the heap memory that is free and still held from the OS.
const heapFreeMetric = "/memory/classes/heap/free:bytes"

// HeapFreeBytes returns the free heap memory the process holds without using it.
func HeapFreeBytes() uint64 {
	s := []rtmetrics.Sample{{Name: heapFreeMetric}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// ReleaseMemory returns free heap memory to the OS every interval while more than minFree
// bytes of it are held, until ctx ends. It returns at once when interval <= 0.
func ReleaseMemory(ctx context.Context, interval time.Duration, minFree uint64) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if HeapFreeBytes() > minFree {
				debug.FreeOSMemory()
			}
		}
	}
}
