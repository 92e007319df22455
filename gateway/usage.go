package gateway

// The usage log: per flush interval, one JSON line per (bucket, principal, action class)
// counting requests, ingress and egress bytes and chunks, appended to a file as one
// sequence-numbered batch by a background flusher, so that a slow or failing file never
// holds a request up. A batch that could not be written is merged into the next one: a
// failing sink delays reporting, it never drops counts.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Action classes of the usage lines.
const (
	ActionRead      = "read"      // GET, HEAD
	ActionLiveRead  = "live_read" // GET with live= (long-poll, SSE)
	ActionWrite     = "write"     // POST, PUT: counts chunks
	ActionDelete    = "delete"    // DELETE
	ActionAdmin     = "admin"     // /__ursula/*, /metrics
	ActionPreflight = "preflight" // OPTIONS
	ActionOther     = "other"
)

// actionClass is the usage class of r.
func actionClass(r *http.Request) string {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodOptions:
		return ActionPreflight
	case strings.HasPrefix(p, "/__ursula/") || p == "/__ursula" || p == "/metrics":
		return ActionAdmin
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if r.URL.Query().Has("live") {
			return ActionLiveRead
		}
		return ActionRead
	case http.MethodPost, http.MethodPut:
		return ActionWrite
	case http.MethodDelete:
		return ActionDelete
	}
	return ActionOther
}

// UsageRecord is one request, as the gateway hands it to the log.
type UsageRecord struct {
	Bucket    string
	Principal string // "issuer|subject" of a JWT; "|" for a token-file token; "" anonymous
	Action    string // an Action* class
	Status    int
	BytesIn   int64
	BytesOut  int64
	Chunks    int64
}

// UsageLine is one line of the log: what one (bucket, principal, action class) did within
// [start, end).
type UsageLine struct {
	Seq       uint64    `json:"seq"` // the batch, per process from 1: a gap shows a lost batch
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Bucket    string    `json:"bucket"`
	Principal string    `json:"principal"`
	Action    string    `json:"action"`
	Requests  int64     `json:"requests"`
	Errors    int64     `json:"errors"` // of Requests, those answered with a status >= 400
	BytesIn   int64     `json:"bytes_in"`
	BytesOut  int64     `json:"bytes_out"`
	// Chunks is the writes' size in billing units: the sum over the writes (POST, PUT) of
	// ceil(bytes/unit), at least 1 each. The sum cannot be recovered from byte totals
	// afterwards (5+25 KiB and 10+20 KiB agree on bytes but not on units), so it is
	// counted here. Absent without a chunk unit.
	Chunks int64 `json:"chunks,omitempty"`
}

type usageKey struct{ bucket, principal, action string }

type usageCounts struct{ requests, errors, bytesIn, bytesOut, chunks int64 }

func (c *usageCounts) add(o usageCounts) {
	c.requests += o.requests
	c.errors += o.errors
	c.bytesIn += o.bytesIn
	c.bytesOut += o.bytesOut
	c.chunks += o.chunks
}

// UsageBatchKeys is the number of groups at which the flusher writes at once instead of
// waiting for its interval, so a gateway seeing many tenants does not hold a large map.
const UsageBatchKeys = 10000

// UsageLog aggregates UsageRecords and appends them as JSON line batches to a file.
type UsageLog struct {
	path      string
	chunkUnit int64
	logger    *slog.Logger
	now       func() time.Time

	mu    sync.Mutex // guards cur and curStart
	cur   map[usageKey]*usageCounts
	start time.Time

	flushMu    sync.Mutex // one flush at a time; guards the fields below
	seq        uint64
	unsent     map[usageKey]*usageCounts // counts of batches not written yet
	unsentFrom time.Time
	tail       []byte // the rest of a partly written batch, written before anything else

	stop   chan struct{}
	done   chan struct{}
	kick   chan struct{} // the map is full
	writes atomic.Int64  // file writes, for tests
}

// OpenUsageLog starts a usage log appending to path every flush interval. chunkUnit is
// the chunk unit in bytes (0: no chunk counting).
func OpenUsageLog(path string, chunkUnit int64, flush time.Duration, logger *slog.Logger) *UsageLog {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if flush <= 0 {
		flush = time.Second
	}
	u := &UsageLog{path: path, chunkUnit: chunkUnit, logger: logger, now: time.Now,
		cur: map[usageKey]*usageCounts{}, unsent: map[usageKey]*usageCounts{},
		stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1)}
	u.start = u.now().UTC()
	go u.run(flush)
	return u
}

