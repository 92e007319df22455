package server

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/coldtier"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/internal/procs"
	"github.com/ursula-go/ursula/streamcore"
)

func randIntn(n int) int { return rand.IntN(n) }

// metrics are the node's counters, served as JSON and in the Prometheus text format.
type metrics struct {
	started     time.Time
	appendBytes atomic.Uint64
	readBytes   atomic.Uint64
	mu          sync.Mutex
	requests    map[reqKey]*reqStat
}

type reqKey struct {
	method string
	class  string // 2xx, 3xx, 4xx, 5xx
}

type reqStat struct {
	count   uint64
	seconds float64
}

func (m *metrics) init() {
	m.started = time.Now()
	m.requests = map[reqKey]*reqStat{}
}

// statusClasses names the status classes 1xx to 5xx (a table: no formatting per request).
var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

func (m *metrics) observe(method string, status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions:
	default:
		method = "OTHER"
	}
	var class string
	if c := status / 100; c >= 1 && c <= 5 {
		class = statusClasses[c-1]
	} else {
		class = fmt.Sprintf("%dxx", c)
	}
	k := reqKey{method, class}
	m.mu.Lock()
	st := m.requests[k]
	if st == nil {
		st = &reqStat{}
		m.requests[k] = st
	}
	st.count++
	st.seconds += d.Seconds()
	m.mu.Unlock()
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if !s.ready.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"ready":false,"reason":"shutting down"}`))
		return
	}
	if s.admit != nil {
		if token, why := s.admit.WriteRefusal(); token != "" {
			// Reads still work; writes do not, so a balancer should send writers elsewhere.
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]any{"ready": false, "reason": token, "detail": why})
			return
		}
	}
	if ra, ok := s.engine.(engine.RaftAdmin); ok {
		if ok, why := ra.Ready(); !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]any{"ready": false, "reason": readyReason(why), "detail": why})
			return
		}
	}
	w.Write([]byte(`{"ready":true}`))
}

// handleRaftAdmin serves GET /__ursula/raft/status, POST /__ursula/raft/transfer?group=N[&to=ID]
// and POST /__ursula/raft/drain on engines that run Raft (404 on the memory engine).
func (s *Server) handleRaftAdmin(w http.ResponseWriter, r *http.Request, path string) {
	ra, ok := s.engine.(engine.RaftAdmin)
	if !ok {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "this server does not run Raft"))
		return
	}
	want := http.MethodPost
	if path == "/__ursula/raft/status" {
		want = http.MethodGet
	}
	if r.Method != want {
		s.methodNotAllowed(w, r, want)
		return
	}
	if want == http.MethodPost && !s.explicitAdmin(w, r) {
		return
	}
	drainBody(r)
	var err error
	switch path {
	case "/__ursula/raft/status":
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ra.RaftStatus())
		return
	case "/__ursula/raft/drain":
		err = ra.Drain()
	case "/__ursula/raft/transfer":
		q := r.URL.Query()
		g, gerr := strconv.ParseUint(q.Get("group"), 10, 64)
		var to uint64
		var terr error
		if q.Has("to") {
			to, terr = strconv.ParseUint(q.Get("to"), 10, 64)
		}
		if gerr != nil || terr != nil {
			s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "transfer needs group=N and optionally to=NODE_ID"))
			return
		}
		err = ra.TransferLeadership(g, to)
	}
	if err != nil {
		// 404 unknown group, 400 unknown target, 409 otherwise (not the leader, a transfer
		// in progress, a target that cannot take over).
		status := http.StatusConflict
		switch {
		case strings.Contains(err.Error(), "no such raft group"):
			status = http.StatusNotFound
		case strings.Contains(err.Error(), "no such voter"):
			status = http.StatusBadRequest
		}
		s.writeError(w, r, streamcore.Errorf(status, "RAFT_ADMIN", "%s", err.Error()))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"ok":true}`))
}

