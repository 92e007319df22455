package server

// Cold reads under a budget: a read that starts in the cold tier assembles at most
// Limits.ColdReadBytes of it (a short read; Stream-Next-Offset says where to go on), and
// the cold bytes that all readers hold until their clients have taken them are charged
// to one node-wide budget, Limits.InflightColdReadBytes. Readers that do not read thus
// pin a bounded amount of memory, however many there are.

import (
	"net/http"
	"sync"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// CodeColdReadBackpressure refuses a read of cold bytes while the node holds as many
// cold bytes for readers as it admits.
const CodeColdReadBackpressure = "COLD_READ_BACKPRESSURE"

// coldReadWait is how long a cold read waits for room in the budget before it is refused:
// long enough to ride out a burst of fast readers, short next to a client's timeout.
const coldReadWait = time.Second

// coldBudget counts the cold bytes readers hold, against a limit.
type coldBudget struct {
	limit int64
	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed (and replaced) whenever bytes are given back
}

func newColdBudget(limit int64) *coldBudget {
	return &coldBudget{limit: limit, freed: make(chan struct{})}
}

// take charges n bytes, waiting up to wait for room. A read larger than the whole budget
// is let through when nothing else is held, so it is never starved for good.
func (b *coldBudget) take(n int64, wait time.Duration) bool {
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used+n <= b.limit || b.used == 0 {
			b.used += n
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return true
		}
		freed := b.freed
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-freed:
		case <-timer.C:
			return false
		}
	}
}

// force charges n bytes whatever the budget says (the rest of a message already begun).
func (b *coldBudget) force(n int64) {
	b.mu.Lock()
	b.used += n
	b.mu.Unlock()
}

func (b *coldBudget) give(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

func (b *coldBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

func coldReadRefusal() *streamcore.Error {
	return streamcore.Errorf(http.StatusServiceUnavailable, CodeColdReadBackpressure, "the node holds as many cold-tier bytes for readers as it admits").
		With(streamcore.HdrRetryAfter, "1")
}

// done gives back the cold bytes v held, once its answer was written (or dropped). Safe
// on nil and more than once.
func (s *Server) done(v *view) {
	if v != nil && v.coldHeld > 0 {
		s.coldReads.give(v.coldHeld)
		v.coldHeld = 0
	}
}
