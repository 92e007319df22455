package replicator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// ---------------------------------------------------------------------------------------
// Helpers

const snapPage = 4096

// snapServer starts a real stream server (memory engine) behind an optional wrapper.
func snapServer(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	return testserver.Start(t, testserver.Options{ClusterID: "snapshot-test", Wrap: wrap}).URL
}

// logBuf collects the logfmt events of a replica.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// events returns the fields of every line with event=name, in order.
func (l *logBuf) events(name string) []map[string]string {
	l.mu.Lock()
	text := l.b.String()
	l.mu.Unlock()
	var out []map[string]string
	for line := range strings.Lines(text) {
		f := parseLogfmt(strings.TrimSpace(line))
		if f["event"] == name {
			out = append(out, f)
		}
	}
	return out
}

func parseLogfmt(line string) map[string]string {
	f := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			break
		}
		if sp := strings.IndexByte(line, ' '); sp >= 0 && sp < eq {
			line = line[sp:] // a word without a value (the program name)
			continue
		}
		key, rest := line[:eq], line[eq+1:]
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				break
			}
			f[key], _ = strconv.Unquote(q)
			line = rest[len(q):]
			continue
		}
		sp := strings.IndexByte(rest, ' ')
		if sp < 0 {
			sp = len(rest)
		}
		f[key], line = rest[:sp], rest[sp:]
	}
	return f
}

// model is the test's own replay of what it committed: the database image after every
// acknowledged commit, by the stream offset just past it.
type model struct {
	img  []byte
	at   map[uint64][]byte
	ends []uint64 // commit end offsets, increasing
	seed uint64
}

func newModel() *model { return &model{at: map[uint64][]byte{}} }

// commit makes one commit of n pages out of a database of dbPages pages (pages 1..n on
// the first commit, then a rotating window) and records the model image after it.
func (m *model) commit(t *testing.T, r *Replica, dbPages uint32, n int) {
	t.Helper()
	cm := m.next(dbPages, n)
	if err := r.Commit(context.Background(), cm); err != nil {
		t.Fatalf("commit: %v", err)
	}
	m.apply(cm)
	end := r.Status().Offset
	m.at[end] = slices.Clone(m.img)
	m.ends = append(m.ends, end)
}

func (m *model) next(dbPages uint32, n int) *Commit {
	cm := &Commit{PageSize: snapPage, DBPages: dbPages}
	var nos []uint32
	if len(m.img) < int(dbPages)*snapPage {
		for no := uint32(len(m.img)/snapPage) + 1; no <= dbPages; no++ {
			nos = append(nos, no)
		}
	}
	for len(nos) < n {
		m.seed++
		nos = append(nos, uint32(m.seed*7%uint64(dbPages))+1)
	}
	slices.Sort(nos)
	nos = slices.Compact(nos)
	for _, no := range nos {
		m.seed++
		cm.Pages = append(cm.Pages, Page{No: no, Data: testPage(snapPage, m.seed)})
	}
	return cm
}

func (m *model) apply(cm *Commit) {
	size := int(cm.DBPages) * snapPage
	if len(m.img) < size {
		m.img = append(m.img, make([]byte, size-len(m.img))...)
	}
	m.img = m.img[:size]
	for _, p := range cm.Pages {
		copy(m.img[int(p.No-1)*snapPage:], p.Data)
	}
}

