package server

import (
	"bytes"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
)

// MemoryStats is the process's memory as the metrics report it: enough to tell the cost
// of an idle stream or an idle reader (the scale figures of the benchmark) without a
// heap profile.
type MemoryStats struct {
	// HeapLiveBytes is the heap the last collection found reachable: the live heap, not
	// counting garbage made since (GET /__ursula/metrics?gc=1 on the admin listener runs a
	// collection first).
	HeapLiveBytes uint64 `json:"heap_live_bytes"`
	// HeapObjectsBytes counts every heap object, live or garbage not yet collected.
	HeapObjectsBytes uint64 `json:"heap_objects_bytes"`
	// StackBytes is the memory of goroutine stacks.
	StackBytes uint64 `json:"stack_bytes"`
	// RuntimeTotalBytes is all the memory the Go runtime mapped (Linux: close to the RSS
	// once it was touched).
	RuntimeTotalBytes uint64 `json:"runtime_total_bytes"`
	// RSSBytes is the resident set size from /proc/self/statm (0 where there is none).
	RSSBytes   uint64 `json:"rss_bytes"`
	Goroutines int    `json:"goroutines"`
	GCCycles   uint64 `json:"gc_cycles"`
	// GCPercent is the GC percent in effect (GOGC; runtime.gc_heap_floor_mib raises it
	// while the process allocates fast and the live heap is small) and HeapGoalBytes the
	// heap size of the next collection.
	GCPercent     uint64 `json:"gc_percent"`
	HeapGoalBytes uint64 `json:"heap_goal_bytes"`
}

var memMetricNames = []string{
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/stacks:bytes",
	"/memory/classes/total:bytes",
	"/gc/cycles/total:gc-cycles",
	"/gc/gogc:percent",
	"/gc/heap/goal:bytes",
}

// readMemoryStats samples the runtime's metrics (no stop of the world) and the RSS.
func readMemoryStats() MemoryStats {
	s := make([]rtmetrics.Sample, len(memMetricNames))
	for i, n := range memMetricNames {
		s[i].Name = n
	}
	rtmetrics.Read(s)
	u := func(i int) uint64 {
		if s[i].Value.Kind() != rtmetrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return MemoryStats{
		HeapLiveBytes: u(0), HeapObjectsBytes: u(1), StackBytes: u(2), RuntimeTotalBytes: u(3),
		GCCycles: u(4), GCPercent: u(5), HeapGoalBytes: u(6), RSSBytes: residentBytes(), Goroutines: runtime.NumGoroutine(),
	}
}

// residentBytes is the resident set size of this process, 0 when /proc has none.
func residentBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	return parseStatmRSS(b, uint64(os.Getpagesize()))
}

// parseStatmRSS reads the second field of /proc/self/statm (resident pages) as bytes.
func parseStatmRSS(b []byte, pageSize uint64) uint64 {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	n, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return n * pageSize
}
