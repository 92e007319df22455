package gateway

// The usage log: one JSON line per request, appended to a file by a background flusher so
// that a slow or failing file never holds a request up. Lines that could not be written
// stay queued and go out with the next flush: a failing sink delays reporting, it never
// drops counts.

import (
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// UsageRecord is one request's line.
type UsageRecord struct {
	Seq       uint64    `json:"seq"` // per process, from 1: a gap shows a lost line
	Time      time.Time `json:"time"`
	Bucket    string    `json:"bucket,omitempty"`
	Stream    string    `json:"stream,omitempty"`
	Principal string    `json:"principal,omitempty"` // "issuer|subject" of a JWT; "|" for a token-file token
	Method    string    `json:"method"`
	Status    int       `json:"status"`
	BytesIn   int64     `json:"bytes_in"`
	BytesOut  int64     `json:"bytes_out"`
	// Chunks is the write's size in billing units: ceil(bytes/unit), at least 1, for a
	// POST or PUT; 0 otherwise. A per-request sum cannot be recovered from byte totals
	// afterwards (5+25 KiB and 10+20 KiB agree on bytes but not on units), so it is
	// counted here.
	Chunks int64 `json:"chunks,omitempty"`
}

// UsageBatchBytes is the queued size at which the flusher writes at once instead of
// waiting for its interval: lines go out in batches (one open, write and close each),
// never one write per request, and a busy gateway does not queue a whole interval.
const UsageBatchBytes = 1 << 20

// UsageLog appends UsageRecords as JSON lines to a file.
type UsageLog struct {
	path      string
	chunkUnit int64
	logger    *slog.Logger

	flushMu sync.Mutex // one flush at a time, so lines keep their order
	mu      sync.Mutex // guards seq and pending
	seq     uint64
	pending []byte
	stop    chan struct{}
	done    chan struct{}
	kick    chan struct{} // a batch is full
	writes  atomic.Int64  // file writes, for tests
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
	u := &UsageLog{path: path, chunkUnit: chunkUnit, logger: logger, stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1)}
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

// Add queues rec, numbering it.
func (u *UsageLog) Add(rec UsageRecord) {
	u.mu.Lock()
	u.seq++
	rec.Seq = u.seq
	b, _ := json.Marshal(rec)
	u.pending = append(append(u.pending, b...), '\n')
	full := len(u.pending) >= UsageBatchBytes
	u.mu.Unlock()
	if full {
		select {
		case u.kick <- struct{}{}:
		default:
		}
	}
}

// Flush writes the queued lines now (for tests and shutdown). Requests keep queueing
// while it writes: the file is written outside the lock.
func (u *UsageLog) Flush() error {
	u.flushMu.Lock()
	defer u.flushMu.Unlock()
	u.mu.Lock()
	out := u.pending
	u.pending = nil
	u.mu.Unlock()
	if len(out) == 0 {
		return nil
	}
	n, err := u.write(out)
	if n < len(out) {
		// Keep whatever did not reach the file, ahead of newer lines. A partly written
		// line is finished by the next write, so lines stay whole.
		u.mu.Lock()
		u.pending = append(out[n:len(out):len(out)], u.pending...)
		u.mu.Unlock()
	}
	return err
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
			u.logger.Warn("usage log: flush failed; lines stay queued", "path", u.path, "err", err)
		}
	}
}

// Close flushes what is queued and stops the flusher.
func (u *UsageLog) Close() {
	close(u.stop)
	<-u.done
}