func snapAttach(t *testing.T, url string, opts Options) (*Replica, string, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	opts.Log = lb
	if opts.SnapshotMinBytes == 0 {
		opts.SnapshotMinBytes = 64 << 10
	}
	if opts.Client == nil {
		c, err := client.New("")
		if err != nil {
			t.Fatal(err)
		}
		opts.Client = c
	}
	path := filepath.Join(t.TempDir(), "db")
	r, err := Attach(context.Background(), url, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, path, lb
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func parseOff(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := streamcore.ParseOffset(s)
	if err != nil {
		t.Fatalf("offset %q: %v", s, err)
	}
	return n
}

// commitUntilSnapshot commits until the replica reports a snapshot other than prev and
// returns its offset. No commit happens after the snapshot is seen.
func commitUntilSnapshot(t *testing.T, r *Replica, m *model, prev string) uint64 {
	t.Helper()
	for i := 0; i < 400; i++ {
		if s := r.Status().Snapshot; s != prev {
			return parseOff(t, s)
		}
		m.commit(t, r, 32, 4)
		// Give the goroutine a moment once the log is due, so we stop soon after.
		if st := r.Status(); st.LogBytes > st.SnapshotDueBytes {
			waitFor(t, "a snapshot", 5*time.Second, func() bool { return r.Status().Snapshot != prev })
		}
	}
	t.Fatalf("no snapshot after 400 commits: %+v", r.Status())
	return 0
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ---------------------------------------------------------------------------------------
// Tests

// TestSnapshotCycle: the trigger at max(db size, SnapshotMinBytes); the published body is
// the replay image at its offset; retention follows one snapshot behind and reads below
// it get 410; a fresh Restore after several cycles equals the full replay and replays
// only the tail (T36, checklist P133-135).
func TestSnapshotCycle(t *testing.T) {
	base := snapServer(t, nil)
	url := base + "/snap/cycle"
	r, path, lb := snapAttach(t, url, Options{})
	c := r.opts.Client
	ctx := context.Background()
	m := newModel()

	js, _ := json.Marshal(r.Status())
	for _, want := range []string{`"snapshot":"-1"`, `"retained":"00000000000000000000"`, `"log_bytes":`, `"snapshot_due_bytes":65536`,
		`"snapshot_age_ms":null`, `"snapshot_failures":0`, `"snapshot_error":""`, `"snapshot_bytes":null`} {
		if !strings.Contains(string(js), want) {
			t.Fatalf("status JSON %s lacks %s", js, want)
		}
	}
	st := r.Status()
	if st.Snapshot != "-1" || st.SnapshotAgeMs != nil || st.SnapshotBytes != nil || st.Retained != streamcore.FormatOffset(0) {
		t.Fatalf("fresh status: %+v", st)
	}
	// A few commits: under the due size, no snapshot, no shadow image yet.
	for range 3 {
		m.commit(t, r, 32, 4)
	}
	st = r.Status()
	if st.SnapshotDueBytes != 32*snapPage || st.LogBytes != st.Offset || st.Snapshot != "-1" {
		t.Fatalf("status before the first snapshot: %+v", st)
	}
	if _, err := os.Stat(path + shadowSuffix); !os.IsNotExist(err) {
		t.Fatalf("shadow image exists before a snapshot is due: %v", err)
	}
	// The model against a Restore by full replay (no snapshot exists yet): it is the
	// reference the snapshots are checked against below.
	t0 := st.Offset
	fullPath := filepath.Join(t.TempDir(), "full")
	if _, err := Restore(ctx, c, url, fullPath, t0, 0, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, fullPath), m.at[t0]) {
		t.Fatal("the test's model differs from a Restore by full replay")
	}

	// First snapshot.
	x1 := commitUntilSnapshot(t, r, m, "-1")
	st = r.Status()
	if st.LogBytes != st.Offset-x1 {
		t.Fatalf("log_bytes %d, want tail %d - snapshot %d", st.LogBytes, st.Offset, x1)
	}
	if !slices.Contains(m.ends, x1) {
		t.Fatalf("snapshot offset %d is not a commit boundary", x1)
	}
	// It was due: the log up to it exceeded max(db size, min).
	if x1 <= 32*snapPage {
		t.Fatalf("snapshot at %d before the log exceeded %d", x1, 32*snapPage)
	}
	info, err := c.Head(ctx, url)
	if err != nil || parseOff(t, info.SnapshotOffset) != x1 {
		t.Fatalf("HEAD snapshot offset %q (err %v), want %d", info.SnapshotOffset, err, x1)
	}
	sr, err := c.ReadSnapshot(ctx, url, streamcore.FormatOffset(x1))
	if err != nil {
		t.Fatal(err)
	}
	h, image, err := decodeSnapshot(sr.Data, maxSnapshotImage)
	if err != nil {
		t.Fatal(err)
	}
	if h.Offset != x1 || h.Epoch != 1 || h.PageSize != snapPage || h.DBPages != 32 {
		t.Fatalf("snapshot header %+v", h)
	}
	if !bytes.Equal(image, m.at[x1]) {
		t.Fatal("snapshot image differs from the replay of the stream up to its offset")
	}
	if st.SnapshotBytes == nil || *st.SnapshotBytes != int64(len(sr.Data)) || st.SnapshotAgeMs == nil || st.SnapshotFailures != 0 {
		t.Fatalf("status after the first snapshot: %+v", st)
	}
	// A Restore at x1 (now from the snapshot) is the same image.
	p1 := filepath.Join(t.TempDir(), "at-x1")
	if _, err := Restore(ctx, c, url, p1, x1, 0, nil); err != nil || !bytes.Equal(readFile(t, p1), m.at[x1]) {
		t.Fatalf("restore at the snapshot offset: %v", err)
	}
	if info.RetainedOffset != "" && parseOff(t, info.RetainedOffset) != 0 {
		t.Fatalf("retention moved to %s after the first snapshot", info.RetainedOffset)
	}

	// Second snapshot: retention goes to the first, never to the second.
	x2 := commitUntilSnapshot(t, r, m, streamcore.FormatOffset(x1))
	waitFor(t, "retention at the previous snapshot", 5*time.Second, func() bool { return r.Status().Retained == streamcore.FormatOffset(x1) })
	info, err = c.Head(ctx, url)
	if err != nil || parseOff(t, info.RetainedOffset) != x1 || parseOff(t, info.SnapshotOffset) != x2 {
		t.Fatalf("after the second snapshot: HEAD retained %q snapshot %q (err %v), want %d and %d", info.RetainedOffset, info.SnapshotOffset, err, x1, x2)
	}
	var ce *client.Error
	if _, err := c.Read(ctx, url, client.ReadOptions{Offset: streamcore.FormatOffset(0)}); !errors.As(err, &ce) || ce.Status != http.StatusGone {
		t.Fatalf("read below retention: %v, want 410", err)
	}
	if _, err := c.Read(ctx, url, client.ReadOptions{Offset: streamcore.FormatOffset(x1), MaxBytes: 1}); err != nil {
		t.Fatalf("read at retention: %v", err)
	}

	// Third snapshot, then a short tail.
	x3 := commitUntilSnapshot(t, r, m, streamcore.FormatOffset(x2))
	waitFor(t, "retention at the second snapshot", 5*time.Second, func() bool { return r.Status().Retained == streamcore.FormatOffset(x2) })
	for range 3 {
		m.commit(t, r, 32, 4)
	}
	tail := r.Status().Offset
	var total uint64
	fresh := filepath.Join(t.TempDir(), "fresh")
	img, err := Restore(ctx, c, url, fresh, 0, 0, func(done, tot uint64) { total = tot })
	if err != nil {
		t.Fatal(err)
	}
	after := 0
	for _, e := range m.ends {
		if e > x3 {
			after++
		}
	}
	if img.Tail != tail || img.Commits != after || (after > 0 && total != tail-x3) {
		t.Fatalf("fresh restore: tail %d (want %d), %d commits replayed (want %d after the snapshot), progress total %d (want %d)", img.Tail, tail, img.Commits, after, total, tail-x3)
	}
	if !bytes.Equal(readFile(t, fresh), m.at[tail]) {
		t.Fatal("fresh restore from snapshot + tail differs from the full replay")
	}
	if n := len(lb.events("snapshot_published")); n != 3 {
		t.Fatalf("%d snapshot_published events, want 3", n)
	}
	if ev := lb.events("retention_moved"); len(ev) != 2 || ev[0]["offset"] != fmt.Sprint(x1) || ev[1]["offset"] != fmt.Sprint(x2) {
		t.Fatalf("retention_moved events %v", ev)
	}

	// Close stops the goroutine and removes the shadow image.
	if _, err := os.Stat(path + shadowSuffix); err != nil {
		t.Fatalf("shadow image while attached: %v", err)
	}
	r.Close()
	if _, err := os.Stat(path + shadowSuffix); !os.IsNotExist(err) {
		t.Fatalf("shadow image after Close: %v", err)
	}
}

// snapFaults is a server wrapper that fails or delays snapshot and retention PUTs.
type snapFaults struct {
	next http.Handler

	mu        sync.Mutex
	snapPlan  []int         // statuses to answer the next snapshot PUTs with (0: pass)
	retPlan   []int         // the same for retention PUTs
	getPlan   []int         // the same for snapshot GETs (404 answers SNAPSHOT_NOT_FOUND)
	delay     time.Duration // before passing a snapshot PUT on
	hold      chan struct{} // when set, snapshot PUTs wait for it to close before passing on
	snapPuts  []time.Time   // arrival of every snapshot PUT
	inFlight  atomic.Int32  // snapshot PUTs being served
	retryHint string        // Retry-After of a 503
}

func (f *snapFaults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	isSnap := r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/snapshot/")
	isRet := r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/retention/")
	status, delay := 0, time.Duration(0)
	f.mu.Lock()
	switch {
	case isSnap:
		f.snapPuts = append(f.snapPuts, time.Now())
		if len(f.snapPlan) > 0 {
			status, f.snapPlan = f.snapPlan[0], f.snapPlan[1:]
		}
		delay = f.delay
		if f.hold != nil {
			hold := f.hold
			f.mu.Unlock()
			f.inFlight.Add(1)
			<-hold
			f.inFlight.Add(-1)
			f.mu.Lock()
		}
	case isRet && len(f.retPlan) > 0:
		status, f.retPlan = f.retPlan[0], f.retPlan[1:]
	case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/snapshot/") && len(f.getPlan) > 0:
		status, f.getPlan = f.getPlan[0], f.getPlan[1:]
	}
	hint := f.retryHint
	f.mu.Unlock()
	if status == -1 { // no answer: drop the connection
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	if status != 0 {
		io.Copy(io.Discard, r.Body)
		if status == http.StatusServiceUnavailable && hint != "" {
			w.Header().Set("Retry-After", hint)
		}
		code := "INJECTED"
		if status == http.StatusNotFound {
			code = streamcore.CodeSnapshotNotFound
		}
		http.Error(w, `{"error":{"code":"`+code+`","message":"injected failure"}}`, status)
		return
	}
	if isSnap && delay > 0 {
		f.inFlight.Add(1)
		defer f.inFlight.Add(-1)
		time.Sleep(delay)
	}
	f.next.ServeHTTP(w, r)
}

func (f *snapFaults) puts() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.snapPuts)
}

// TestSnapshotFailuresBackoff: failed publishes back off 100 ms, doubling, with ±20%
// jitter; a 503 with Retry-After is an outage and waits at least that long; 500 is other.
// Failures are counted in a row with the last reason, commits go on unaffected, and a
// success clears both. A retention failure logs retention_failed, is not counted, and the
// next snapshot's retention move covers it (T37, T38, T39).
func TestSnapshotFailuresBackoff(t *testing.T) {
	f := &snapFaults{
		snapPlan:  []int{500, 500, 500, 503},
		retPlan:   []int{500},
		retryHint: "1",
	}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	url := base + "/snap/failures"
	r, _, lb := snapAttach(t, url, Options{})
	m := newModel()

	maxFailures, sawError := 0, ""
	deadline := time.Now().Add(10 * time.Second)
	for r.Status().Snapshot == "-1" {
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot after the failures stopped: %+v", r.Status())
		}
		m.commit(t, r, 32, 4) // fails the test if a commit fails
		st := r.Status()
		if st.SnapshotFailures > maxFailures {
			maxFailures, sawError = st.SnapshotFailures, st.SnapshotError
		}
		time.Sleep(10 * time.Millisecond)
	}
	if maxFailures != 4 || !strings.Contains(sawError, "503") {
		t.Fatalf("saw %d failures in a row (want 4), last error %q", maxFailures, sawError)
	}
	ev := lb.events("snapshot_failed")
	if len(ev) != 4 {
		t.Fatalf("%d snapshot_failed events, want 4: %v", len(ev), ev)
	}
	wantKind := []string{FailOther, FailOther, FailOther, FailOutage}
	for i, e := range ev {
		ms, _ := strconv.Atoi(e["retry_ms"])
		base := int(backoff(i+1, wantKind[i]) / time.Millisecond)
		lo, hi := base*8/10-1, base*12/10+1
		if i == 3 {
			lo, hi = 1000, 1000 // 800 ms ± 20% is under the Retry-After of 1 s
		}
		if e["failures"] != strconv.Itoa(i+1) || e["kind"] != wantKind[i] || ms < lo || ms > hi || e["level"] != "warn" {
			t.Fatalf("snapshot_failed #%d: %v (want kind %s, retry_ms in [%d, %d])", i+1, e, wantKind[i], lo, hi)
		}
	}
	// The waits were honoured: the gap before each send is at least the announced wait.
	puts := f.puts()
	if len(puts) < 5 {
		t.Fatalf("%d snapshot PUTs, want 5", len(puts))
	}
	for i := 1; i < 5; i++ {
		ms, _ := strconv.Atoi(ev[i-1]["retry_ms"])
		if gap := puts[i].Sub(puts[i-1]); gap < time.Duration(ms)*time.Millisecond {
			t.Fatalf("PUT %d came %v after the previous one, before the %d ms backoff", i+1, gap, ms)
		}
	}
	st := r.Status()
	if st.SnapshotFailures != 0 || st.SnapshotError != "" || st.SnapshotAgeMs == nil {
		t.Fatalf("status after the recovery: %+v", st)
	}
	x1 := parseOff(t, st.Snapshot)

	// Second snapshot: its retention move fails (not counted); the third one moves
	// retention to the second.
	x2 := commitUntilSnapshot(t, r, m, st.Snapshot)
	waitFor(t, "retention_failed", 5*time.Second, func() bool { return len(lb.events("retention_failed")) == 1 })
	if e := lb.events("retention_failed")[0]; e["offset"] != fmt.Sprint(x1) {
		t.Fatalf("retention_failed %v, want offset %d", e, x1)
	}
	if st := r.Status(); st.SnapshotFailures != 0 || st.SnapshotError != "" || st.Retained != streamcore.FormatOffset(0) {
		t.Fatalf("a retention failure changed the snapshot status: %+v", st)
	}
	commitUntilSnapshot(t, r, m, streamcore.FormatOffset(x2))
	waitFor(t, "retention at the second snapshot", 5*time.Second, func() bool { return r.Status().Retained == streamcore.FormatOffset(x2) })
	info, err := r.opts.Client.Head(context.Background(), url)
	if err != nil || parseOff(t, info.RetainedOffset) != x2 {
		t.Fatalf("HEAD retained %q (err %v), want %d", info.RetainedOffset, err, x2)
	}
}

