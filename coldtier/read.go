package coldtier

import (
	"container/list"
	"context"
	"fmt"
	"runtime"
	"sync"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/streamcore"
)

// ReadPlan is the cold part of a read: the bytes [from, to) lie in chunks, taken under
// the engine's View and pinned until Fetch or Release.
type ReadPlan struct {
	from   uint64
	to     uint64
	chunks []streamcore.ColdChunk
}

// Plan is called inside the engine's View by a read of [start, end) of str. When the read
// begins below the hot buffer it returns the plan of the cold bytes [start, min(end,
// hot start)); the rest of the window is hot. nil: the whole window is hot (or no tier).
func (c *Tier) Plan(str *streamcore.Stream, start, end uint64) *ReadPlan {
	base := str.Data.Base()
	if c == nil || start >= base || end <= start {
		return nil
	}
	to := min(end, base)
	p := &ReadPlan{from: start, to: to, chunks: append([]streamcore.ColdChunk(nil), str.ColdChunksFor(start, to)...)}
	for _, ch := range p.chunks {
		c.Pin(ch.Key)
	}
	return p
}

// Size is the number of cold bytes the plan reads.
func (p *ReadPlan) Size() uint64 { return p.to - p.from }

// Fetch reads the planned cold bytes (outside any lock) and releases the plan. The parts
// are the cold cache's own blocks, not copies: readers of the same range share them, so
// a reader that is slow to take its answer pins no private copy. They must not be
// written to.
func (c *Tier) Fetch(p *ReadPlan) ([][]byte, *streamcore.Error) {
	defer c.Release(p)
	ctx, cancel := coldCtx()
	defer cancel()
	cold, err := c.readChunks(ctx, p.chunks, p.from, p.to)
	if err != nil {
		return nil, coldStoreFailed(err)
	}
	return cold, nil
}

// Release unpins a plan that will not be fetched.
func (c *Tier) Release(p *ReadPlan) {
	for _, ch := range p.chunks {
		c.Unpin(ch.Key)
	}
}

// readChunks returns the stream bytes [from, to) held by chunks, as slices of cached blocks.
func (c *Tier) readChunks(ctx context.Context, chunks []streamcore.ColdChunk, from, to uint64) ([][]byte, error) {
	var out [][]byte
	pos := from
	for _, ch := range chunks {
		if pos >= to {
			break
		}
		if ch.Start > pos || ch.End <= pos {
			return nil, fmt.Errorf("cold chunks do not cover offset %d", pos)
		}
		end := min(to, ch.End)
		var err error
		out, err = c.readObject(ctx, out, ch.Key, int64(ch.End-ch.Start), int64(pos-ch.Start), int64(end-pos))
		if err != nil {
			return nil, err
		}
		pos = end
	}
	if pos < to {
		return nil, fmt.Errorf("cold chunks end at %d, before %d", pos, to)
	}
	c.coldReadBytes.Add(to - from)
	return out, nil
}

// ReadRange reads the bytes [from, to) of incarnation inc of the stream at key from
// whichever tiers hold them.
func (c *Tier) ReadRange(key string, inc, from, to uint64) ([]byte, *streamcore.Error) {
	var hot [][]byte
	var pin any
	var p *ReadPlan
	var e *streamcore.Error
	c.eng.View(key, clockMs(), func(st *streamcore.State, str *streamcore.Stream) {
		if str == nil || str.Incarnation != inc || from < str.Retained || to > str.Tail() {
			e = streamcore.Errorf(409, streamcore.CodeStreamGone, "stream changed during the read")
			return
		}
		p = c.Plan(str, from, to)
		lo := from
		if p != nil {
			lo = p.to
		}
		if lo < to {
			hot, pin = str.Data.Slices(lo, to), str.Data.Pin()
		}
	})
	if e != nil {
		return nil, e
	}
	out := make([]byte, 0, to-from)
	if p != nil {
		cold, e := c.Fetch(p)
		if e != nil {
			return nil, e
		}
		for _, part := range cold {
			out = append(out, part...)
		}
	}
	for _, h := range hot {
		out = append(out, h...)
	}
	runtime.KeepAlive(pin)
	return out, nil
}

