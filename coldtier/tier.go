package coldtier

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Engine is what the tier needs of the engine: propose its own commands (chunk records,
// publishes of assembled snapshots), view streams, and the groups' hot accounting and
// references. An engine that also implements engine.LeaderVerifier has its followers
// refuse flushes and stagings; one that implements engine.ColdPeers runs the collector
// where it says and asks the other voters before deleting.
type Engine interface {
	Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error)
	View(key string, now int64, fn func(*streamcore.State, *streamcore.Stream))
	engine.Groups
}

// Options tune the tier beyond the config file.
type Options struct {
	BackoffMax time.Duration // cap of the flusher's doubling backoff (default 30s)
	// Bounds of snapshot upload in parts (defaults: 1 GiB, 8192 parts, 2 GiB).
	MaxSnapshotBytes int64
	MaxStagedParts   int
	MaxStagedBytes   int64
	Logger           *slog.Logger
}

// HdrColdHotStart is the diagnostic HEAD header naming the first offset still in the hot
// tier (sent only with a cold store).
const HdrColdHotStart = "Stream-Cold-Hot-Start-Offset"

// CodeColdBackpressure and CodeColdStoreFailed are the cold tier's error codes.
const (
	CodeColdBackpressure = "COLD_BACKPRESSURE"
	CodeColdStoreFailed  = "COLD_STORE_FAILED"
)

// Tier is a running cold tier. A nil *Tier is the absent tier: its methods that a server
// calls on every request answer as if every byte were hot.
type Tier struct {
	store  coldstore.Store
	cfg    coldstore.Config
	opts   Options
	eng    Engine
	leader engine.LeaderVerifier // nil on an engine without leaders
	peers  engine.ColdPeers      // nil on a single-node engine
	root   string                // "{root}/{cluster}/"
	cache  *coldCache
	pinsMu sync.Mutex
	pins   map[string]int
	stop   chan struct{}
	ctx    context.Context // canceled by StopCold: ends uploads in flight
	cancel context.CancelFunc
	flush  sync.Mutex // one flush pass at a time
	// kick wakes the flusher before its next tick: a write found its group holding at
	// least flush_size hot bytes (one piece's worth). Capacity 1: kicks while a pass
	// runs collapse into one more pass.
	kick chan struct{}
	// passDone is closed at the end of every flush pass (and replaced): writes waiting
	// for their group to fall under the hot cap look again then.
	passMu   sync.Mutex
	passDone chan struct{}
	// hotMarks (under flush): per stream, since when its hot start has not moved.
	hotMarks map[string]hotMark
	wg       sync.WaitGroup
	once     sync.Once

	flushedBytes   atomic.Uint64
	flushedObjects atomic.Uint64
	flushErrors    atomic.Uint64
	backpressure   atomic.Uint64
	heldWrites     atomic.Uint64 // writes that waited for a flush (backpressure_wait)
	heldNanos      atomic.Uint64 // their time waiting, refused or not
	coldReadBytes  atomic.Uint64
	gcDeleted      atomic.Uint64
	backoffUntil   atomic.Int64 // unix nanos; flusher sleeps until then after a failure
	parts          partsLedger  // snapshot upload in parts (parts.go)
}

// Open starts the cold tier of a cluster over an object store: the flusher and the
// collector. It refuses a store whose root holds another format's objects.
func Open(eng Engine, store coldstore.Store, cfg coldstore.Config, clusterID string, opts Options) (*Tier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	root := strings.Trim(cfg.Root, "/")
	if root != "" {
		root += "/"
	}
	if err := checkFormatMarker(store, root); err != nil {
		return nil, err
	}
	c := &Tier{store: store, cfg: cfg, opts: opts, eng: eng, root: root + clusterID + "/",
		cache: newColdCache(int64(cfg.CacheSize)), pins: map[string]int{}, stop: make(chan struct{}), kick: make(chan struct{}, 1),
		passDone: make(chan struct{})}
	c.leader, _ = eng.(engine.LeaderVerifier)
	if c.peers, _ = eng.(engine.ColdPeers); c.peers != nil {
		c.peers.SetColdPins(c.pinned)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.flushLoop() }()
	go func() { defer c.wg.Done(); c.gcLoop() }()
	return c, nil
}