// TestSnapshotSlowUploadDoesNotSlowCommits: commits go on while a snapshot upload is
// stuck: the proxy holds the upload until the test has made ten more commits.
func TestSnapshotSlowUploadDoesNotSlowCommits(t *testing.T) {
	f := &snapFaults{hold: make(chan struct{})}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	r, _, _ := snapAttach(t, base+"/snap/slow", Options{})
	m := newModel()
	deadline := time.Now().Add(30 * time.Second)
	for f.inFlight.Load() == 0 { // commit until the snapshot upload has started
		if time.Now().After(deadline) {
			t.Fatal("no snapshot upload started")
		}
		m.commit(t, r, 32, 4)
	}
	for range 10 {
		m.commit(t, r, 32, 4) // fails the test if a commit fails
	}
	if f.inFlight.Load() == 0 || r.Status().Snapshot != "-1" {
		t.Fatal("the held upload finished before the commits: the hold did not work")
	}
	close(f.hold)
	for r.Status().Snapshot == "-1" {
		if time.Now().After(deadline) {
			t.Fatal("no snapshot after the upload was released")
		}
		m.commit(t, r, 32, 4)
	}
}

// TestSnapshotNotWhileRefused: no snapshot is taken while writes are refused and none is
// counted; too_large does not hold snapshots back (T41, checklist P144-145).
func TestSnapshotNotWhileRefused(t *testing.T) {
	base := snapServer(t, nil)
	r, _, lb := snapAttach(t, base+"/snap/refused", Options{MaxFrameBytes: 100 << 10})
	m := newModel()
	// Grow the log past the due size without the goroutine: stop it, commit, restart it.
	r.Close()
	for range 40 {
		m.commit(t, r, 32, 4)
	}
	r.mu.Lock()
	r.lastErr = newError(KindNotApplied, ActionRetry, nil, "429 (injected)")
	r.mu.Unlock()
	r.startSnapshots(&Image{DBPages: 32}, nil)
	t.Cleanup(func() { r.Close() })
	r.snap.poke()
	time.Sleep(300 * time.Millisecond)
	if st := r.Status(); st.Snapshot != "-1" || st.SnapshotFailures != 0 || st.LogBytes <= st.SnapshotDueBytes {
		t.Fatalf("while writes are refused: %+v", st)
	}
	// A too_large transaction fails alone and does not hold snapshots back.
	big := &Commit{PageSize: snapPage, DBPages: 64}
	rnd := rand.New(rand.NewPCG(1, 2))
	for no := uint32(1); no <= 64; no++ {
		p := make([]byte, snapPage)
		for i := range p {
			p[i] = byte(rnd.Uint32())
		}
		big.Pages = append(big.Pages, Page{No: no, Data: p})
	}
	if err := r.Commit(context.Background(), big); err == nil {
		t.Fatal("a commit over MaxFrameBytes went through")
	} else if e, _ := AsError(err); e == nil || e.Kind != KindTooLarge {
		t.Fatalf("big commit: %v", err)
	}
	r.snap.poke()
	waitFor(t, "a snapshot after too_large", 5*time.Second, func() bool { return r.Status().Snapshot != "-1" })
	if st := r.Status(); st.SnapshotFailures != 0 || len(lb.events("snapshot_failed")) != 0 {
		t.Fatalf("after the snapshot: %+v", st)
	}
}

