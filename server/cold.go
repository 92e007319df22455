package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/streamcore"
)

// The cold tier (DESIGN.md §3 "Tiers"). Appends land in the engine's hot buffers; a
// background flusher (flush.go) writes contiguous old ranges of a stream to the object
// store as chunk objects and then proposes streamcore.OpRecordChunk, which records the
// chunk and trims the hot range, so every replica reaches the same state. Reads plan over
// both tiers under the engine's View and fetch cold ranges afterwards, outside any lock
// (cold_read.go). Snapshot bodies of at least storage.cold.snapshot_min_size are stored as
// objects. A collector (cold_gc.go) deletes objects nothing references any more after a
// grace period, never one a read in flight has pinned.
//
// Object keys (all under storage.cold.root, then the s3 prefix for the s3 backend):
//
//	{cluster}/{bucket}/{h}-{stream}/{incarnation}/c/{start:020d}-{end:020d}-{random}  chunk: bytes [start, end)
//	{cluster}/{bucket}/{h}-{stream}/{incarnation}/s/{offset:020d}-{random}    snapshot body
//	{cluster}/__parts/{bucket}/{h}-{stream}/{incarnation}/{part id}          staged snapshot part
//
// {bucket} and {stream} are path-escaped ('/' in compat stream names becomes %2F), the
// stream name is cut to 120 bytes, and {h} is the first 16 hex digits of SHA-256(key), so
// keys stay unique and below S3's 1024-byte limit. No bucket id starts with "__", so the
// parts tree never meets a bucket's. The key of every object is recorded in
// the replicated state: readers never derive keys, so a naming change never strands data.

// ColdEngine is what the cold tier needs of an engine beyond Engine. A "group" is a unit
// of hot accounting and admission: a Raft group, or a shard of the memory engine.
type ColdEngine interface {
	// ColdGroups lists the groups whose streams this node may flush (for a replicated
	// engine: the groups it leads).
	ColdGroups() []int
	// GroupOf returns the group of a stream key.
	GroupOf(key string) int
	// GroupHotBytes is the group's unflushed payload (cheap: called on every append).
	GroupHotBytes(g int) int64
	// HotStreams lists the streams of group g with hot bytes, most hot bytes first.
	HotStreams(g int) []HotStream
	// ColdRefs calls fn with the key of every object any stream references.
	ColdRefs(fn func(key string))
}

// ColdEngineProvider is implemented by an engine that offers its ColdEngine as a separate
// value (the raft engine, whose own GroupOf has another signature).
type ColdEngineProvider interface {
	ColdEngine() ColdEngine
}

// ColdCollectorGate is implemented by a replicated engine's ColdEngine. The collector then
// runs only where ColdCollectHere says (one node at a time, a leader), and deletes an
// object only after every voter named by ColdPeers answered that none of its replicas
// references or pins it (POST /__ursula/cold-refs, cold_gc.go).
type ColdCollectorGate interface {
	ColdCollectHere() bool
	ColdPeers() []string // HTTP base URLs of the other voters
}

// HotStream is a stream with unflushed bytes [HotStart, Tail).
type HotStream struct {
	Key         string
	Incarnation uint64
	HotStart    uint64
	Tail        uint64
}

// ColdOptions tune the cold tier beyond the config file (tests).
type ColdOptions struct {
	BackoffMax time.Duration // cap of the flusher's doubling backoff (default 30s)
	// Bounds of snapshot upload in parts (defaults: 1 GiB, 8192 parts, 2 GiB).
	MaxSnapshotBytes int64
	MaxStagedParts   int
	MaxStagedBytes   int64
}

// HdrColdHotStart is the diagnostic HEAD header naming the first offset still in the hot
// tier (sent only with a cold store).
const HdrColdHotStart = "Stream-Cold-Hot-Start-Offset"

// CodeColdBackpressure and CodeColdStoreFailed are the cold tier's error codes.
const (
	CodeColdBackpressure = "COLD_BACKPRESSURE"
	CodeColdStoreFailed  = "COLD_STORE_FAILED"
)

