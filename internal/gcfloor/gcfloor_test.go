package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, roots, floor uint64
		base, want         int
	}{
		{0, 0, 64 * mib, 100, 100},              // nothing measured yet
		{64 * mib, 0, 64 * mib, 100, 100},       // at the floor: the base
		{200 * mib, 0, 64 * mib, 100, 100},      // past it: the base
		{16 * mib, 0, 64 * mib, 100, 300},       // goal 16 + 16 * 3 = 64
		{16 * mib, 8 * mib, 64 * mib, 100, 200}, // roots count: 16 + 24 * 2 = 64
		{13 * mib, 0, 64 * mib, 100, 393},       // rounded up: the goal reaches the floor
		{40 * mib, 0, 64 * mib, 100, 100},       // the base already gives more than the floor
		{40 * mib, 0, 64 * mib, 200, 200},       // a higher base is kept
		{1, 0, 64 * mib, 100, maxPercent},       // bounded
		{10 * mib, 0, 64 * mib, 50, 540},        // a lower base is raised the same way
	} {
		p := percentFor(c.live, c.roots, c.floor, c.base)
		if p != c.want {
			t.Errorf("percentFor(%d, %d, %d, %d) = %d, want %d", c.live, c.roots, c.floor, c.base, p, c.want)
		}
		if c.live > 0 && c.live < c.floor && p < maxPercent {
			if goal := c.live + (c.live+c.roots)*uint64(p)/100; goal < c.floor {
				t.Errorf("live %d, roots %d, percent %d: goal %d under the floor %d", c.live, c.roots, p, goal, c.floor)
			}
		}
	}
}

func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// waitPercent runs collections until the floor has set a percent that ok accepts (its
// adjustment runs in the cleanup goroutine after a cycle).
func waitPercent(t *testing.T, f *Floor, what string, ok func(int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(f.Percent()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: percent %d (GOGC now %d)", what, f.Percent(), debug.SetGCPercent(-1))
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFloorFollowsTheLiveHeap: with a small live heap the goal is raised to the floor;
// a live heap past the floor gets the base percent back, and Stop restores it.
func TestFloorFollowsTheLiveHeap(t *testing.T) {
	const floor = 24 << 20
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	f := Start(floor, 1, 1) // any allocation keeps it on
	if f == nil {
		t.Fatal("Start returned nil with GC on")
	}
	defer f.Stop()
	waitPercent(t, f, "small heap", func(p int) bool { return p > 100 })
	if g := heapGoal(); g < floor*9/10 {
		t.Fatalf("heap goal %d with a floor of %d (percent %d)", g, floor, f.Percent())
	}

	big := make([]byte, 2*floor) // live: the heap is past the floor
	waitPercent(t, f, "large heap", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil

	waitPercent(t, f, "small again", func(p int) bool { return p > 100 })
	f.Stop()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("after Stop GOGC is %d, want the base 100", got)
	}
	if f.Percent() != 100 {
		t.Fatalf("Percent after Stop: %d", f.Percent())
	}
}

func TestStartOffWhenGCIsOff(t *testing.T) {
	before := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(before)
	if f := Start(64<<20, 0, 0); f != nil {
		f.Stop()
		t.Fatal("Start ran with GOGC=off")
	}
	if f := Start(0, 0, 0); f != nil {
		t.Fatal("Start ran with a floor of 0")
	}
}

var sink []byte

// TestFloorFollowsTheAllocationRate: the floor stays off while the process allocates
// slowly, starts when it allocates fast, and ends when the rate falls again.
func TestFloorFollowsTheAllocationRate(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	f := Start(64<<20, 64<<20, 32<<20)
	defer f.Stop()
	// Slow: collections 120 ms apart with next to no allocation between them.
	for range 5 {
		time.Sleep(120 * time.Millisecond)
		runtime.GC()
	}
	time.Sleep(20 * time.Millisecond) // the cleanup runs after the collection
	if f.Active() || f.Percent() != 100 {
		t.Fatalf("idle: active %v, percent %d", f.Active(), f.Percent())
	}
	// Fast: 64 KiB garbage blocks as fast as we can, for up to 5 s.
	deadline := time.Now().Add(5 * time.Second)
	for !f.Active() && time.Now().Before(deadline) {
		for range 256 {
			sink = make([]byte, 64<<10)
		}
	}
	if !f.Active() {
		t.Fatal("no floor under fast allocation")
	}
	waitPercent(t, f, "fast", func(p int) bool { return p > 100 })
	// Slow again.
	deadline = time.Now().Add(5 * time.Second)
	for f.Active() && time.Now().Before(deadline) {
		time.Sleep(120 * time.Millisecond)
		runtime.GC()
	}
	time.Sleep(20 * time.Millisecond)
	if f.Active() || f.Percent() != 100 {
		t.Fatalf("slow again: active %v, percent %d", f.Active(), f.Percent())
	}
}