// TestSnapshotThreadPanic (checklist-vfs P148, S182, T52 for the snapshot thread): a panic
// in a snapshot attempt is recovered and logged as snapshot_thread_panicked (level=error),
// counted as one failed attempt with its reason, and the goroutine goes on: the next
// attempt publishes, and commits never noticed. (The pure-Go adapter's VFS entry points
// add no recovery of their own: protocol-departures.md, "Panics".)
func TestSnapshotThreadPanic(t *testing.T) {
	base := snapServer(t, nil)
	var panics atomic.Int32
	r, _, lb := snapAttach(t, base+"/snap/panic", Options{beforeCycle: func() {
		if panics.Add(1) == 1 {
			panic("injected snapshot panic")
		}
	}})
	m := newModel()
	r.Close()
	for range 40 {
		m.commit(t, r, 32, 4)
	}
	r.startSnapshots(&Image{DBPages: 32}, nil)
	t.Cleanup(func() { r.Close() })
	r.snap.poke()
	waitFor(t, "the panic", 10*time.Second, func() bool { return len(lb.events("snapshot_thread_panicked")) == 1 })
	ev := lb.events("snapshot_thread_panicked")[0]
	if ev["level"] != "error" || !strings.Contains(ev["message"], "injected snapshot panic") {
		t.Fatalf("snapshot_thread_panicked event %v", ev)
	}
	m.commit(t, r, 32, 4) // commits go on
	waitFor(t, "a snapshot after the panic", 20*time.Second, func() bool { return r.Status().Snapshot != "-1" })
	if st := r.Status(); st.SnapshotFailures != 0 || st.Poisoned {
		t.Fatalf("after the snapshot: %+v", st)
	}
	if f := lb.events("snapshot_failed"); len(f) < 1 {
		t.Fatalf("the panic was not counted as a failed attempt: %v", f)
	}
}

