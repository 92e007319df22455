package server

import (
	"context"
	"time"

	"github.com/ursula-go/ursula/server/coldstore"
)

// The collector: every storage.cold.gc_interval it lists the cluster's objects and
// compares them with the objects the engine's streams reference (chunks, snapshot
// bodies). An object nobody references (below retention, of a deleted stream, a
// superseded snapshot body, an upload whose record was refused) is deleted once it has
// been seen unreferenced for storage.cold.gc_grace (default 5 minutes), and never while a
// read in flight has it pinned. Upload in progress are pinned by the flusher.
//
// Not done yet: with the raft engine only a group's leader may collect, and only objects
// of the groups it leads (ColdRefs covers the local state only); that split is left to
// the raft engine's ColdEngine implementation.

func (c *coldTier) gcLoop() {
	t := time.NewTicker(c.cfg.GCInterval.D())
	defer t.Stop()
	unref := map[string]time.Time{}
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.collect(unref, time.Now())
	}
}

// collect runs one pass; unref remembers since when each object was seen unreferenced.
func (c *coldTier) collect(unref map[string]time.Time, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var listed []coldstore.ObjectInfo
	if err := c.store.List(ctx, c.root, func(o coldstore.ObjectInfo) bool {
		listed = append(listed, o)
		return true
	}); err != nil {
		return
	}
	// References are taken after the listing: an object recorded meanwhile is referenced.
	refs := map[string]bool{}
	c.eng.ColdRefs(func(k string) { refs[k] = true })
	seen := make(map[string]bool, len(listed))
	for _, o := range listed {
		k := o.Key
		seen[k] = true
		if refs[k] || c.pinned(k) {
			delete(unref, k)
			continue
		}
		since, ok := unref[k]
		if !ok {
			unref[k] = now
			continue
		}
		if now.Sub(since) >= c.cfg.GCGrace.D() {
			if c.store.Delete(ctx, k) == nil {
				c.gcDeleted.Add(1)
				delete(unref, k)
			}
		}
	}
	for k := range unref {
		if !seen[k] {
			delete(unref, k)
		}
	}
}
