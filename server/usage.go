package server

// Per-bucket usage: counters of what this node answered (appends, bytes in, bytes out)
// and gauges of what the engine's local state holds (streams, retained bytes) and what
// the cold tier stages (snapshot parts), served as JSON at GET /__ursula/usage on the
// admin plane.

import (
	"maps"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/ursula-go/ursula/engine"
)

// usageMeter counts per bucket. The counters live in this process: they start at zero
// when the node starts and survive the deletion and the purge of the bucket's streams.
type usageMeter struct {
	mu      sync.Mutex
	buckets map[string]*bucketCounters
}

type bucketCounters struct {
	appends  atomic.Uint64 // committed writes that added bytes (create with body, append)
	bytesIn  atomic.Uint64 // their stored bytes
	bytesOut atomic.Uint64 // body bytes of successful reads
}

func (m *usageMeter) of(bucket string) *bucketCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buckets == nil {
		m.buckets = map[string]*bucketCounters{}
	}
	c := m.buckets[bucket]
	if c == nil {
		c = &bucketCounters{}
		m.buckets[bucket] = c
	}
	return c
}

// wrote counts a committed write of n new bytes.
func (m *usageMeter) wrote(bucket string, n int) {
	c := m.of(bucket)
	c.appends.Add(1)
	c.bytesIn.Add(uint64(n))
}

// read counts the body bytes of a successful read answer.
func (m *usageMeter) read(bucket string, n int64) {
	if n > 0 {
		m.of(bucket).bytesOut.Add(uint64(n))
	}
}

func (m *usageMeter) snapshot() map[string]*bucketCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.buckets)
}

// BucketUsage is one bucket of GET /__ursula/usage.
type BucketUsage struct {
	Appends         uint64 `json:"appends"`
	BytesIn         uint64 `json:"bytes_in"`
	BytesOut        uint64 `json:"bytes_out"`
	RetainedBytes   uint64 `json:"retained_bytes"`
	Streams         int    `json:"stream_count"`
	StagedPartBytes int64  `json:"staged_part_bytes"`
	Erased          bool   `json:"erased,omitempty"`
}

// Usage is the document of GET /__ursula/usage.
type Usage struct {
	Version int                    `json:"version"`
	Buckets map[string]BucketUsage `json:"buckets"`
}

// usageVersion is the version of the usage document; a new meaning of a field gets a
// new version.
const usageVersion = 1

// Usage reports the per-bucket usage this node knows.
func (s *Server) Usage() Usage {
	out := Usage{Version: usageVersion, Buckets: map[string]BucketUsage{}}
	for b, c := range s.usage.snapshot() {
		out.Buckets[b] = BucketUsage{Appends: c.appends.Load(), BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load()}
	}
	if src, ok := s.engine.(engine.UsageSource); ok {
		for b, g := range src.BucketUsage() {
			u := out.Buckets[b]
			u.RetainedBytes, u.Streams, u.Erased = g.RetainedBytes, g.Streams, g.Erased
			out.Buckets[b] = u
		}
	}
	for b, n := range s.cold.StagedBytesByBucket() {
		u := out.Buckets[b]
		u.StagedPartBytes = n
		out.Buckets[b] = u
	}
	return out
}

func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.methodNotAllowed(w, r, "GET, HEAD")
		return
	}
	writeJSON(w, s.Usage())
}