// Close stops the flusher and the collector and waits for them.
func (c *Tier) Close() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		close(c.stop)
		c.cancel()
		if c.peers != nil {
			c.peers.SetColdPins(nil)
		}
	})
	c.wg.Wait()
}

// Stats are the cold tier's counters (admin metrics and tests).
type Stats struct {
	Backend             string  `json:"backend"`
	FlushedBytes        uint64  `json:"cold_flushed_bytes"`
	FlushedObjects      uint64  `json:"cold_flushed_objects"`
	FlushWriteErrors    uint64  `json:"cold_flush_write_errors"`
	BackpressureEvents  uint64  `json:"cold_backpressure_events"`
	BackpressureHeld    uint64  `json:"cold_backpressure_held"`         // writes over the cap that waited for a flush
	BackpressureHeldSec float64 `json:"cold_backpressure_held_seconds"` // their total wait
	ColdReadBytes       uint64  `json:"cold_read_bytes"`
	GCDeletedObjects    uint64  `json:"cold_gc_deleted_objects"`
	CacheBytes          int64   `json:"cold_cache_bytes"`
	HotBytes            int64   `json:"cold_hot_bytes"`
	MaxGroupHotBytes    int64   `json:"cold_max_group_hot_bytes"`
	MaxHotSizePerGroup  int64   `json:"cold_max_hot_size_per_group"`
	PinnedObjectsInRead int     `json:"cold_pinned_objects"`
	StagedPartBytes     int64   `json:"cold_staged_part_bytes"`
	PartsStaged         uint64  `json:"cold_parts_staged"`
	PartsCommitted      uint64  `json:"cold_parts_commits"`
}

