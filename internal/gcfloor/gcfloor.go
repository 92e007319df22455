// Package gcfloor keeps the garbage collector's heap goal at or above a floor while the
// process allocates fast: under sustained allocation it raises the GC percent so that the
// next collection starts at the floor, and it gives the percent back once the live heap
// alone reaches the floor or the allocation rate falls.
//
// Why: a node keeps its stream bytes in arenas outside the Go heap, so the heap that
// holds everything else is small (13-14 MB under a 64-writer load) while requests
// allocate fast (about 15 KB per 4 KiB append on the default engine). With the runtime's
// default percent (100) the heap goal was twice that small heap and the collector ran 16
// times a second, each cycle scanning the same live heap. Measured on the project's
// 2-vCPU VM (docs/performance.md): a floor of 64 MiB did 1.04-1.15x the appends per
// second of the default at 16 and 64 writers in alternate runs of 5 s, and 0.98-1.13x in
// the bench harness's rounds, whose spread is larger.
//
// Why only under load: a larger goal means more heap pages, and the first touch of a page
// is expensive on a virtual machine. A floor held at all times made a lone writer's
// appends take 1.6 page faults each while the heap filled (CPU per append 207-228 against
// 143-149 us). At a low allocation rate the collector is cheap anyway, so the floor
// starts when the rate between two collections reaches OnRate and ends under OffRate.
//
// The percent is adjusted after every collection (a cleanup of an object dropped each
// cycle). The goal it sets is absolute (the live heap and the GC roots at the last mark
// times the percent), so a live heap that grows fast cannot run past the floor before
// the next collection, which then sets the base percent back. A GOMEMLIMIT still bounds
// the heap as always.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// maxPercent bounds the percent the floor sets (a tiny live heap, such as right after
// start, would otherwise ask for an absurd one; the goal is the floor either way).
const maxPercent = 10000

// Default allocation rates (bytes per second) at which the floor starts and ends.
const (
	DefaultOnRate  = 128 << 20
	DefaultOffRate = 64 << 20
)

// rateSpan is the least time a rate is measured over (collections can come
// milliseconds apart).
const rateSpan = 100 * time.Millisecond

// Floor adjusts the GC percent after each collection; Stop ends it and restores the base.
type Floor struct {
	floor, onRate, offRate uint64
	base                   int

	mu         sync.Mutex
	stopped    bool
	active     bool      // the allocation rate asks for the floor
	since      time.Time // start of the current rate measurement
	sinceAlloc uint64    // bytes allocated at since
	sample     []metrics.Sample

	percent atomic.Int64 // the percent last set
}

// the runtime metrics adjust reads, in this order.
var sampleNames = []string{
	"/gc/heap/live:bytes",
	"/gc/scan/stack:bytes",
	"/gc/scan/globals:bytes",
	"/gc/heap/allocs:bytes",
}

// sentinel is allocated each cycle and dropped at once: its cleanup runs after the next
// collection. It holds a pointer so it is not a tiny allocation (those share a block, and
// a block is freed only when all of its objects are).
type sentinel struct {
	f   *Floor
	pad [2]uintptr
}

// Start keeps the heap goal at or above floor bytes while the process allocates at least
// onRate bytes a second (until the rate falls under offRate; zero rates take the
// defaults) and returns the controller. The base percent is the one in effect (GOGC, 100
// by default); the floor never lowers it, and a base of off (GOGC=off) or a floor of 0
// starts nothing (nil).
func Start(floor, onRate, offRate uint64) *Floor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if base < 0 || floor == 0 {
		return nil
	}
	if onRate == 0 {
		onRate = DefaultOnRate
	}
	if offRate == 0 || offRate > onRate {
		offRate = min(DefaultOffRate, onRate)
	}
	f := &Floor{floor: floor, onRate: onRate, offRate: offRate, base: base}
	for _, n := range sampleNames {
		f.sample = append(f.sample, metrics.Sample{Name: n})
	}
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

// percentFor is the GC percent that puts the goal at floor for a live heap of live bytes
// and roots bytes of stacks and globals (the runtime's goal is live + (live + roots) *
// percent / 100): never under base, never over maxPercent.
func percentFor(live, roots, floor uint64, base int) int {
	if live == 0 || live >= floor {
		return base
	}
	p := (floor - live) * 100 / (live + roots)
	if (floor-live)*100%(live+roots) != 0 {
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
	var v [4]uint64
	for i := range v {
		if f.sample[i].Value.Kind() != metrics.KindUint64 {
			return
		}
		v[i] = f.sample[i].Value.Uint64()
	}
	live, roots, allocs := v[0], v[1]+v[2], v[3]
	now := time.Now()
	if f.since.IsZero() {
		f.since, f.sinceAlloc = now, allocs
	}
	if d := now.Sub(f.since); d >= rateSpan {
		rate := float64(allocs-f.sinceAlloc) / d.Seconds()
		switch {
		case !f.active && rate >= float64(f.onRate):
			f.active = true
		case f.active && rate < float64(f.offRate):
			f.active = false
		}
		f.since, f.sinceAlloc = now, allocs
	}
	p := f.base
	if f.active {
		p = percentFor(live, roots, f.floor, f.base)
	}
	// Small moves are not worth a change: the goal moves with the live heap anyway.
	if old := int(f.percent.Load()); p == old || p != f.base && old != f.base && p*10 > old*9 && p*10 < old*11 {
		return
	}
	debug.SetGCPercent(p)
	f.percent.Store(int64(p))
}

// Active reports whether the allocation rate holds the floor on.
func (f *Floor) Active() bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active
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