// TestSnapshotBackoffAndClassify checks the backoff schedule and the failure kinds.
func TestSnapshotBackoffAndClassify(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 12: 204800 * time.Millisecond, 13: 5 * time.Minute, 60: 5 * time.Minute} {
		if got := backoff(n, FailOther); got != want {
			t.Fatalf("backoff(%d, other) = %v, want %v", n, got, want)
		}
	}
	if got := backoff(16, FailSize); got != 3276800*time.Millisecond {
		t.Fatalf("backoff(16, size) = %v", got)
	}
	if got := backoff(60, FailSize); got != time.Hour {
		t.Fatalf("backoff(60, size) = %v", got)
	}
	for range 1000 {
		if d := jitter(time.Second); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("jitter(1s) = %v", d)
		}
	}

	base := snapServer(t, nil)
	url := base + "/snap/classify"
	c, _ := client.New("")
	if _, err := c.Create(context.Background(), url, client.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &snapshotter{r: &Replica{url: url, opts: Options{Client: c}}}
	noAnswer := &client.Error{Status: 0, Err: errors.New("connection reset by peer")}
	const big = 2 << 20
	cases := []struct {
		name     string
		err      error
		body     int
		maxKnown int
		kind     string
		wait     time.Duration
	}{
		{"503 Retry-After", &client.Error{Status: 503, RetryAfter: 2 * time.Second}, 10, 0, FailOutage, 2 * time.Second},
		{"503 marker", &client.Error{Status: 503, NotApplied: "WalDiskPressure"}, big, 0, FailOutage, 0},
		{"plain 503", &client.Error{Status: 503}, 10, 0, FailOther, 0},
		{"500", &client.Error{Status: 500}, 10, 0, FailOther, 0},
		{"no answer, small body", noAnswer, 10, 0, FailOutage, 0},
		{"no answer, big body, stream answers", noAnswer, big, 0, FailSize, 0},
		{"413 big body", &client.Error{Status: 413}, big, 0, FailSize, 0},
		{"413 body not larger than one published", &client.Error{Status: 413}, big, big, FailOther, 0},
		{"413 body under 1 MiB", &client.Error{Status: 413}, 1 << 20, 0, FailOther, 0},
		{"image over the limit", fmt.Errorf("%w: x", errImageTooLarge), 0, 0, FailSize, 0},
		{"wrapped read failure", newError(KindUnavailable, ActionRetry, noAnswer, "stream read failed"), 0, 0, FailOutage, 0},
		{"local", errors.New("disk full"), 10, 0, FailOther, 0},
	}
	for _, tc := range cases {
		s.maxKnownBody = tc.maxKnown
		kind, wait := s.classify(context.Background(), tc.err, tc.body)
		if kind != tc.kind || wait != tc.wait {
			t.Errorf("%s: kind %s wait %v, want %s %v", tc.name, kind, wait, tc.kind, tc.wait)
		}
	}
	// The stream does not answer either: an outage, not a size failure.
	s.r.url = "http://127.0.0.1:1/snap/classify"
	if kind, _ := s.classify(context.Background(), noAnswer, big); kind != FailOutage {
		t.Fatalf("no answer from anything: %s", kind)
	}
}

