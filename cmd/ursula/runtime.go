package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/ursula-go/ursula/internal/gcfloor"
	"github.com/ursula-go/ursula/internal/procs"
)

// runtimeConfig is the [runtime] section of the config file.
type runtimeConfig struct {
	// LiveReadMaxWaitersPerCore bounds the live readers (long-poll and SSE) a node holds,
	// per CPU it runs on; 0 disables the bound, absent keeps the default of 65536.
	LiveReadMaxWaitersPerCore *int64 `toml:"live_read_max_waiters_per_core"`
	// AdaptiveProcs runs the process on one P while its goroutines want about one CPU
	// and on every P once they queue for more (internal/procs). Absent: on for a node
	// without peers that does not fsync every append; off for a member of a cluster and
	// under raft.wal.fsync = "always", where it was measured slower (docs/performance.md).
	// A GOMAXPROCS environment variable turns it off: the operator chose.
	AdaptiveProcs *bool `toml:"adaptive_procs"`
	// GCHeapFloorMiB keeps the garbage collector's heap goal at or above this many MiB
	// while the live heap is smaller (internal/gcfloor): absent 64, 0 off. A GOGC
	// environment variable turns it off: the operator chose.
	GCHeapFloorMiB *int64 `toml:"gc_heap_floor_mib"`
}

// defaultGCHeapFloorMiB is the heap-goal floor without a config: about the goal that
// measured 1.15x the appends per second of the runtime's default (docs/performance.md).
const defaultGCHeapFloorMiB = 64

// gcHeapFloor is the floor in bytes (0: none), or an error for a bad value.
func (rc runtimeConfig) gcHeapFloor() (uint64, error) {
	p := rc.GCHeapFloorMiB
	switch {
	case p == nil:
		return defaultGCHeapFloorMiB << 20, nil
	case *p < 0 || *p > 1<<20:
		return 0, fmt.Errorf("runtime.gc_heap_floor_mib must be 0 (off) to %d MiB, not %d", 1<<20, *p)
	}
	return uint64(*p) << 20, nil
}

// startGCFloor starts the heap-goal floor unless the config or a GOGC environment
// variable says otherwise (nil then).
func startGCFloor(floor uint64) *gcfloor.Floor {
	if floor == 0 || os.Getenv("GOGC") != "" {
		return nil
	}
	return gcfloor.Start(floor)
}

// startProcs starts the P controller when the config and the environment let it, nil
// when they do not. byDefault is whether it runs when the config file does not say.
func (rc runtimeConfig) startProcs(byDefault bool) *procs.Controller {
	on := byDefault
	if rc.AdaptiveProcs != nil {
		on = *rc.AdaptiveProcs
	}
	if !on || os.Getenv("GOMAXPROCS") != "" {
		return nil
	}
	return procs.Start(procs.Config{})
}

// maxLiveReaders is the node-wide bound for server.Config.MaxLiveReaders: 0 for the
// server's default, negative for no bound.
func (rc runtimeConfig) maxLiveReaders() (int, error) {
	p := rc.LiveReadMaxWaitersPerCore
	switch {
	case p == nil:
		return 0, nil
	case *p < 0:
		return 0, fmt.Errorf("runtime.live_read_max_waiters_per_core must be 0 (no limit) or positive, not %d", *p)
	case *p == 0:
		return -1, nil
	}
	return int(min(*p*int64(runtime.GOMAXPROCS(0)), 1<<40)), nil
}
