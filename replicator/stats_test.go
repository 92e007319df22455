package replicator

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestStatsCapIs8192: a replica attached with default options keeps 8,192 measurements
// of each kind between drains.
func TestStatsCapIs8192(t *testing.T) {
	r, _, _ := snapAttach(t, snapServer(t, nil)+"/stats/cap", Options{})
	if r.stats.cap != 8192 {
		t.Fatalf("stats cap = %d, want 8192", r.stats.cap)
	}
}

// TestStatsCommitMeasurements: one measurement per acknowledged commit with plausible
// fields; a drain clears them; offsets are strings in JSON.
func TestStatsCommitMeasurements(t *testing.T) {
	url := snapServer(t, nil) + "/stats/a"
	r, _, _ := snapAttach(t, url, Options{SnapshotMinBytes: 64 << 20})
	m := newModel()
	before := time.Now().UnixMilli()
	for i := 0; i < 5; i++ {
		m.commit(t, r, 8, 2)
	}
	st := r.DrainStats()
	if len(st.Commit) != 5 || st.Commits != 5 || st.Dropped.Commit != 0 || st.Retries != 0 {
		t.Fatalf("stats: %+v", st)
	}
	var sum uint64
	prev := ""
	for _, c := range st.Commit {
		if c.StartMs < before || c.Ms <= 0 || c.AppendMs <= 0 || c.AppendMs > c.Ms || c.Attempts != 1 || c.Retries != 0 || c.Pages <= 0 || c.Bytes <= 0 || c.Offset <= prev {
			t.Fatalf("implausible measurement %+v (prev offset %q)", c, prev)
		}
		prev = c.Offset
		sum += uint64(c.Bytes)
	}
	if sum != st.Bytes {
		t.Fatalf("bytes %d, measurements sum %d", st.Bytes, sum)
	}
	b, _ := json.Marshal(st)
	if !strings.Contains(string(b), `"offset":"`) || !strings.Contains(string(b), `"dropped":{"commit":0`) {
		t.Fatalf("json: %s", b)
	}
	if st := r.DrainStats(); len(st.Commit) != 0 || st.Commits != 0 || st.Bytes != 0 {
		t.Fatalf("drain did not clear: %+v", st)
	}
	m.commit(t, r, 8, 1)
	if st := r.DrainStats(); len(st.Commit) != 1 || st.Commit[0].Offset <= prev {
		t.Fatalf("after a drain: %+v", st)
	}
}

// TestStatsOverflow: past the cap the oldest are dropped and counted, totals still count
// every commit.
func TestStatsOverflow(t *testing.T) {
	url := snapServer(t, nil) + "/stats/b"
	r, _, _ := snapAttach(t, url, Options{SnapshotMinBytes: 64 << 20, statsCap: 16})
	m := newModel()
	for i := 0; i < 17; i++ { // cap + 1, as 8,193 against 8,192
		m.commit(t, r, 8, 1)
	}
	st := r.DrainStats()
	if len(st.Commit) != 16 || st.Dropped.Commit != 1 || st.Commits != 17 {
		t.Fatalf("overflow: %d kept, dropped %+v, commits %d", len(st.Commit), st.Dropped, st.Commits)
	}
	for i := 1; i < len(st.Commit); i++ {
		if st.Commit[i].Offset <= st.Commit[i-1].Offset {
			t.Fatalf("not oldest first: %+v", st.Commit)
		}
	}
	var kept uint64
	for _, c := range st.Commit {
		kept += uint64(c.Bytes)
	}
	if st.Bytes <= kept {
		t.Fatalf("dropped commit's bytes not in totals: %d <= %d", st.Bytes, kept)
	}
	if st := r.DrainStats(); st.Dropped.Commit != 0 || len(st.Commit) != 0 {
		t.Fatalf("drain did not clear dropped: %+v", st)
	}
}

// TestStatsRetries: a 503 without the not-applied headers is retried; the measurement
// and the totals count it.
func TestStatsRetries(t *testing.T) {
	var fail atomic.Int32
	url := snapServer(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodPost && fail.Add(-1) >= 0 {
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, req)
		})
	}) + "/stats/c"
	r, _, _ := snapAttach(t, url, Options{SnapshotMinBytes: 64 << 20})
	m := newModel()
	fail.Store(2)
	m.commit(t, r, 8, 1)
	st := r.DrainStats()
	if len(st.Commit) != 1 || st.Commit[0].Attempts != 3 || st.Commit[0].Retries != 2 || st.Retries != 2 {
		t.Fatalf("retries: %+v", st)
	}
	if st.Commit[0].Ms < st.Commit[0].AppendMs+50 {
		t.Fatalf("commit ms should include the backoff: %+v", st.Commit[0])
	}
}

// TestStatsSnapshot: a published snapshot is measured with its offset and size.
func TestStatsSnapshot(t *testing.T) {
	url := snapServer(t, nil) + "/stats/d"
	r, _, _ := snapAttach(t, url, Options{})
	m := newModel()
	x := commitUntilSnapshot(t, r, m, "-1")
	var st Stats
	waitFor(t, "a snapshot measurement", 5*time.Second, func() bool {
		s := r.DrainStats()
		st.Snapshot = append(st.Snapshot, s.Snapshot...)
		return len(st.Snapshot) > 0
	})
	s := st.Snapshot[len(st.Snapshot)-1]
	if s.Outcome != SnapshotPublished || parseOff(t, s.Offset) != x || s.Bytes <= 0 || s.Ms <= 0 {
		t.Fatalf("snapshot measurement %+v, published at %d", s, x)
	}
}
