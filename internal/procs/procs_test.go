package procs

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	cfg := Config{Max: 4}.withDefaults() // Up 12, Down 7, Hold 5
	cases := []struct {
		name string
		in   state
		mean float64
		want state
	}{
		{"one P, light load stays", state{procs: 1}, 3, state{procs: 1}},
		{"one P, just under Up stays", state{procs: 1}, 11.9, state{procs: 1}},
		{"one P, queueing takes every P", state{procs: 1}, 12, state{procs: 4}},
		{"another count under Up goes to one", state{procs: 2}, 5, state{procs: 1}},
		{"another count at Up goes to Max", state{procs: 3}, 20, state{procs: 4}},
		{"Max, busy stays and forgets low windows", state{procs: 4, low: 3}, 7, state{procs: 4}},
		{"Max, first low window", state{procs: 4}, 6.9, state{procs: 4, low: 1}},
		{"Max, low windows count", state{procs: 4, low: 3}, 1, state{procs: 4, low: 4}},
		{"Max, Hold low windows give the Ps back", state{procs: 4, low: 4}, 0, state{procs: 1}},
	}
	for _, c := range cases {
		if got := decide(cfg, c.in, c.mean); got != c.want {
			t.Errorf("%s: decide(%+v, %v) = %+v, want %+v", c.name, c.in, c.mean, got, c.want)
		}
	}
}

// FuzzDecide: whatever the means, the P count is 1 or Max; one P moves to Max only at Up
// or more; Max returns to one P only after Hold windows in a row under Down.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(2), []byte{0, 200, 3, 3, 3, 3, 3, 100})
	f.Add(uint8(8), []byte{50, 1, 1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, max uint8, means []byte) {
		cfg := Config{Max: int(max%16) + 2}.withDefaults()
		s := state{procs: cfg.Max}
		lowRun := 0
		for _, m := range means {
			mean := float64(m) / 4
			next := decide(cfg, s, mean)
			if next.procs != 1 && next.procs != cfg.Max {
				t.Fatalf("procs %d, want 1 or %d", next.procs, cfg.Max)
			}
			if next.low < 0 || next.low >= cfg.Hold {
				t.Fatalf("low %d out of [0, %d)", next.low, cfg.Hold)
			}
			if s.procs == 1 && (next.procs == cfg.Max) != (mean >= cfg.Up) {
				t.Fatalf("at one P, mean %v gave %d Ps", mean, next.procs)
			}
			if s.procs == cfg.Max {
				if mean < cfg.Down {
					lowRun++
				} else {
					lowRun = 0
				}
				if (next.procs == 1) != (lowRun >= cfg.Hold) {
					t.Fatalf("at Max after %d low windows (mean %v), gave %d Ps", lowRun, mean, next.procs)
				}
			}
			if next.procs == 1 {
				lowRun = 0
			}
			s = next
		}
	})
}

// TestControllerFollowsTheLoad runs a controller on this process: idle, it gives the Ps
// back; with goroutines queueing for the CPU it takes every P again; Stop leaves Max.
func TestControllerFollowsTheLoad(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(orig)
	runtime.GOMAXPROCS(2)
	before := Changes()
	c := Start(Config{Max: 2, Sample: time.Millisecond, Window: 5, Hold: 2})
	if c == nil {
		t.Fatal("Start with Max 2 returned no controller")
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	waitFor := func(what string, procs int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if c.Procs() == procs && runtime.GOMAXPROCS(0) == procs {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s: GOMAXPROCS %d (controller %d), want %d", what, runtime.GOMAXPROCS(0), c.Procs(), procs)
	}
	waitFor("idle", 1)

	// 64 goroutines that want the CPU: far over Up at one P.
	var quit atomic.Bool
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for !quit.Load() {
				for i := range 10000 {
					x += i
				}
				runtime.Gosched()
			}
			_ = x
		}()
	}
	waitFor("loaded", 2)
	quit.Store(true)
	wg.Wait()
	waitFor("idle again", 1)
	if n := Changes() - before; n < 3 {
		t.Fatalf("changes %d, want at least 3 (down, up, down)", n)
	}
	c.Stop()
	stopped = true
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("after Stop GOMAXPROCS %d, want Max 2", got)
	}
}

func TestStartWithOneP(t *testing.T) {
	if c := Start(Config{Max: 1}); c != nil {
		c.Stop()
		t.Fatal("a controller with Max 1 has nothing to choose")
	}
	var c *Controller
	c.Stop() // nil: no-op
}
