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
	// while the live heap is smaller and the process allocates fast (internal/gcfloor):
	// absent 64, 0 off. A GOGC environment variable turns it off: the operator chose.
	GCHeapFloorMiB *int64 `toml:"gc_heap_floor_mib"`
	// GCHeapFloorRateMiB is the allocation rate (MiB per second, between two
	// collections) at which the floor starts; it ends under half of it. Absent 128.
	GCHeapFloorRateMiB *int64 `toml:"gc_heap_floor_rate_mib"`
}

// defaultGCHeapFloorMiB is the heap-goal floor without a config: about the goal that
// measured 1.04-1.15x the appends per second at 16 and 64 writers (docs/performance.md).
const defaultGCHeapFloorMiB = 64

// gcFloor is the [runtime] heap-goal floor: bytes (0: none) and the allocation rate in
// bytes per second that starts it.
type gcFloor struct{ floor, rate uint64 }

// gcHeapFloor reads the floor's keys, or an error for a bad value.
func (rc runtimeConfig) gcHeapFloor() (gcFloor, error) {
	g := gcFloor{floor: defaultGCHeapFloorMiB << 20, rate: gcfloor.DefaultOnRate}
	if p := rc.GCHeapFloorMiB; p != nil {
		if *p < 0 || *p > 1<<20 {
			return gcFloor{}, fmt.Errorf("runtime.gc_heap_floor_mib must be 0 (off) to %d MiB, not %d", 1<<20, *p)
		}
		g.floor = uint64(*p) << 20
	}
	if p := rc.GCHeapFloorRateMiB; p != nil {
		if *p < 1 || *p > 1<<20 {
			return gcFloor{}, fmt.Errorf("runtime.gc_heap_floor_rate_mib must be 1 to %d MiB per second, not %d", 1<<20, *p)
		}
		g.rate = uint64(*p) << 20
	}
	return g, nil
}

// start starts the heap-goal floor unless the config or a GOGC environment variable says
// otherwise (nil then).
func (g gcFloor) start() *gcfloor.Floor {
	if g.floor == 0 || os.Getenv("GOGC") != "" {
		return nil
	}
	return gcfloor.Start(g.floor, g.rate, g.rate/2)
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
