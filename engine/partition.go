package engine

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ursula-go/ursula/streamcore"
)

// Partition is one independently locked part of an engine's streams: a memory-engine
// shard, or the FSM of one Raft group. It holds the streamcore.State of its streams, the
// channels of readers waiting for a change of a key, and the count of hot (unflushed)
// bytes the cold tier admits writes by. Methods named ...Locked need the caller to hold
// the lock (Lock, or RLock for reads); the others take it themselves.
type Partition struct {
	mu       sync.RWMutex
	state    *streamcore.State
	watchers map[string]chan struct{}
	hot      atomic.Int64
	hotFreed atomic.Uint64 // every fall of hot, summed (never decreases)
}

// NewPartition returns a partition holding st.
func NewPartition(st *streamcore.State) *Partition {
	return &Partition{state: st, watchers: map[string]chan struct{}{}}
}

// Lock, Unlock, RLock and RUnlock guard the state (and whatever the owner keeps with it).
func (p *Partition) Lock()    { p.mu.Lock() }
func (p *Partition) Unlock()  { p.mu.Unlock() }
func (p *Partition) RLock()   { p.mu.RLock() }
func (p *Partition) RUnlock() { p.mu.RUnlock() }

// StateLocked is the partition's state.
func (p *Partition) StateLocked() *streamcore.State { return p.state }

// ReplaceStateLocked swaps in a restored state and recounts its hot bytes.
func (p *Partition) ReplaceStateLocked(st *streamcore.State) {
	p.state = st
	p.RecountHotLocked()
}

// ApplyLocked applies c and keeps the hot count of c.Key's stream. A command that
// involves forks may change other streams: its caller then calls RecountHotLocked.
func (p *Partition) ApplyLocked(c *streamcore.Command) streamcore.Result {
	before := p.hotOfLocked(c.Key)
	res := p.state.Apply(c)
	p.addHot(p.hotOfLocked(c.Key) - before)
	return res
}

func (p *Partition) addHot(d int64) {
	p.hot.Add(d)
	if d < 0 {
		p.hotFreed.Add(uint64(-d))
	}
}

func (p *Partition) hotOfLocked(key string) int64 {
	s := p.state.Streams[key]
	if s == nil {
		return 0
	}
	return int64(s.Tail() - s.Data.Base())
}

// RecountHotLocked recomputes the hot bytes of every stream: after a restore, a sweep,
// or a command touching a fork family.
func (p *Partition) RecountHotLocked() {
	var n int64
	for _, s := range p.state.Streams {
		n += int64(s.Tail() - s.Data.Base())
	}
	if old := p.hot.Swap(n); n < old {
		p.hotFreed.Add(uint64(old - n))
	}
}

// TakeWatcherLocked removes and returns the channel of readers waiting on key (nil when
// none); the caller closes it once it released the lock.
func (p *Partition) TakeWatcherLocked(key string) chan struct{} {
	ch := p.watchers[key]
	delete(p.watchers, key)
	return ch
}

// TakeWatchersLocked removes and returns every waiting channel (a change that may have
// touched several streams: every waiter re-checks).
func (p *Partition) TakeWatchersLocked() []chan struct{} {
	out := make([]chan struct{}, 0, len(p.watchers))
	for k, ch := range p.watchers {
		out = append(out, ch)
		delete(p.watchers, k)
	}
	return out
}

// Wake closes the channels taken from watchers.
func Wake(chs ...chan struct{}) {
	for _, ch := range chs {
		if ch != nil {
			close(ch)
		}
	}
}

// View runs fn under the read lock with the state and the live stream at key.
func (p *Partition) View(key string, now int64, fn func(*streamcore.State, *streamcore.Stream)) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	fn(p.state, p.state.Live(key, now))
}

// Watch returns a channel closed at the next change of key.
func (p *Partition) Watch(key string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := p.watchers[key]
	if ch == nil {
		ch = make(chan struct{})
		p.watchers[key] = ch
	}
	return ch
}

// BucketKnown reports whether a stream of bucket was ever created here.
func (p *Partition) BucketKnown(bucket string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.state.Buckets[bucket]
}

// Count returns the number of streams and their bytes.
func (p *Partition) Count() (streams int, bytes uint64) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, s := range p.state.Streams {
		bytes += s.Tail() - s.Data.Base()
	}
	return len(p.state.Streams), bytes
}

// HotBytes is the unflushed payload of the partition's streams (O(1)).
func (p *Partition) HotBytes() int64 { return p.hot.Load() }

// HotFreed is how many hot bytes the partition has let go of so far (a cold flush, a
// trim, a delete), summed: it changes whenever HotBytes fell, however briefly it was up.
func (p *Partition) HotFreed() uint64 { return p.hotFreed.Load() }

// HotStreams lists the live streams with hot bytes at now, most hot bytes first.
func (p *Partition) HotStreams(now int64) []HotStream {
	p.mu.RLock()
	var out []HotStream
	for k, s := range p.state.Streams {
		if s.SoftDeleted || s.Tail() == s.Data.Base() || s.Expired(now) {
			continue
		}
		out = append(out, HotStream{Key: k, Incarnation: s.Incarnation, HotStart: s.Data.Base(), Tail: s.Tail()})
	}
	p.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Tail-out[i].HotStart > out[j].Tail-out[j].HotStart })
	return out
}

// ColdRefs calls fn with every cold object a stream of the partition references.
func (p *Partition) ColdRefs(fn func(key string)) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, s := range p.state.Streams {
		for _, c := range s.Chunks {
			fn(c.Key)
		}
		if s.Snapshot != nil && s.Snapshot.ColdKey != "" {
			fn(s.Snapshot.ColdKey)
		}
	}
}

// Stats sums the counts of partitions for Engine.Stats.
func Stats(name string, parts []*Partition) EngineStats {
	st := EngineStats{Engine: name}
	for _, p := range parts {
		n, b := p.Count()
		st.Streams += n
		st.Bytes += b
	}
	return st
}

// BucketStreams counts the live (not deleted) streams of bucket here: a walk of the
// partition's streams, for an optional cap checked before a create.
func (p *Partition) BucketStreams(bucket string) int {
	prefix := bucket + "/"
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := 0
	for k, s := range p.state.Streams {
		if !s.SoftDeleted && strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// BucketStreamsIn sums BucketStreams over parts.
func BucketStreamsIn(parts []*Partition, bucket string) int {
	n := 0
	for _, p := range parts {
		n += p.BucketStreams(bucket)
	}
	return n
}

// BucketKnownIn reports whether any of parts knows bucket.
func BucketKnownIn(parts []*Partition, bucket string) bool {
	for _, p := range parts {
		if p.BucketKnown(bucket) {
			return true
		}
	}
	return false
}
