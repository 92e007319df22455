package lazy

import (
	"container/list"
	"sync"
)

// cacheKey names a cached unit: a decoded snapshot frame (off: the snapshot's offset, n:
// the frame) or one page of a commit record (off: the record's offset, n: the page).
type cacheKey struct {
	kind uint8
	off  uint64
	n    uint32
}

const (
	fromFrame  uint8 = 1
	fromCommit uint8 = 2
)

// pageCache is an LRU of cached units, bounded by their bytes.
type pageCache struct {
	mu           sync.Mutex
	limit, bytes int64
	order        *list.List // front: most recently used
	items        map[cacheKey]*list.Element
	hits, misses int64
}

type cacheEntry struct {
	key  cacheKey
	data []byte
}

func newPageCache(limit int64) *pageCache {
	return &pageCache{limit: limit, order: list.New(), items: map[cacheKey]*list.Element{}}
}

// get returns a unit and counts a hit or a miss.
func (c *pageCache) get(k cacheKey) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[k]
	if !ok {
		c.misses++
		return nil, false
	}
	c.hits++
	c.order.MoveToFront(e)
	return e.Value.(*cacheEntry).data, true
}

// peek returns a unit without counting.
func (c *pageCache) peek(k cacheKey) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[k]; ok {
		c.order.MoveToFront(e)
		return e.Value.(*cacheEntry).data, true
	}
	return nil, false
}

// put caches a unit (its own copy) and evicts the least recently used past the limit.
func (c *pageCache) put(k cacheKey, data []byte) {
	if int64(len(data)) > c.limit {
		return
	}
	c.putOwned(k, append([]byte(nil), data...))
}

// putOwned caches data itself, which the caller no longer modifies.
func (c *pageCache) putOwned(k cacheKey, data []byte) {
	if int64(len(data)) > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[k]; ok {
		c.bytes -= int64(len(e.Value.(*cacheEntry).data))
		e.Value.(*cacheEntry).data = data
		c.order.MoveToFront(e)
	} else {
		c.items[k] = c.order.PushFront(&cacheEntry{key: k, data: data})
	}
	c.bytes += int64(len(data))
	for c.bytes > c.limit {
		e := c.order.Back()
		ce := e.Value.(*cacheEntry)
		c.order.Remove(e)
		delete(c.items, ce.key)
		c.bytes -= int64(len(ce.data))
	}
}

func (c *pageCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	clear(c.items)
	c.bytes = 0
}

func (c *pageCache) stats() (hits, misses, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.bytes
}
