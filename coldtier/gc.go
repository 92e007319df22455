package coldtier

import (
	"context"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
)

// The collector: every storage.cold.gc_interval it lists the cluster's objects and
// compares them with the objects the engine's streams reference (chunks, snapshot
// bodies). An object nobody references (below retention, of a deleted stream, a
// superseded snapshot body, an upload whose record was refused) is deleted once it has
// been seen unreferenced for storage.cold.gc_grace (default 5 minutes), and never while a
// read in flight has it pinned. Upload in progress are pinned by the flusher.
//
// Replicated engines (engine.ColdPeers): the collector runs on one node at a time (the
// raft engine: the leader of group 0, while its replicas have applied what they know to
// be committed); its references are those of every local replica, led or followed. Before
// deleting, it asks every other voter, through the engine, which candidates one of its
// replicas references or one of its reads or uploads pins; a candidate any voter
// still needs is kept, and when a voter does not answer nothing is deleted in that pass.
// So no object is deleted while any reachable replica references it, and an unreachable
// voter stops collection. A node that stops being the collector forgets its marks.

func (c *Tier) gcLoop() {
	t := time.NewTicker(c.cfg.GCInterval.D())
	defer t.Stop()
	unref := map[string]time.Time{}
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if c.peers != nil && !c.peers.CollectHere() {
			clear(unref)
			continue
		}
		c.collect(unref, time.Now())
	}
}

// collect runs one pass; unref remembers since when each object was seen unreferenced.
func (c *Tier) collect(unref map[string]time.Time, now time.Time) {
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
	var due []string
	partsSwept := false
	for _, o := range listed {
		k := o.Key
		seen[k] = true
		if c.isPart(k) {
			// Staged snapshot parts are referenced by no state: a part no commit used
			// goes once it is older than storage.cold.parts_grace.
			if now.Sub(o.ModTime) >= c.cfg.PartsGrace.D() && !c.pinned(k) {
				due = append(due, k)
				partsSwept = true
			}
			continue
		}
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
			due = append(due, k)
		}
	}
	for k := range unref {
		if !seen[k] {
			delete(unref, k)
		}
	}
	if c.peers != nil && len(due) > 0 {
		needed, err := c.peers.PeersColdRefs(ctx, due)
		if err != nil {
			return // a voter did not answer: delete nothing this pass
		}
		kept := due[:0]
		for _, k := range due {
			if needed[k] {
				delete(unref, k)
			} else {
				kept = append(kept, k)
			}
		}
		due = kept
	}
	if partsSwept {
		defer c.parts.relistAll()
	}
	for _, k := range due {
		if c.pinned(k) {
			continue
		}
		if c.store.Delete(ctx, k) == nil {
			c.gcDeleted.Add(1)
			delete(unref, k)
		}
	}
}
