package replicator

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestReclaimAfterIdleDays (checklist-vfs N119, T17): the server forgets a producer that
// wrote nothing for 7 days, so an owner idle that long claims the stream again (the next
// epoch) before its next commit. The claim lands only where this owner left the stream:
// when nobody wrote meanwhile the commit goes through under the new epoch; when another
// writer appended during the idle time, the owner is fenced and writes nothing.
func TestReclaimAfterIdleDays(t *testing.T) {
	base := snapServer(t, nil)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}

	t.Run("nobody wrote", func(t *testing.T) {
		r, _, lb := snapAttach(t, base+"/idle/quiet", Options{now: clock.now})
		m := newModel()
		m.commit(t, r, 4, 4)
		clock.advance(producerIdle - time.Minute)
		m.commit(t, r, 4, 1)
		if ev := lb.events("reclaiming"); len(ev) != 0 || r.Status().Epoch != 1 {
			t.Fatalf("re-claimed before 7 idle days: %v, epoch %d", ev, r.Status().Epoch)
		}
		clock.advance(producerIdle)
		m.commit(t, r, 4, 1)
		if ev := lb.events("reclaiming"); len(ev) != 1 || ev[0]["level"] != "info" {
			t.Fatalf("reclaiming events: %v", ev)
		}
		if st := r.Status(); st.Epoch != 2 || st.Fenced || st.Poisoned || st.Commits != 3 {
			t.Fatalf("after the re-claim: %+v", st)
		}
	})

	t.Run("another writer wrote", func(t *testing.T) {
		url := base + "/idle/busy"
		r, _, lb := snapAttach(t, url, Options{now: clock.now})
		m := newModel()
		m.commit(t, r, 4, 4)
		before := r.Status().Offset
		// A foreign append without Stream-Seq or producer: nothing at commit time could
		// tell it from the owner's own tail but the claim's offset check.
		c, _ := client.New("")
		if _, err := c.Append(context.Background(), url, []byte("foreign"), client.AppendOptions{ContentType: "application/octet-stream"}); err != nil {
			t.Fatal(err)
		}
		clock.advance(producerIdle + time.Hour)
		err := r.Commit(context.Background(), m.next(4, 1))
		e, ok := AsError(err)
		if !ok || e.Kind != KindFenced || e.Action != ActionStop {
			t.Fatalf("commit after a foreign write during the idle time: %v", err)
		}
		if st := r.Status(); !st.Fenced || st.Offset != before {
			t.Fatalf("status after the refused re-claim: %+v", st)
		}
		if ev := lb.events("poisoned"); len(ev) != 1 || ev[0]["fenced"] != "true" || ev[0]["level"] != "error" {
			t.Fatalf("poisoned events: %v", ev)
		}
	})
}