// coldTier is the running cold tier of a server.
type coldTier struct {
	store  coldstore.Store
	cfg    coldstore.Config
	opts   ColdOptions
	eng    ColdEngine
	root   string // "{root}/{cluster}/"
	cache  *coldCache
	pinsMu sync.Mutex
	pins   map[string]int
	stop   chan struct{}
	ctx    context.Context // canceled by StopCold: ends uploads in flight
	cancel context.CancelFunc
	flush  sync.Mutex // one flush pass at a time
	// hotMarks (under flush): per stream, since when its hot start has not moved.
	hotMarks map[string]hotMark
	wg       sync.WaitGroup
	once     sync.Once

	flushedBytes   atomic.Uint64
	flushedObjects atomic.Uint64
	flushErrors    atomic.Uint64
	backpressure   atomic.Uint64
	coldReadBytes  atomic.Uint64
	gcDeleted      atomic.Uint64
	backoffUntil   atomic.Int64 // unix nanos; flusher sleeps until then after a failure
	parts          partsLedger  // snapshot upload in parts (cold_parts.go)
}

// EnableCold attaches a cold store to the server and starts the flusher and the
// collector. The engine must implement ColdEngine.
func (s *Server) EnableCold(store coldstore.Store, cfg coldstore.Config, opts ColdOptions) error {
	if store == nil {
		return nil
	}
	ce, ok := s.engine.(ColdEngine)
	if p, isP := s.engine.(ColdEngineProvider); !ok && isP {
		ce, ok = p.ColdEngine(), true
	}
	if !ok {
		return fmt.Errorf("the %s engine does not support the cold tier yet; set storage.cold.backend = \"none\"", s.engine.Stats().Engine)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 30 * time.Second
	}
	root := strings.Trim(cfg.Root, "/")
	if root != "" {
		root += "/"
	}
	if err := checkFormatMarker(store, root); err != nil {
		return err
	}
	c := &coldTier{store: store, cfg: cfg, opts: opts, eng: ce, root: root + s.cfg.ClusterID + "/",
		cache: newColdCache(int64(cfg.CacheSize)), pins: map[string]int{}, stop: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	s.cold = c
	c.wg.Add(2)
	go func() { defer c.wg.Done(); s.flushLoop(c) }()
	go func() { defer c.wg.Done(); c.gcLoop() }()
	return nil
}

// StopCold stops the flusher and the collector and waits for them.
func (s *Server) StopCold() {
	if c := s.cold; c != nil {
		c.once.Do(func() { close(c.stop); c.cancel() })
		c.wg.Wait()
	}
}

// ColdStats are the cold tier's counters (admin metrics and tests).
type ColdStats struct {
	Backend             string `json:"backend"`
	FlushedBytes        uint64 `json:"cold_flushed_bytes"`
	FlushedObjects      uint64 `json:"cold_flushed_objects"`
	FlushWriteErrors    uint64 `json:"cold_flush_write_errors"`
	BackpressureEvents  uint64 `json:"cold_backpressure_events"`
	ColdReadBytes       uint64 `json:"cold_read_bytes"`
	GCDeletedObjects    uint64 `json:"cold_gc_deleted_objects"`
	CacheBytes          int64  `json:"cold_cache_bytes"`
	HotBytes            int64  `json:"cold_hot_bytes"`
	MaxGroupHotBytes    int64  `json:"cold_max_group_hot_bytes"`
	MaxHotSizePerGroup  int64  `json:"cold_max_hot_size_per_group"`
	PinnedObjectsInRead int    `json:"cold_pinned_objects"`
	StagedPartBytes     int64  `json:"cold_staged_part_bytes"`
	PartsStaged         uint64 `json:"cold_parts_staged"`
	PartsCommitted      uint64 `json:"cold_parts_commits"`
}

// ColdStats reports the cold tier's counters (zero when there is none).
func (s *Server) ColdStats() ColdStats {
	c := s.cold
	if c == nil {
		return ColdStats{Backend: "none"}
	}
	st := ColdStats{Backend: c.store.Name(), FlushedBytes: c.flushedBytes.Load(), FlushedObjects: c.flushedObjects.Load(),
		FlushWriteErrors: c.flushErrors.Load(), BackpressureEvents: c.backpressure.Load(), ColdReadBytes: c.coldReadBytes.Load(),
		GCDeletedObjects: c.gcDeleted.Load(), CacheBytes: c.cache.size(), MaxHotSizePerGroup: c.cfg.HotCap()}
	for _, g := range c.eng.ColdGroups() {
		h := c.eng.GroupHotBytes(g)
		st.HotBytes += h
		st.MaxGroupHotBytes = max(st.MaxGroupHotBytes, h)
	}
	st.StagedPartBytes, st.PartsStaged, st.PartsCommitted = c.parts.stagedBytes(), c.parts.staged.Load(), c.parts.committed.Load()
	c.pinsMu.Lock()
	st.PinnedObjectsInRead = len(c.pins)
	c.pinsMu.Unlock()
	return st
}

// streamDir is the key prefix of one stream incarnation's objects.
func (c *coldTier) streamDir(key string, inc uint64) string {
	return fmt.Sprintf("%s%s%d/", c.root, streamPath(key), inc)
}

// streamPath is "{bucket}/{h}-{stream}/": the part of an object key naming the stream.
func streamPath(key string) string {
	bucket, stream, _ := strings.Cut(key, "/")
	sum := sha256.Sum256([]byte(key))
	es := url.PathEscape(stream)
	if len(es) > 120 {
		es = es[:120]
		for strings.HasSuffix(es, "%") || len(es) > 1 && es[len(es)-2] == '%' { // never cut an escape
			es = es[:len(es)-1]
		}
	}
	return fmt.Sprintf("%s/%s-%s/", url.PathEscape(bucket), hex.EncodeToString(sum[:8]), es)
}

// chunkKey names a new chunk object. The random suffix makes every upload a new object, so
// a retried or concurrent upload of the same range (a failed record, two nodes flushing
// around a leader change) never overwrites an object the collector may be deleting.
func (c *coldTier) chunkKey(key string, inc, start, end uint64) string {
	var r [4]byte
	rand.Read(r[:])
	return fmt.Sprintf("%sc/%020d-%020d-%s", c.streamDir(key, inc), start, end, hex.EncodeToString(r[:]))
}

func (c *coldTier) snapshotKey(key string, inc, off uint64) string {
	var r [8]byte
	rand.Read(r[:])
	return fmt.Sprintf("%ss/%020d-%s", c.streamDir(key, inc), off, hex.EncodeToString(r[:]))
}

// pin marks objects as needed by a read in flight; the collector never deletes a pinned
// object. Every pin is matched by an unpin.
func (c *coldTier) pin(keys ...string) {
	c.pinsMu.Lock()
	for _, k := range keys {
		c.pins[k]++
	}
	c.pinsMu.Unlock()
}

func (c *coldTier) unpin(keys ...string) {
	c.pinsMu.Lock()
	for _, k := range keys {
		if c.pins[k]--; c.pins[k] <= 0 {
			delete(c.pins, k)
		}
	}
	c.pinsMu.Unlock()
}

func (c *coldTier) pinned(key string) bool {
	c.pinsMu.Lock()
	defer c.pinsMu.Unlock()
	return c.pins[key] > 0
}

// coldAdmit refuses a write with a body while the stream's group holds more hot bytes
// than storage.cold.max_hot_size_per_group, before anything is proposed (so the answer
// is marked x-ursula-not-applied: ColdBackpressure). Nodes never send the vouch
// (x-ursula-not-applied-checked): only a gateway does.
func (s *Server) coldAdmit(key string, bodyLen int) *streamcore.Error {
	c := s.cold
	if c == nil || bodyLen == 0 {
		return nil
	}
	limit := c.cfg.HotCap()
	if limit <= 0 {
		return nil
	}
	if c.eng.GroupHotBytes(c.eng.GroupOf(key)) < limit {
		return nil
	}
	// A replicated engine's follower holds the same hot bytes as the leader: it answers
	// the redirect (or no-leader 503) first, as it would without the cold tier.
	if lv, ok := s.engine.(LeaderVerifier); ok {
		if e := leaderError(lv.LeaderHint(key), true); e != nil {
			return e
		}
	}
	c.backpressure.Add(1)
	return streamcore.Errorf(http.StatusServiceUnavailable, CodeColdBackpressure, "the stream's group holds more unflushed bytes than storage.cold.max_hot_size_per_group; retry once the cold flush catches up").
		With(streamcore.HdrRetryAfter, "1").With(streamcore.HdrNotApplied, "ColdBackpressure")
}

func coldStoreFailed(err error) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadGateway, CodeColdStoreFailed, "the cold store failed: %s", shortErr(err))
}

