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
		live, floor uint64
		base, want  int
	}{
		{0, 64 * mib, 100, 100},         // nothing measured yet
		{64 * mib, 64 * mib, 100, 100},  // at the floor: the base
		{200 * mib, 64 * mib, 100, 100}, // past it: the base
		{16 * mib, 64 * mib, 100, 300},  // goal 16 * 4 = 64
		{13 * mib, 64 * mib, 100, 393},  // rounded up: the goal reaches the floor
		{40 * mib, 64 * mib, 100, 100},  // the base already gives more than the floor
		{40 * mib, 64 * mib, 200, 200},  // a higher base is kept
		{1, 64 * mib, 100, maxPercent},  // bounded
		{10 * mib, 64 * mib, 50, 540},   // a lower base is raised the same way
	} {
		if got := percentFor(c.live, c.floor, c.base); got != c.want {
			t.Errorf("percentFor(%d, %d, %d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
		}
		if p := percentFor(c.live, c.floor, c.base); c.live > 0 && c.live < c.floor && p < maxPercent {
			if goal := c.live * uint64(100+p) / 100; goal < c.floor {
				t.Errorf("live %d, percent %d: goal %d under the floor %d", c.live, p, goal, c.floor)
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
	f := Start(floor)
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
	if f := Start(64 << 20); f != nil {
		f.Stop()
		t.Fatal("Start ran with GOGC=off")
	}
	if f := Start(0); f != nil {
		t.Fatal("Start ran with a floor of 0")
	}
}