// TestSnapshotPublishTime10MiB measures a snapshot of a 10 MiB database (set
// URSULA_SNAPSHOT_BENCH=1; not part of the normal run).
func TestSnapshotPublishTime10MiB(t *testing.T) {
	if os.Getenv("URSULA_SNAPSHOT_BENCH") == "" {
		t.Skip("set URSULA_SNAPSHOT_BENCH=1")
	}
	base := snapServer(t, nil)
	r, _, lb := snapAttach(t, base+"/snap/bench", Options{SnapshotMinBytes: 1 << 20})
	m := newModel()
	const pages = 10 << 20 / snapPage
	for n := 1; n <= 2; n++ {
		for len(lb.events("snapshot_published")) < n {
			m.commit(t, r, pages, 256)
			if r.Status().LogBytes > r.Status().SnapshotDueBytes {
				waitFor(t, "snapshot", 60*time.Second, func() bool { return len(lb.events("snapshot_published")) >= n })
			}
		}
	}
	for i, e := range lb.events("snapshot_published") {
		t.Logf("10 MiB database, cycle %d: %s image bytes, %s body bytes, build %s ms (shadow catch-up + zstd), total %s ms (+ PUT + GET + compare)",
			i+1, e["image_bytes"], e["bytes"], e["build_ms"], e["ms"])
	}
}

