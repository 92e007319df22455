// Package procs sizes the Go scheduler to the load: the process runs on one P (GOMAXPROCS
// 1) while its goroutines want about one CPU, and on every P once they queue for more.
//
// Why: on a small virtual machine most of a request's time at low concurrency went to
// handing work between processors. Every goroutine made ready (net/http's read of the
// next request, the Raft loops, an SSE writer) while a P sat idle woke an OS thread on the
// other vCPU, which spun, stole it and ran it there. Measured on the project's 2-vCPU VM
// (docs/performance.md): with one P, a single writer's append p50 fell from 142-159 to
// 108-115 us on the default engine and the server's CPU per append by a third, and up to
// 8 concurrent writers went faster too; from 16 writers on, two Ps win (64 writers: 1.3x).
//
// The controller samples the scheduler every Sample (10 ms): the goroutines running and
// the goroutines runnable but waiting for a P (runtime/metrics), less the sampler itself.
// That demand reads the same whatever the P count, because a goroutine that waits for a P
// is counted as runnable. Over each Window of samples it takes the mean: at one P, a mean
// of at least Up goroutines takes every P at once; at every P, Hold windows in a row under
// Down give the extra Ps back. Between Down and Up the setting stays as it is, so a load at
// the boundary does not flap.
package procs

import (
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Config tunes a Controller; zero fields take the defaults.
type Config struct {
	Max    int           // the P count under load (default: runtime.GOMAXPROCS(0) at Start)
	Sample time.Duration // time between samples (default 10 ms)
	Window int           // samples per decision (default 10)
	Up     float64       // mean demand at one P that takes Max Ps (default 12)
	Down   float64       // mean demand at Max Ps that counts as low (under it; default 7)
	Hold   int           // low windows in a row that return to one P (default 5)
}

func (c Config) withDefaults() Config {
	if c.Max <= 0 {
		c.Max = runtime.GOMAXPROCS(0)
	}
	if c.Sample <= 0 {
		c.Sample = 10 * time.Millisecond
	}
	if c.Window <= 0 {
		c.Window = 10
	}
	if c.Up <= 0 {
		c.Up = 12
	}
	if c.Down <= 0 {
		c.Down = 7
	}
	if c.Hold <= 0 {
		c.Hold = 5
	}
	return c
}

// changes counts every controller's changes of GOMAXPROCS in this process (the setting is
// the process's, so is its count).
var changes atomic.Uint64

// Changes is how many times a controller changed GOMAXPROCS in this process: a count that
// climbs fast means a load at the boundary (metrics: ursula_gomaxprocs_changes_total).
func Changes() uint64 { return changes.Load() }

// Controller sets GOMAXPROCS to 1 or Config.Max as the load asks.
type Controller struct {
	cfg   Config
	procs atomic.Int64
	stop  chan struct{}
	done  chan struct{}
}

// Start runs a controller until Stop. With a Max of 1 there is nothing to choose, and it
// returns nil.
func Start(cfg Config) *Controller {
	cfg = cfg.withDefaults()
	if cfg.Max <= 1 {
		return nil
	}
	c := &Controller{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	c.procs.Store(int64(runtime.GOMAXPROCS(0)))
	go c.run()
	return c
}

// Procs is the P count the controller set last.
func (c *Controller) Procs() int { return int(c.procs.Load()) }

// Stop ends the controller and gives the process its Max Ps back.
func (c *Controller) Stop() {
	if c == nil {
		return
	}
	close(c.stop)
	<-c.done
}

func (c *Controller) run() {
	defer close(c.done)
	samples := []metrics.Sample{
		{Name: "/sched/goroutines/running:goroutines"},
		{Name: "/sched/goroutines/runnable:goroutines"},
	}
	t := time.NewTicker(c.cfg.Sample)
	defer t.Stop()
	var s state
	var sum float64
	n := 0
	for {
		select {
		case <-c.stop:
			c.set(c.cfg.Max)
			return
		case <-t.C:
		}
		metrics.Read(samples)
		sum += demand(samples[0].Value, samples[1].Value)
		if n++; n < c.cfg.Window {
			continue
		}
		s.procs = c.Procs()
		s = decide(c.cfg, s, sum/float64(n))
		sum, n = 0, 0
		c.set(s.procs)
	}
}

// demand is the goroutines that want a P at a sample, the sampler not counted.
func demand(running, runnable metrics.Value) float64 {
	d := float64(valueOf(running)) + float64(valueOf(runnable)) - 1
	return max(d, 0)
}

func valueOf(v metrics.Value) uint64 {
	if v.Kind() != metrics.KindUint64 {
		return 0 // a runtime without the metric: no demand seen, the setting stays
	}
	return v.Uint64()
}

func (c *Controller) set(p int) {
	if int(c.procs.Load()) == p {
		return
	}
	runtime.GOMAXPROCS(p)
	c.procs.Store(int64(p))
	changes.Add(1)
}

// state is what a decision carries to the next: the P count and how many windows in a
// row stayed under Down at Max.
type state struct {
	procs int
	low   int
}

// decide is one window's decision from its mean demand.
func decide(cfg Config, s state, mean float64) state {
	if s.procs < cfg.Max {
		if mean >= cfg.Up {
			return state{procs: cfg.Max}
		}
		return state{procs: 1}
	}
	if mean >= cfg.Down {
		return state{procs: cfg.Max}
	}
	if s.low+1 >= cfg.Hold {
		return state{procs: 1}
	}
	return state{procs: cfg.Max, low: s.low + 1}
}