// CheckBoundary settles, for a command at offset c.Offset of key, whether that offset,
// below the hot buffer of a JSON stream, is a message boundary, by reading the byte
// before it from the cold tier. The answer goes into the command (BoundaryChecked or
// BoundaryRefuted), since apply cannot read the store; a failed read sets neither, and
// apply answers 503 JSON_BOUNDARY_UNVERIFIED. Without a tier it sets neither.
func (c *Tier) CheckBoundary(key string, cmd *streamcore.Command) {
	cmd.BoundaryChecked, cmd.BoundaryRefuted = false, false
	if c == nil || cmd.Offset == 0 {
		return
	}
	off := cmd.Offset
	var inc uint64
	need := false
	c.eng.View(key, clockMs(), func(_ *streamcore.State, str *streamcore.Stream) {
		if str != nil && str.IsJSON() && off > str.Retained && off <= str.Data.Base() && off <= str.Tail() {
			inc, need = str.Incarnation, true
		}
	})
	if !need {
		return
	}
	b, e := c.ReadRange(key, inc, off-1, off)
	if e != nil || len(b) != 1 {
		return
	}
	cmd.BoundaryChecked, cmd.BoundaryRefuted = b[0] == '\n', b[0] != '\n'
}

// DropCache forgets every cached block (tests that take the store away).
func (c *Tier) DropCache() { c.cache.clear() }

// coldBlock is the granule of the cold read cache.
const coldBlock = 1 << 20

// blockID names a cache block. The object size is part of it: a fork's reference to a
// chunk that straddles its fork point is cut at the fork point, so the same object can
// be read with two sizes, and a short last block must never serve the longer reading.
type blockID struct {
	key  string
	size int64
	idx  int64
}

type cacheEntry struct {
	id   blockID
	data []byte
}

// coldCache is an LRU of recently read blocks of cold objects (objects never change).
type coldCache struct {
	mu   sync.Mutex
	cap  int64
	used int64
	ll   *list.List
	m    map[blockID]*list.Element
}

func newColdCache(capacity int64) *coldCache {
	return &coldCache{cap: capacity, ll: list.New(), m: map[blockID]*list.Element{}}
}

func (cc *coldCache) clear() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.ll.Init()
	clear(cc.m)
	cc.used = 0
}

func (cc *coldCache) size() int64 {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.used
}

func (cc *coldCache) get(id blockID) []byte {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if el := cc.m[id]; el != nil {
		cc.ll.MoveToFront(el)
		return el.Value.(*cacheEntry).data
	}
	return nil
}

func (cc *coldCache) put(id blockID, data []byte) {
	if int64(len(data)) > cc.cap {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if el := cc.m[id]; el != nil {
		cc.ll.MoveToFront(el)
		return
	}
	cc.m[id] = cc.ll.PushFront(&cacheEntry{id: id, data: data})
	cc.used += int64(len(data))
	for cc.used > cc.cap {
		el := cc.ll.Back()
		ent := el.Value.(*cacheEntry)
		cc.ll.Remove(el)
		delete(cc.m, ent.id)
		cc.used -= int64(len(ent.data))
	}
}

// readObject appends the bytes [off, off+n) of an object of size objSize to dst, as
// slices of blocks, through the cache: missing blocks are fetched with one range GET per
// contiguous run.
func (c *Tier) readObject(ctx context.Context, dst [][]byte, key string, objSize, off, n int64) ([][]byte, error) {
	if n <= 0 {
		return dst, nil
	}
	b0, b1 := off/coldBlock, (off+n-1)/coldBlock
	blocks := make([][]byte, b1-b0+1)
	for i := b0; i <= b1; {
		if blocks[i-b0] = c.cache.get(blockID{key, objSize, i}); blocks[i-b0] != nil {
			i++
			continue
		}
		j := i
		for j+1 <= b1 && c.cache.get(blockID{key, objSize, j + 1}) == nil {
			j++
		}
		lo, hi := i*coldBlock, min((j+1)*coldBlock, objSize)
		data, err := coldstore.ReadAll(ctx, c.store, key, lo, hi-lo)
		if err != nil {
			return nil, err
		}
		if int64(len(data)) != hi-lo {
			return nil, fmt.Errorf("cold object %s is shorter than recorded (%d bytes at %d, want %d)", key, len(data), lo, hi-lo)
		}
		for k := i; k <= j; k++ {
			blk := data[(k-i)*coldBlock : min((k-i+1)*coldBlock, int64(len(data)))]
			blk = blk[:len(blk):len(blk)]
			blocks[k-b0] = blk
			c.cache.put(blockID{key, objSize, k}, blk)
		}
		i = j + 1
	}
	for i, blk := range blocks {
		start := (b0 + int64(i)) * coldBlock
		lo := max(off-start, 0)
		hi := min(off+n-start, int64(len(blk)))
		if lo < hi {
			dst = append(dst, blk[lo:hi:hi])
		}
	}
	return dst, nil
}
