package engine_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// TestHotFreedCountsEveryFall: HotFreed sums each fall of the hot bytes, so a watcher that
// only looks now and then still learns that bytes came and went between two looks (the
// disk watch's trim, diskwatch.go), while HotBytes alone shows nothing changed.
func TestHotFreedCountsEveryFall(t *testing.T) {
	p := engine.NewPartition(streamcore.NewState())
	apply := func(c *streamcore.Command, want int) {
		t.Helper()
		c.Now = time.Now().UnixMilli()
		p.Lock()
		res := p.ApplyLocked(c)
		p.Unlock()
		if res.Err != nil || res.Status != want {
			t.Fatalf("%v: %d %v", c.Op, res.Status, res.Err)
		}
	}
	create := func(key string) *streamcore.Command {
		return &streamcore.Command{Op: streamcore.OpCreate, Key: key, ContentType: "application/octet-stream", TTL: -1, NewIncarnation: 1}
	}
	apply(create("bkt1/a"), http.StatusCreated)
	apply(&streamcore.Command{Op: streamcore.OpAppend, Key: "bkt1/a", ContentType: "application/octet-stream", Body: make([]byte, 1000)}, http.StatusNoContent)
	if p.HotBytes() != 1000 || p.HotFreed() != 0 {
		t.Fatalf("after an append: hot %d, freed %d", p.HotBytes(), p.HotFreed())
	}
	apply(&streamcore.Command{Op: streamcore.OpDelete, Key: "bkt1/a"}, http.StatusNoContent)
	if p.HotBytes() != 0 || p.HotFreed() != 1000 {
		t.Fatalf("after the delete: hot %d, freed %d", p.HotBytes(), p.HotFreed())
	}
	// Up and down again between two looks: HotBytes is where it was, HotFreed moved on.
	apply(create("bkt1/b"), http.StatusCreated)
	apply(&streamcore.Command{Op: streamcore.OpAppend, Key: "bkt1/b", ContentType: "application/octet-stream", Body: make([]byte, 500)}, http.StatusNoContent)
	apply(&streamcore.Command{Op: streamcore.OpDelete, Key: "bkt1/b"}, http.StatusNoContent)
	if p.HotBytes() != 0 || p.HotFreed() != 1500 {
		t.Fatalf("after the second stream came and went: hot %d, freed %d", p.HotBytes(), p.HotFreed())
	}
	// A recount that finds fewer bytes (a sweep, a restore) counts its fall too.
	apply(create("bkt1/c"), http.StatusCreated)
	apply(&streamcore.Command{Op: streamcore.OpAppend, Key: "bkt1/c", ContentType: "application/octet-stream", Body: make([]byte, 300)}, http.StatusNoContent)
	p.Lock()
	p.ReplaceStateLocked(streamcore.NewState())
	p.Unlock()
	if p.HotBytes() != 0 || p.HotFreed() != 1800 {
		t.Fatalf("after a restore to an empty state: hot %d, freed %d", p.HotBytes(), p.HotFreed())
	}
}
