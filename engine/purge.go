package engine

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/ursula-go/ursula/streamcore"
)

// Purger is implemented by engines that can erase a bucket (tenant offboarding): they
// apply streamcore.OpPurgeBucket to every one of their groups, so every stream of the
// bucket goes and the bucket is fenced everywhere its streams could live.
type Purger interface {
	// PurgeBucket purges bucket in every group. It is idempotent: a repeat, or a retry
	// after an error (ErrNoLeader when a group has no leader), completes what is left.
	PurgeBucket(ctx context.Context, bucket string, now int64) (PurgeReport, error)
}

// PurgeReport is what a purge did.
type PurgeReport struct {
	Removed []streamcore.PurgedStream // the streams this purge removed
	Groups  []uint64                  // the groups that held some of them, ascending
	// HeldByForks counts the bucket's streams that stay, deleted and unreachable, because
	// a fork in another bucket still reads through them.
	HeldByForks int
}

// add merges one group's answer.
func (r *PurgeReport) add(g uint64, removed []streamcore.PurgedStream, held int) {
	r.Removed = append(r.Removed, removed...)
	if len(removed) > 0 && !slices.Contains(r.Groups, g) {
		r.Groups = append(r.Groups, g)
		slices.Sort(r.Groups)
	}
	r.HeldByForks += held
}

// AddGroup merges one group's answer into r (for replicated engines).
func (r *PurgeReport) AddGroup(g uint64, removed []streamcore.PurgedStream, held int) {
	r.add(g, removed, held)
}

var _ Purger = (*Memory)(nil)

// PurgeBucket implements Purger: every partition applies the purge, under every lock (a
// fork family may span partitions).
func (e *Memory) PurgeBucket(_ context.Context, bucket string, now int64) (PurgeReport, error) {
	e.lockAll()
	// Streams removed through a fork cascade may live in another partition than the one
	// applying: compare the bucket's streams before and after instead of summing answers.
	type where struct {
		g   uint64
		inc uint64
	}
	before := map[string]where{}
	prefix := bucket + "/"
	for i, p := range e.parts {
		for k, s := range p.state.Streams {
			if strings.HasPrefix(k, prefix) {
				before[k] = where{uint64(i), s.Incarnation}
			}
		}
	}
	var rep PurgeReport
	var failed *streamcore.Error
	for _, p := range e.parts {
		if res := p.state.Apply(&streamcore.Command{Op: streamcore.OpPurgeBucket, Key: bucket, Now: now}); res.Err != nil {
			failed = res.Err
		}
	}
	var wakes []chan struct{}
	for _, p := range e.parts {
		p.RecountHotLocked()
		wakes = append(wakes, p.TakeWatchersLocked()...)
		rep.HeldByForks += p.state.HeldByForks(bucket)
	}
	for _, k := range slices.Sorted(maps.Keys(before)) {
		w := before[k]
		if e.parts[w.g].state.Streams[k] == nil {
			rep.add(w.g, []streamcore.PurgedStream{{Key: k, Incarnation: w.inc}}, 0)
		}
	}
	e.unlockAll()
	Wake(wakes...)
	if failed != nil {
		return PurgeReport{}, failed
	}
	return rep, nil
}

// BucketGauge is the current state of one bucket in an engine's local replicas.
type BucketGauge struct {
	Streams       int    // live streams (deleted ones a fork holds are not counted)
	RetainedBytes uint64 // bytes the bucket's streams keep, hot and cold, above retention
	Erased        bool   // the bucket was purged
}

// UsageSource is implemented by engines that report per-bucket gauges from their local
// state (a replicated engine: every local replica, led or followed).
type UsageSource interface {
	BucketUsage() map[string]BucketGauge
}

// BucketUsageOf sums the gauges of parts per bucket.
func BucketUsageOf(parts []*Partition) map[string]BucketGauge {
	out := map[string]BucketGauge{}
	for _, p := range parts {
		p.mu.RLock()
		for k, s := range p.state.Streams {
			b := streamcore.BucketOf(k)
			g := out[b]
			g.RetainedBytes += s.Tail() - s.Retained
			if !s.SoftDeleted {
				g.Streams++
			}
			out[b] = g
		}
		for b, ok := range p.state.Erased {
			if ok {
				g := out[b]
				g.Erased = true
				out[b] = g
			}
		}
		p.mu.RUnlock()
	}
	return out
}

var _ UsageSource = (*Memory)(nil)

// BucketUsage implements UsageSource.
func (e *Memory) BucketUsage() map[string]BucketGauge { return BucketUsageOf(e.parts) }
