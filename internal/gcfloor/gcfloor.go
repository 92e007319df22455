// Package gcfloor keeps the garbage collector's heap goal at or above a floor: while the
// live heap is small, it raises the GC percent so that the next collection starts at the
// floor, and it gives the percent back once the live heap alone reaches the floor.
//
// Why: a node keeps its stream bytes in arenas outside the Go heap, so the heap that
// holds everything else is small (13-14 MB under a 64-writer load) while requests
// allocate fast (about 15 KB per 4 KiB append on the default engine). With the runtime's
// default percent (100) the heap goal was twice that small heap and the collector ran 16
// times a second, each cycle scanning the same live heap. Measured on the project's
// 2-vCPU VM (docs/performance.md): GOGC=500, about the goal a 64 MiB floor gives, did
// 1.15x the appends per second of the default at 64 writers (median of 7 pairs, old and
// new alternately).
//
// The floor costs memory only under allocation: an idle node allocates nothing, and a
// node whose live heap is past the floor runs at the base percent, so large heaps keep
// their usual headroom. A GOMEMLIMIT still bounds the heap as always. The percent is
// adjusted after every collection (a cleanup of an object dropped each cycle), so a live
// heap that grows fast gets the base percent back within one cycle.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// maxPercent bounds the percent the floor sets (a tiny live heap, such as right after
// start, would otherwise ask for an absurd one; the goal is the floor either way).
const maxPercent = 10000

// Floor adjusts the GC percent after each collection; Stop ends it and restores the base.
type Floor struct {
	floor   uint64
	base    int
	mu      sync.Mutex
	stopped bool
	percent atomic.Int64 // the percent last set
	sample  []metrics.Sample
}

// sentinel is allocated each cycle and dropped at once: its cleanup runs after the next
// collection. It holds a pointer so it is not a tiny allocation (those share a block, and
// a block is freed only when all of its objects are).
type sentinel struct {
	f   *Floor
	pad [2]uintptr
}

// Start keeps the heap goal at or above floor bytes and returns the controller. The base
// percent is the one in effect (GOGC, 100 by default); the floor never lowers it, and a
// base of off (GOGC=off) starts nothing (nil).
func Start(floor uint64) *Floor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if base < 0 || floor == 0 {
		return nil
	}
	f := &Floor{floor: floor, base: base, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	f.percent.Store(int64(base))
	f.adjust()
	f.arm()
	return f
}

func (f *Floor) arm() {
	runtime.AddCleanup(&sentinel{f: f}, func(f *Floor) {
		f.mu.Lock()
		stopped := f.stopped
		f.mu.Unlock()
		if stopped {
			return
		}
		f.adjust()
		f.arm()
	}, f)
}

// percentFor is the GC percent that puts the goal at floor for a live heap of live bytes:
// never under base, never over maxPercent.
func percentFor(live, floor uint64, base int) int {
	if live == 0 || live >= floor {
		return base
	}
	p := (floor - live) * 100 / live
	if (floor-live)*100%live != 0 {
		p++
	}
	return int(min(max(p, uint64(base)), maxPercent))
}

func (f *Floor) adjust() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	metrics.Read(f.sample)
	if f.sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	p := percentFor(f.sample[0].Value.Uint64(), f.floor, f.base)
	// Small moves are not worth a change: the goal moves with the live heap anyway.
	if old := int(f.percent.Load()); p == old || p != f.base && old != f.base && p*10 > old*9 && p*10 < old*11 {
		return
	}
	debug.SetGCPercent(p)
	f.percent.Store(int64(p))
}

// Percent is the GC percent the floor set last (the base when it set none).
func (f *Floor) Percent() int {
	if f == nil {
		return 0
	}
	return int(f.percent.Load())
}

// Stop ends the adjustments and restores the base percent.
func (f *Floor) Stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.base)
	f.percent.Store(int64(f.base))
}