// TestSnapshotNewOwner: a new owner (a fresh attach elsewhere) snapshots without any wait,
// carries its own claim's epoch in the header, and moves retention to the previous owner's
// snapshot, which it decoded when it built its shadow image (T6, T7).
func TestSnapshotNewOwner(t *testing.T) {
	base := snapServer(t, nil)
	url := base + "/snap/owners"
	a, _, _ := snapAttach(t, url, Options{})
	ma := newModel()
	x1 := commitUntilSnapshot(t, a, ma, "-1")
	a.Close()

	b, _, lb := snapAttach(t, url, Options{})
	// The new owner's file was rebuilt from the snapshot: installed names it (checklist-vfs Q152).
	if st := b.Status(); st.Snapshot != streamcore.FormatOffset(x1) || st.Epoch != 2 || st.Installed != streamcore.FormatOffset(x1) {
		t.Fatalf("new owner's status: %+v", st)
	}
	mb := &model{img: slices.Clone(ma.img), at: map[uint64][]byte{}, seed: ma.seed}
	x2 := commitUntilSnapshot(t, b, mb, streamcore.FormatOffset(x1))
	waitFor(t, "retention at the previous owner's snapshot", 5*time.Second, func() bool { return b.Status().Retained == streamcore.FormatOffset(x1) })
	sr, err := b.opts.Client.ReadSnapshot(context.Background(), url, streamcore.FormatOffset(x2))
	if err != nil {
		t.Fatal(err)
	}
	h, image, err := decodeSnapshot(sr.Data, maxSnapshotImage)
	if err != nil || h.Epoch != 2 || h.Offset != x2 || !bytes.Equal(image, mb.at[x2]) {
		t.Fatalf("new owner's snapshot: header %+v, err %v, image equal %t", h, err, bytes.Equal(image, mb.at[x2]))
	}
	if ev := lb.events("snapshot_failed"); len(ev) != 0 {
		t.Fatalf("failures: %v", ev)
	}
}

// TestRestoreSnapshotSuperseded: a Restore whose snapshot was superseded between its HEAD
// and its read (404 SNAPSHOT_NOT_FOUND) starts over from a new HEAD; other 404s do not.
func TestRestoreSnapshotSuperseded(t *testing.T) {
	f := &snapFaults{}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	url := base + "/snap/superseded"
	r, _, _ := snapAttach(t, url, Options{})
	m := newModel()
	x := commitUntilSnapshot(t, r, m, "-1")
	tail := r.Status().Offset
	c := r.opts.Client
	f.mu.Lock()
	f.getPlan = []int{404}
	f.mu.Unlock()
	dst := filepath.Join(t.TempDir(), "restored")
	img, err := Restore(context.Background(), c, url, dst, tail, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, dst), m.at[tail]) || img.Tail != tail {
		t.Fatalf("restore after a superseded snapshot: tail %d, want %d; snapshot at %d", img.Tail, tail, x)
	}
	f.mu.Lock()
	f.getPlan = []int{404, 404, 404}
	f.mu.Unlock()
	if _, err := Restore(context.Background(), c, url, dst, tail, 0, nil); err == nil {
		t.Fatal("restore succeeded although every snapshot read failed")
	}
}

// TestSnapshotForeignSnapshot: another writer's unreadable snapshot at the very offset this
// owner would publish gets 409 (counted, other, snapshot_error names it); the shadow is
// built from the whole stream instead; retention never moves to the foreign snapshot,
// only to the owner's own verified one (T6, T18, T39).
func TestSnapshotForeignSnapshot(t *testing.T) {
	base := snapServer(t, nil)
	url := base + "/snap/foreign"
	r, _, lb := snapAttach(t, url, Options{})
	c := r.opts.Client
	m := newModel()
	r.Close() // no snapshots while the log grows past the due size
	for range 40 {
		m.commit(t, r, 32, 4)
	}
	y := r.Status().Offset
	if _, err := c.PublishSnapshot(context.Background(), url, streamcore.FormatOffset(y), "application/octet-stream", []byte("not a snapshot")); err != nil {
		t.Fatal(err)
	}
	r.startSnapshots(&Image{DBPages: 32, PageSize: snapPage}, nil) // as if attached before it
	t.Cleanup(func() { r.Close() })
	r.snap.poke()
	waitFor(t, "the 409", 5*time.Second, func() bool { return len(lb.events("snapshot_failed")) == 1 })
	st := r.Status()
	if e := lb.events("snapshot_failed")[0]; e["kind"] != FailOther || st.SnapshotFailures != 1 || !strings.Contains(st.SnapshotError, "409") || st.Snapshot != streamcore.FormatOffset(y) {
		t.Fatalf("after the 409: event %v, status %+v", e, st)
	}
	if len(lb.events("snapshot_unreadable")) != 1 {
		t.Fatal("no snapshot_unreadable event")
	}
	x2 := commitUntilSnapshot(t, r, m, streamcore.FormatOffset(y))
	waitFor(t, "retention_failed", 5*time.Second, func() bool { return len(lb.events("retention_failed")) == 1 })
	if e := lb.events("retention_failed")[0]; e["offset"] != fmt.Sprint(y) || !strings.Contains(e["err"], "not verified") {
		t.Fatalf("retention_failed %v", e)
	}
	sr, err := c.ReadSnapshot(context.Background(), url, streamcore.FormatOffset(x2))
	if err != nil {
		t.Fatal(err)
	}
	if _, image, err := decodeSnapshot(sr.Data, maxSnapshotImage); err != nil || !bytes.Equal(image, m.at[x2]) {
		t.Fatalf("own snapshot after the foreign one: %v", err)
	}
	commitUntilSnapshot(t, r, m, streamcore.FormatOffset(x2))
	waitFor(t, "retention at the owner's snapshot", 5*time.Second, func() bool { return r.Status().Retained == streamcore.FormatOffset(x2) })
}