func shortErr(err error) string {
	m := err.Error()
	if len(m) > 200 {
		m = m[:200]
	}
	return m
}

func coldCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// coldProm adds the cold tier's metrics to the Prometheus text.
func coldProm(c *ColdStats, gauge, counter func(name, help string, v any)) {
	gauge("ursula_cold_hot_bytes", "Unflushed (hot) payload bytes over all groups.", c.HotBytes)
	gauge("ursula_cold_max_group_hot_bytes", "Hot bytes of the fullest group.", c.MaxGroupHotBytes)
	gauge("ursula_cold_cache_bytes", "Bytes in the cold read cache.", c.CacheBytes)
	counter("ursula_cold_flushed_bytes_total", "Bytes flushed to the cold store.", c.FlushedBytes)
	counter("ursula_cold_flushed_objects_total", "Chunk objects flushed to the cold store.", c.FlushedObjects)
	counter("ursula_cold_flush_write_errors_total", "Failed chunk uploads.", c.FlushWriteErrors)
	counter("ursula_cold_backpressure_events_total", "Writes refused with ColdBackpressure.", c.BackpressureEvents)
	counter("ursula_cold_read_bytes_total", "Bytes read from the cold tier.", c.ColdReadBytes)
	counter("ursula_cold_gc_deleted_objects_total", "Objects deleted by the cold collector.", c.GCDeletedObjects)
	gauge("ursula_cold_staged_part_bytes", "Bytes of staged snapshot parts this node counts (streams it leads).", c.StagedPartBytes)
	counter("ursula_cold_parts_staged_total", "Snapshot parts staged on this node.", c.PartsStaged)
	counter("ursula_cold_parts_commits_total", "Snapshots published from parts by this node.", c.PartsCommitted)
}