// MetricsSnapshot is the JSON shape of GET /__ursula/metrics.
type MetricsSnapshot struct {
	UptimeSeconds float64 `json:"uptime_seconds"`
	ClusterID     string  `json:"cluster_id"`
	// ProcessIncarnation identifies this run: admin mutations may pin it (admin_lifecycle.go).
	ProcessIncarnation string             `json:"process_incarnation"`
	Engine             engine.EngineStats `json:"engine"`
	LiveReaders        int64              `json:"live_readers"`
	ColdReadHeld       int64              `json:"cold_read_bytes_held"` // cold bytes held for readers (the budget in use)
	AppendBytes        uint64             `json:"append_bytes_total"`
	ReadBytes          uint64             `json:"read_bytes_total"`
	Requests           map[string]uint64  `json:"requests_total"`
	RequestSecs        map[string]float64 `json:"request_seconds_total"`
	Cold               *coldtier.Stats    `json:"cold,omitempty"` // with a cold store
	Raft               any                `json:"raft,omitempty"` // raft engine: GET /__ursula/raft/status
	Memory             MemoryStats        `json:"memory"`
	// GoMaxProcs is the Go scheduler's P count now (`ursula server` sizes it to the load:
	// runtime.adaptive_procs).
	GoMaxProcs        int    `json:"gomaxprocs"`
	GoMaxProcsChanges uint64 `json:"gomaxprocs_changes_total"`
}

// Snapshot returns the current metrics.
func (s *Server) MetricsSnapshot() MetricsSnapshot {
	ms := MetricsSnapshot{
		UptimeSeconds:      time.Since(s.metrics.started).Seconds(),
		ClusterID:          s.cfg.ClusterID,
		ProcessIncarnation: processIncarnation,
		Engine:             s.engine.Stats(),
		LiveReaders:        s.live.Load(),
		ColdReadHeld:       s.coldReads.inUse(),
		AppendBytes:        s.metrics.appendBytes.Load(),
		ReadBytes:          s.metrics.readBytes.Load(),
		Memory:             readMemoryStats(),
		GoMaxProcs:         runtime.GOMAXPROCS(0),
		GoMaxProcsChanges:  procs.Changes(),
		Requests:           map[string]uint64{},
		RequestSecs:        map[string]float64{},
	}
	s.metrics.mu.Lock()
	for k, v := range s.metrics.requests {
		ms.Requests[k.method+" "+k.class] = v.count
		ms.RequestSecs[k.method+" "+k.class] = v.seconds
	}
	s.metrics.mu.Unlock()
	if cs := s.cold.Stats(); cs.Backend != "none" {
		ms.Cold = &cs
	}
	if ra, ok := s.engine.(engine.RaftAdmin); ok {
		ms.Raft = ra.RaftStatus()
	}
	return ms
}

func (s *Server) handleMetricsJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s.MetricsSnapshot())
}