// TestSnapshotShrinkRetriesAtOnce: after a failure, a commit that shrinks the database by
// more than a quarter (VACUUM) brings the next attempt forward to now (checklist P140).
func TestSnapshotShrinkRetriesAtOnce(t *testing.T) {
	f := &snapFaults{snapPlan: []int{500, 500, 500, 500}}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	r, _, lb := snapAttach(t, base+"/snap/shrink", Options{})
	m := newModel()
	waitFor(t, "four failures", 10*time.Second, func() bool {
		if len(lb.events("snapshot_failed")) >= 4 {
			return true
		}
		m.commit(t, r, 32, 4)
		time.Sleep(5 * time.Millisecond)
		return false
	})
	ev := lb.events("snapshot_failed")[3]
	wait, _ := strconv.Atoi(ev["retry_ms"])
	if wait < 640 {
		t.Fatalf("fourth failure waits %d ms", wait)
	}
	shrunk := time.Now()
	m.commit(t, r, 4, 1) // 128 KiB -> 16 KiB
	waitFor(t, "the fifth PUT", 5*time.Second, func() bool { return len(f.puts()) >= 5 })
	if d := f.puts()[4].Sub(shrunk); d > time.Duration(wait)*time.Millisecond/2 {
		t.Fatalf("the attempt after the shrink came %v after it; the backoff was %d ms", d, wait)
	}
	waitFor(t, "a snapshot", 5*time.Second, func() bool { return r.Status().Snapshot != "-1" })
	if st := r.Status(); st.SnapshotDueBytes != 64<<10 || st.SnapshotFailures != 0 {
		t.Fatalf("after the shrink: %+v", st)
	}
}

// TestSnapshotNoAnswerSentTwice: a publish that gets no answer is sent once more within
// the same attempt, never more (checklist P142); the failure is an outage.
func TestSnapshotNoAnswerSentTwice(t *testing.T) {
	f := &snapFaults{snapPlan: []int{-1, -1}}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	r, _, lb := snapAttach(t, base+"/snap/noanswer", Options{})
	m := newModel()
	commitUntilSnapshot(t, r, m, "-1")
	ev := lb.events("snapshot_failed")
	if len(ev) != 1 || ev[0]["kind"] != FailOutage || len(f.puts()) != 3 {
		t.Fatalf("%d PUTs, failures %v; want 2 sends in the failed attempt, 1 in the next", len(f.puts()), ev)
	}
}

// TestSnapshotOutagePullForward: after an outage with a long Retry-After, the first
// successful commit brings the next attempt forward, once (checklist P141).
func TestSnapshotOutagePullForward(t *testing.T) {
	f := &snapFaults{snapPlan: []int{503}, retryHint: "5"}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	r, _, lb := snapAttach(t, base+"/snap/pull", Options{outagePullForward: 300 * time.Millisecond})
	m := newModel()
	waitFor(t, "the outage", 10*time.Second, func() bool {
		if len(lb.events("snapshot_failed")) > 0 {
			return true
		}
		m.commit(t, r, 32, 4)
		return false
	})
	if e := lb.events("snapshot_failed")[0]; e["kind"] != FailOutage || e["retry_ms"] != "5000" {
		t.Fatalf("outage event %v", e)
	}
	committed := time.Now()
	m.commit(t, r, 32, 4)
	waitFor(t, "the pulled-forward attempt", 3*time.Second, func() bool { return r.Status().Snapshot != "-1" })
	if d := f.puts()[1].Sub(committed); d > 2*time.Second {
		t.Fatalf("the attempt came %v after the commit, want about %v (not the 5 s Retry-After)", d, r.opts.outagePullForward)
	}
}
