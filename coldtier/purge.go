package coldtier

import (
	"context"
	"net/url"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/streamcore"
)

// Bucket purge: once the engine removed a bucket's streams, its objects (chunks,
// snapshot bodies, staged parts) are referenced by no state and the collector would
// delete them after storage.cold.gc_grace. The purge does not wait: the bucket is fenced,
// so no new read can plan on its objects, and the collector's other rules still hold
// (an object a read in flight pins, or another voter's replica still references, stays).

// PurgeReport is what the cold part of a bucket purge did.
type PurgeReport struct {
	Deleted   int   // objects deleted now
	Remaining int   // objects still under the bucket's prefixes afterwards
	Err       error // the store or a voter failed: a repeat of the purge retries
}

// bucketPrefixes are the key prefixes of every object of bucket: its streams' objects
// and its staged parts.
func (c *Tier) bucketPrefixes(bucket string) []string {
	b := url.PathEscape(bucket) + "/"
	return []string{c.root + b, c.root + partsDirName + b}
}

// PurgeBucket deletes the objects of bucket that no state references, after the engine
// purged it; removed are the streams the purge took (their staged-part counts are
// forgotten). Without a tier it reports nothing to do.
func (c *Tier) PurgeBucket(ctx context.Context, bucket string, removed []streamcore.PurgedStream) PurgeReport {
	if c == nil {
		return PurgeReport{}
	}
	var rep PurgeReport
	var listed []string
	for _, p := range c.bucketPrefixes(bucket) {
		if err := c.store.List(ctx, p, func(o coldstore.ObjectInfo) bool {
			listed = append(listed, o.Key)
			return true
		}); err != nil {
			rep.Err = err
			return rep
		}
	}
	refs := map[string]bool{}
	c.eng.ColdRefs(func(k string) { refs[k] = true })
	var due []string
	for _, k := range listed {
		if !refs[k] && !c.pinned(k) {
			due = append(due, k)
		}
	}
	if c.peers != nil && len(due) > 0 {
		needed, err := c.peers.PeersColdRefs(ctx, due)
		if err != nil {
			rep.Err = err
			due = nil
		}
		kept := due[:0]
		for _, k := range due {
			if !needed[k] {
				kept = append(kept, k)
			}
		}
		due = kept
	}
	for _, k := range due {
		if c.pinned(k) {
			continue
		}
		if err := c.store.Delete(ctx, k); err != nil {
			rep.Err = err
			continue
		}
		c.gcDeleted.Add(1)
		rep.Deleted++
	}
	now := time.Now()
	for _, s := range removed {
		c.setCounts(s.Key, nil, now)
	}
	for _, p := range c.bucketPrefixes(bucket) {
		if err := c.store.List(ctx, p, func(coldstore.ObjectInfo) bool {
			rep.Remaining++
			return true
		}); err != nil && rep.Err == nil {
			rep.Err = err
		}
	}
	return rep
}

// StagedBytesByBucket sums the staged part bytes the node knows of per bucket.
func (c *Tier) StagedBytesByBucket() map[string]int64 {
	out := map[string]int64{}
	if c == nil {
		return out
	}
	c.parts.mu.Lock()
	defer c.parts.mu.Unlock()
	for k, sp := range c.parts.streams {
		if sp.bytes > 0 {
			out[streamcore.BucketOf(k)] += sp.bytes
		}
	}
	return out
}