func (s *Server) handleMetricsProm(w http.ResponseWriter, r *http.Request) {
	ms := s.MetricsSnapshot()
	var b strings.Builder
	gauge := func(name, help string, v any) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s %v\n", name, help, name, name, v)
	}
	counter := func(name, help string, v any) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %v\n", name, help, name, name, v)
	}
	gauge("ursula_uptime_seconds", "Seconds since the server started.", ms.UptimeSeconds)
	gauge("ursula_streams", "Streams held by the engine.", ms.Engine.Streams)
	gauge("ursula_stream_bytes", "Stream bytes held by the engine.", ms.Engine.Bytes)
	gauge("ursula_live_readers", "Open long-poll and SSE readers.", ms.LiveReaders)
	gauge("ursula_cold_read_bytes_held", "Cold-tier bytes held for readers that have not taken them yet.", ms.ColdReadHeld)
	counter("ursula_append_bytes_total", "Bytes appended.", ms.AppendBytes)
	counter("ursula_read_bytes_total", "Bytes served by reads.", ms.ReadBytes)
	gauge("ursula_memory_heap_live_bytes", "Go heap found live by the last collection.", ms.Memory.HeapLiveBytes)
	gauge("ursula_memory_rss_bytes", "Resident set size of the process.", ms.Memory.RSSBytes)
	gauge("ursula_memory_heap_goal_bytes", "Heap size at which the next collection starts.", ms.Memory.HeapGoalBytes)
	gauge("ursula_gc_percent", "The GC percent in effect (GOGC; runtime.gc_heap_floor_mib raises it while the process allocates fast and the live heap is small).", ms.Memory.GCPercent)
	gauge("ursula_goroutines", "Goroutines of the process.", ms.Memory.Goroutines)
	gauge("ursula_gomaxprocs", "The Go scheduler's P count now (runtime.adaptive_procs sizes it to the load).", ms.GoMaxProcs)
	counter("ursula_gomaxprocs_changes_total", "Changes of the P count by runtime.adaptive_procs.", ms.GoMaxProcsChanges)
	if c := ms.Cold; c != nil {
		coldProm(c, gauge, counter)
	}
	keys := make([]string, 0, len(ms.Requests))
	for k := range ms.Requests {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("# HELP ursula_http_requests_total HTTP requests by method and status class.\n# TYPE ursula_http_requests_total counter\n")
	for _, k := range keys {
		m, c, _ := strings.Cut(k, " ")
		fmt.Fprintf(&b, "ursula_http_requests_total{method=%q,code=%q} %d\n", m, c, ms.Requests[k])
	}
	b.WriteString("# HELP ursula_http_request_seconds_total Time spent answering HTTP requests.\n# TYPE ursula_http_request_seconds_total counter\n")
	for _, k := range keys {
		m, c, _ := strings.Cut(k, " ")
		fmt.Fprintf(&b, "ursula_http_request_seconds_total{method=%q,code=%q} %g\n", m, c, ms.RequestSecs[k])
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write([]byte(b.String()))
}

// coldProm adds the cold tier's metrics to the Prometheus text.
func coldProm(c *coldtier.Stats, gauge, counter func(name, help string, v any)) {
	gauge("ursula_cold_hot_bytes", "Unflushed (hot) payload bytes over all groups.", c.HotBytes)
	gauge("ursula_cold_max_group_hot_bytes", "Hot bytes of the fullest group.", c.MaxGroupHotBytes)
	gauge("ursula_cold_cache_bytes", "Bytes in the cold read cache.", c.CacheBytes)
	counter("ursula_cold_flushed_bytes_total", "Bytes flushed to the cold store.", c.FlushedBytes)
	counter("ursula_cold_flushed_objects_total", "Chunk objects flushed to the cold store.", c.FlushedObjects)
	counter("ursula_cold_flush_write_errors_total", "Failed chunk uploads.", c.FlushWriteErrors)
	counter("ursula_cold_backpressure_events_total", "Writes refused with ColdBackpressure.", c.BackpressureEvents)
	counter("ursula_cold_backpressure_held_total", "Writes over max_hot_size_per_group held for a flush (storage.cold.backpressure_wait), refused or not.", c.BackpressureHeld)
	counter("ursula_cold_backpressure_held_seconds_total", "Time writes spent held for a flush.", c.BackpressureHeldSec)
	counter("ursula_cold_read_bytes_total", "Bytes read from the cold tier.", c.ColdReadBytes)
	counter("ursula_cold_gc_deleted_objects_total", "Objects deleted by the cold collector.", c.GCDeletedObjects)
	gauge("ursula_cold_staged_part_bytes", "Bytes of staged snapshot parts this node counts (streams it leads).", c.StagedPartBytes)
	counter("ursula_cold_parts_staged_total", "Snapshot parts staged on this node.", c.PartsStaged)
	counter("ursula_cold_parts_commits_total", "Snapshots published from parts by this node.", c.PartsCommitted)
}

// handleFlushCold serves POST /__ursula/flush-cold/{bucket}/{stream}: flush every hot
// byte of one stream now. The answer is {"hot_start_offset": "..."}.
func (s *Server) handleFlushCold(w http.ResponseWriter, r *http.Request, raw string) {
	if !s.allow(w, r, http.MethodPost) {
		return
	}
	if !s.explicitAdmin(w, r) {
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
	// Only the leader of the stream's group flushes it (its record goes through Raft),
	// once it has applied what its predecessors committed (it looks the stream up).
	if e := s.confirmLeader(r.Context(), key); e != nil {
		drainBody(r)
		s.writeError(w, r, e)
		return
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
	if ok, wait := s.flushes.allow(key, time.Now()); !ok {
		secs := int((wait + time.Second - 1) / time.Second)
		s.writeError(w, r, streamcore.Errorf(http.StatusTooManyRequests, CodeFlushRateLimited, "this stream was flushed less than %v ago", flushInterval).
			With(streamcore.HdrRetryAfter, strconv.Itoa(secs)))
		return
	}
	if err := s.cold.FlushStream(key); err != nil {
		s.writeError(w, r, coldtier.StoreFailed(err))
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