// handleFlushCold serves POST /__ursula/flush-cold/{bucket}/{stream}: flush every hot
// byte of one stream now. The answer is {"hot_start_offset": "..."}.
func (s *Server) handleFlushCold(w http.ResponseWriter, r *http.Request, raw string) {
	if r.Method != http.MethodPost {
		s.methodNotAllowed(w, r, "POST")
		return
	}
	segs, e := splitPath(strings.TrimPrefix(raw, "/__ursula/flush-cold"))
	if e == nil && len(segs) != 2 {
		e = streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "use /__ursula/flush-cold/{bucket}/{stream}")
	}
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if s.cold == nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotImplemented, streamcore.CodeNoColdStore, "this server has no cold store"))
		return
	}
	key := segs[0] + "/" + segs[1]
	// Only the leader of the stream's group flushes it (its record goes through Raft).
	if lv, ok := s.engine.(LeaderVerifier); ok {
		if e := leaderError(lv.LeaderHint(key), false); e != nil {
			drainBody(r)
			s.writeError(w, r, e)
			return
		}
	}
	var hotStart uint64
	found := false
	s.engine.View(key, s.now(), func(_ *streamcore.State, str *streamcore.Stream) {
		found = str != nil
	})
	if !found {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeStreamNotFound, "stream does not exist"))
		return
	}
	if err := s.flushOnce(s.cold, true, key); err != nil {
		s.writeError(w, r, coldStoreFailed(err))
		return
	}
	s.engine.View(key, s.now(), func(_ *streamcore.State, str *streamcore.Stream) {
		if str != nil {
			hotStart = str.Data.Base()
		}
	})
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"hot_start_offset":%q}`, streamcore.FormatOffset(hotStart))
}

// FormatMarker is the object at the cold root that claims the prefix for this format;
// FormatEpoch is its content.
const (
	FormatMarker = "URSULA_FORMAT_EPOCH"
	FormatEpoch  = "ursula-go-1\n"
)

// checkFormatMarker refuses a cold root that holds objects but no marker (another
// application's, or another format's), or a marker of another epoch; on an empty root it
// writes the marker.
func checkFormatMarker(store coldstore.Store, root string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	where := store.Name() + " cold root " + strconvQuote(root)
	b, err := coldstore.ReadAll(ctx, store, root+FormatMarker, 0, -1)
	switch {
	case err == nil:
		if string(b) != FormatEpoch {
			return fmt.Errorf("object storage %s is format epoch %q, this build writes %q: use a new storage.cold.root", where, strings.TrimSpace(string(b)), strings.TrimSpace(FormatEpoch))
		}
		return nil
	case !errors.Is(err, coldstore.ErrNotFound):
		return fmt.Errorf("object storage %s: reading the %s marker: %w", where, FormatMarker, err)
	}
	other := ""
	if err := store.List(ctx, root, func(o coldstore.ObjectInfo) bool { other = o.Key; return false }); err != nil {
		return fmt.Errorf("object storage %s: %w", where, err)
	}
	if other == root+FormatMarker {
		// Another node of the cluster wrote the marker meanwhile (nodes sharing a store
		// start together): check it like one that was there.
		return checkFormatMarker(store, root)
	}
	if other != "" {
		return fmt.Errorf("object storage %s is not empty and has no %s marker (found %s): point storage.cold.root at an empty prefix used only by this cluster", where, FormatMarker, other)
	}
	return store.Put(ctx, root+FormatMarker, strings.NewReader(FormatEpoch), int64(len(FormatEpoch)))
}

func strconvQuote(s string) string { return strconv.Quote(s) }