// chunksOf is the units a write of n bytes counts.
func (u *UsageLog) chunksOf(n int64) int64 {
	if u == nil || u.chunkUnit <= 0 {
		return 0
	}
	return max(1, (n+u.chunkUnit-1)/u.chunkUnit)
}

// Add counts rec in its group of the current interval.
func (u *UsageLog) Add(rec UsageRecord) {
	k := usageKey{rec.Bucket, rec.Principal, rec.Action}
	c := usageCounts{requests: 1, bytesIn: rec.BytesIn, bytesOut: rec.BytesOut, chunks: rec.Chunks}
	if rec.Status >= 400 {
		c.errors = 1
	}
	u.mu.Lock()
	g := u.cur[k]
	if g == nil {
		g = &usageCounts{}
		u.cur[k] = g
	}
	g.add(c)
	full := len(u.cur) >= UsageBatchKeys
	u.mu.Unlock()
	if full {
		select {
		case u.kick <- struct{}{}:
		default:
		}
	}
}

// Flush closes the current interval and writes its batch now (for tests and shutdown),
// together with any batch a failed write left. Requests keep counting while it writes:
// the file is written outside the counting lock.
func (u *UsageLog) Flush() error {
	u.flushMu.Lock()
	defer u.flushMu.Unlock()
	u.mu.Lock()
	cur, from := u.cur, u.start
	u.cur = map[usageKey]*usageCounts{}
	end := u.now().UTC()
	u.start = end
	u.mu.Unlock()

	if len(u.unsent) == 0 {
		u.unsentFrom = from
	}
	for k, c := range cur {
		g := u.unsent[k]
		if g == nil {
			g = &usageCounts{}
			u.unsent[k] = g
		}
		g.add(*c)
	}
	if len(u.tail) > 0 {
		// The rest of a partly written batch goes first, so lines stay whole.
		n, err := u.write(u.tail)
		u.tail = u.tail[n:]
		if err != nil {
			return err
		}
		u.tail = nil
	}
	if len(u.unsent) == 0 {
		return nil
	}
	b := u.render(u.seq+1, u.unsentFrom, end)
	n, err := u.write(b)
	if n > 0 {
		// The batch is (partly) in the file: its number is used, its counts are out.
		u.seq++
		u.unsent = map[usageKey]*usageCounts{}
		if n < len(b) {
			u.tail = b[n:]
		}
	}
	return err
}

// render is the batch of the unsent counts, one line per group in a stable order.
func (u *UsageLog) render(seq uint64, from, end time.Time) []byte {
	keys := make([]usageKey, 0, len(u.unsent))
	for k := range u.unsent {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b usageKey) int {
		return cmp.Or(cmp.Compare(a.bucket, b.bucket), cmp.Compare(a.principal, b.principal), cmp.Compare(a.action, b.action))
	})
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, k := range keys {
		c := u.unsent[k]
		enc.Encode(UsageLine{Seq: seq, Start: from, End: end, Bucket: k.bucket, Principal: k.principal,
			Action: k.action, Requests: c.requests, Errors: c.errors, BytesIn: c.bytesIn, BytesOut: c.bytesOut, Chunks: c.chunks})
	}
	return buf.Bytes()
}

func (u *UsageLog) write(b []byte) (int, error) {
	f, err := os.OpenFile(u.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return 0, err
	}
	u.writes.Add(1)
	n, err := f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

func (u *UsageLog) run(every time.Duration) {
	defer close(u.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-u.stop:
			if err := u.Flush(); err != nil {
				u.logger.Error("usage log: final flush failed", "path", u.path, "err", err)
			}
			return
		case <-t.C:
		case <-u.kick:
		}
		if err := u.Flush(); err != nil {
			u.logger.Warn("usage log: flush failed; counts stay queued for the next batch", "path", u.path, "err", err)
		}
	}
}

// Close flushes what is counted and stops the flusher.
func (u *UsageLog) Close() {
	close(u.stop)
	<-u.done
}
