package server

import (
	"context"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// memoryShards spreads streams over independent locks, as groups do in the raft engine.
const memoryShards = 64

// MemoryEngine keeps every stream in process memory: nothing survives a restart. It is the
// engine of tests and throwaway runs.
type MemoryEngine struct {
	shards [memoryShards]memShard
	stop   chan struct{}
	once   sync.Once
}

type memShard struct {
	mu       sync.RWMutex
	state    *streamcore.State
	watchers map[string]chan struct{}
	hot      atomic.Int64 // hot (unflushed) bytes of the shard's streams, for cold admission
}

// NewMemoryEngine returns an empty memory engine that sweeps expired streams every sweep.
func NewMemoryEngine(sweep time.Duration) *MemoryEngine {
	e := &MemoryEngine{stop: make(chan struct{})}
	for i := range e.shards {
		e.shards[i].state = streamcore.NewState()
		e.shards[i].state.Peer = func(key string) *streamcore.State { return e.shard(key).state }
		e.shards[i].watchers = map[string]chan struct{}{}
	}
	if sweep > 0 {
		go e.sweeper(sweep)
	}
	return e
}

func (e *MemoryEngine) shard(key string) *memShard {
	h := fnv.New32a()
	h.Write([]byte(key))
	return &e.shards[h.Sum32()%memoryShards]
}

// Propose implements Engine.
func (e *MemoryEngine) Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error) {
	sh := e.shard(c.Key)
	sh.mu.Lock()
	if sh.state.InvolvesForks(c) {
		sh.mu.Unlock()
		return e.proposeLocked(c), nil
	}
	before := sh.hotOf(c.Key)
	res := sh.state.Apply(c)
	sh.hot.Add(sh.hotOf(c.Key) - before)
	wake := sh.takeWatcher(c.Key, res.Changed)
	sh.mu.Unlock()
	if wake != nil {
		close(wake)
	}
	return res, nil
}

// proposeLocked applies a command that may touch streams of other shards (forks) while
// holding every shard's lock, taken in index order.
func (e *MemoryEngine) proposeLocked(c *streamcore.Command) streamcore.Result {
	e.lockAll()
	sh := e.shard(c.Key)
	res := sh.state.Apply(c)
	e.recountHot()
	var wakes []chan struct{}
	if res.Changed {
		// A cascade may have removed other streams; wake every waiter so they re-check.
		for i := range e.shards {
			for k, ch := range e.shards[i].watchers {
				wakes = append(wakes, ch)
				delete(e.shards[i].watchers, k)
			}
		}
	}
	e.unlockAll()
	for _, ch := range wakes {
		close(ch)
	}
	return res
}

func (e *MemoryEngine) lockAll() {
	for i := range e.shards {
		e.shards[i].mu.Lock()
	}
}

func (e *MemoryEngine) unlockAll() {
	for i := len(e.shards) - 1; i >= 0; i-- {
		e.shards[i].mu.Unlock()
	}
}

func (sh *memShard) takeWatcher(key string, changed bool) chan struct{} {
	if !changed {
		return nil
	}
	ch := sh.watchers[key]
	delete(sh.watchers, key)
	return ch
}

// View implements Engine.
func (e *MemoryEngine) View(key string, now int64, fn func(*streamcore.State, *streamcore.Stream)) {
	sh := e.shard(key)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	fn(sh.state, sh.state.Live(key, now))
}

// Watch implements Engine.
func (e *MemoryEngine) Watch(key string) <-chan struct{} {
	sh := e.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ch := sh.watchers[key]
	if ch == nil {
		ch = make(chan struct{})
		sh.watchers[key] = ch
	}
	return ch
}

// BucketKnown implements Engine.
func (e *MemoryEngine) BucketKnown(bucket string) bool {
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.RLock()
		ok := sh.state.Buckets[bucket]
		sh.mu.RUnlock()
		if ok {
			return true
		}
	}
	return false
}

// Stats implements Engine.
func (e *MemoryEngine) Stats() EngineStats {
	st := EngineStats{Engine: "memory"}
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.RLock()
		st.Streams += len(sh.state.Streams)
		for _, s := range sh.state.Streams {
			st.Bytes += s.Tail() - s.Data.Base()
		}
		sh.mu.RUnlock()
	}
	return st
}

// Close implements Engine.
func (e *MemoryEngine) Close() error {
	e.once.Do(func() { close(e.stop) })
	return nil
}

func (e *MemoryEngine) sweeper(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.lockAll()
			for i := range e.shards {
				e.shards[i].state.Sweep(now.UnixMilli())
			}
			e.recountHot()
			e.unlockAll()
		}
	}
}