// Stats reports the cold tier's counters (backend "none" without a tier).
func (c *Tier) Stats() Stats {
	if c == nil {
		return Stats{Backend: "none"}
	}
	st := Stats{Backend: c.store.Name(), FlushedBytes: c.flushedBytes.Load(), FlushedObjects: c.flushedObjects.Load(),
		FlushWriteErrors: c.flushErrors.Load(), BackpressureEvents: c.backpressure.Load(),
		BackpressureHeld: c.heldWrites.Load(), BackpressureHeldSec: time.Duration(c.heldNanos.Load()).Seconds(), ColdReadBytes: c.coldReadBytes.Load(),
		GCDeletedObjects: c.gcDeleted.Load(), CacheBytes: c.cache.size(), MaxHotSizePerGroup: c.cfg.HotCap()}
	for _, g := range c.eng.FlushGroups() {
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
func (c *Tier) streamDir(key string, inc uint64) string {
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
func (c *Tier) chunkKey(key string, inc, start, end uint64) string {
	var r [4]byte
	rand.Read(r[:])
	return fmt.Sprintf("%sc/%020d-%020d-%s", c.streamDir(key, inc), start, end, hex.EncodeToString(r[:]))
}

func (c *Tier) snapshotKey(key string, inc, off uint64) string {
	var r [8]byte
	rand.Read(r[:])
	return fmt.Sprintf("%ss/%020d-%s", c.streamDir(key, inc), off, hex.EncodeToString(r[:]))
}

// Pin marks objects as needed by a read in flight; the collector never deletes a pinned
// object. Every Pin is matched by an Unpin.
func (c *Tier) Pin(keys ...string) {
	if c == nil {
		return
	}
	c.pinsMu.Lock()
	for _, k := range keys {
		c.pins[k]++
	}
	c.pinsMu.Unlock()
}

// Unpin releases a Pin.
func (c *Tier) Unpin(keys ...string) {
	if c == nil {
		return
	}
	c.pinsMu.Lock()
	for _, k := range keys {
		if c.pins[k]--; c.pins[k] <= 0 {
			delete(c.pins, k)
		}
	}
	c.pinsMu.Unlock()
}

func (c *Tier) pinned(key string) bool {
	c.pinsMu.Lock()
	defer c.pinsMu.Unlock()
	return c.pins[key] > 0
}

// OverHotCap reports whether a write with a body of bodyLen bytes must be refused because
// the stream's group holds more hot bytes than storage.cold.max_hot_size_per_group. The
// caller answers a follower's redirect first, then Backpressure. A group holding a full
// piece (flush_size) wakes the flusher now rather than at its next tick: a writer that
// fills the cap faster than flush_interval would otherwise wait for that tick.
func (c *Tier) OverHotCap(key string, bodyLen int) bool {
	if c == nil || bodyLen == 0 {
		return false
	}
	hot := c.eng.GroupHotBytes(c.eng.GroupOf(key))
	if size := int64(c.cfg.FlushSize); size > 0 && hot >= size {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	limit := c.cfg.HotCap()
	return limit > 0 && hot >= limit
}

// WaitUnderHotCap waits, up to storage.cold.backpressure_wait, for the flusher to bring
// the group of key under the hot cap, looking again after every flush pass (OverHotCap
// has woken the flusher). It reports whether the write may go ahead; false once the
// wait is over, ctx is done or the tier stops. Nothing is proposed meanwhile, so a
// refusal after the wait is still not applied.
func (c *Tier) WaitUnderHotCap(ctx context.Context, key string, bodyLen int) bool {
	if c == nil || c.cfg.HotCapWait() <= 0 {
		return !c.OverHotCap(key, bodyLen)
	}
	// The wait runs from the moment the write is first held, the same instant the held
	// time is counted from, so a refused write is reported as held the whole wait.
	var heldAt time.Time // when the write first had to wait (zero: it never did)
	var expired <-chan time.Time
	defer func() {
		if !heldAt.IsZero() {
			c.heldNanos.Add(uint64(time.Since(heldAt)))
		}
	}()
	for {
		done := c.passChan()
		if !c.OverHotCap(key, bodyLen) {
			return true
		}
		if heldAt.IsZero() {
			heldAt = time.Now()
			c.heldWrites.Add(1)
			t := time.NewTimer(c.cfg.HotCapWait())
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-done:
		case <-expired:
			return false
		case <-ctx.Done():
			return false
		case <-c.stop:
			return false
		}
	}
}

func (c *Tier) passChan() <-chan struct{} {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	return c.passDone
}

// endPass wakes the writes waiting for a flush pass.
func (c *Tier) endPass() {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	close(c.passDone)
	c.passDone = make(chan struct{})
}

// Backpressure counts and returns the refusal of a write over the hot cap, before
// anything is proposed (so marked x-ursula-not-applied: ColdBackpressure). Nodes never
// send the vouch (x-ursula-not-applied-checked): only a gateway does.
func (c *Tier) Backpressure() *streamcore.Error {
	c.backpressure.Add(1)
	return streamcore.Errorf(http.StatusServiceUnavailable, CodeColdBackpressure, "the stream's group holds more unflushed bytes than storage.cold.max_hot_size_per_group; retry once the cold flush catches up").
		With(streamcore.HdrRetryAfter, "1").With(streamcore.HdrNotApplied, "ColdBackpressure")
}

// HeadHeaders adds the tier's headers to a HEAD answer: the diagnostic first hot offset
// and the bound of snapshot upload in parts.
func (c *Tier) HeadHeaders(h http.Header, hotStart uint64) {
	if c == nil {
		return
	}
	h.Set(HdrColdHotStart, streamcore.FormatOffset(hotStart))
	h.Set(streamcore.HdrMaxSnapshotBytes, strconv.FormatInt(c.MaxSnapshotBytes(), 10))
}

// StoreFailed is the answer to a request the object store failed.
func StoreFailed(err error) *streamcore.Error {
	return coldStoreFailed(err)
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

// FlushStream flushes every hot byte of the stream at key now (the admin flush); the
// caller checked that this node leads it.
func (c *Tier) FlushStream(key string) error { return c.flushOnce(true, key) }

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
