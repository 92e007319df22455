package engine

import (
	"context"
	"hash/fnv"
	"sync"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// memoryPartitions spreads streams over independent locks, as groups do in the raft engine.
const memoryPartitions = 64

// Memory keeps every stream in process memory: nothing survives a restart. It is the
// engine of tests and throwaway runs. Each of its partitions is a group for the cold tier.
type Memory struct {
	parts []*Partition
	stop  chan struct{}
	once  sync.Once
}

var (
	_ Engine = (*Memory)(nil)
	_ Groups = (*Memory)(nil)
)

// NewMemory returns an empty memory engine that sweeps expired streams every sweep.
func NewMemory(sweep time.Duration) *Memory {
	e := &Memory{stop: make(chan struct{})}
	for range memoryPartitions {
		st := streamcore.NewState()
		st.Peer = func(key string) *streamcore.State { return e.partition(key).state }
		e.parts = append(e.parts, NewPartition(st))
	}
	if sweep > 0 {
		go e.sweeper(sweep)
	}
	return e
}

func (e *Memory) partition(key string) *Partition { return e.parts[e.GroupOf(key)] }

// GroupOf implements Groups: FNV-1a 32 of the key mod the partition count.
func (e *Memory) GroupOf(key string) uint64 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return uint64(h.Sum32() % memoryPartitions)
}

// Propose implements Engine.
func (e *Memory) Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error) {
	p := e.partition(c.Key)
	p.Lock()
	if p.state.InvolvesForks(c) {
		p.Unlock()
		return e.proposeAcross(c), nil
	}
	res := p.ApplyLocked(c)
	var wake chan struct{}
	if res.Changed {
		wake = p.TakeWatcherLocked(c.Key)
	}
	p.Unlock()
	Wake(wake)
	return res, nil
}

// proposeAcross applies a command that may touch streams of other partitions (forks)
// while holding every partition's lock, taken in index order.
func (e *Memory) proposeAcross(c *streamcore.Command) streamcore.Result {
	e.lockAll()
	res := e.partition(c.Key).ApplyLocked(c)
	var wakes []chan struct{}
	for _, p := range e.parts {
		p.RecountHotLocked()
		if res.Changed {
			// A cascade may have removed other streams; wake every waiter so they re-check.
			wakes = append(wakes, p.TakeWatchersLocked()...)
		}
	}
	e.unlockAll()
	Wake(wakes...)
	return res
}

func (e *Memory) lockAll() {
	for _, p := range e.parts {
		p.Lock()
	}
}

func (e *Memory) unlockAll() {
	for i := len(e.parts) - 1; i >= 0; i-- {
		e.parts[i].Unlock()
	}
}

// View implements Engine.
func (e *Memory) View(key string, now int64, fn func(*streamcore.State, *streamcore.Stream)) {
	e.partition(key).View(key, now, fn)
}

// Watch implements Engine.
func (e *Memory) Watch(key string) <-chan struct{} { return e.partition(key).Watch(key) }

// BucketKnown implements Engine.
func (e *Memory) BucketKnown(bucket string) bool { return BucketKnownIn(e.parts, bucket) }

// BucketStreams implements BucketCounter.
func (e *Memory) BucketStreams(bucket string) int { return BucketStreamsIn(e.parts, bucket) }

// RenewRead implements Engine.
func (e *Memory) RenewRead(ctx context.Context, key string, now int64) {
	e.Propose(ctx, &streamcore.Command{Op: streamcore.OpTouch, Key: key, Now: now})
}

// Stats implements Engine.
func (e *Memory) Stats() EngineStats { return Stats("memory", e.parts) }

// Close implements Engine.
func (e *Memory) Close() error {
	e.once.Do(func() { close(e.stop) })
	return nil
}

func (e *Memory) sweeper(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.lockAll()
			for _, p := range e.parts {
				p.state.Sweep(now.UnixMilli())
			}
			for _, p := range e.parts {
				p.RecountHotLocked()
			}
			e.unlockAll()
		}
	}
}

// FlushGroups implements Groups: a single node flushes every partition.
func (e *Memory) FlushGroups() []uint64 {
	gs := make([]uint64, len(e.parts))
	for i := range gs {
		gs[i] = uint64(i)
	}
	return gs
}

// GroupHotBytes implements Groups.
func (e *Memory) GroupHotBytes(g uint64) int64 {
	if g >= uint64(len(e.parts)) {
		return 0
	}
	return e.parts[g].HotBytes()
}

// HotStreams implements Groups.
func (e *Memory) HotStreams(g uint64) []HotStream {
	if g >= uint64(len(e.parts)) {
		return nil
	}
	return e.parts[g].HotStreams(time.Now().UnixMilli())
}

// ColdRefs implements Groups.
func (e *Memory) ColdRefs(fn func(key string)) {
	for _, p := range e.parts {
		p.ColdRefs(fn)
	}
}
