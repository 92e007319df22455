package replicator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// fakeParts puts an honest upload-in-parts layer in front of a real server that has none:
// it stages parts in memory, and a commit assembles them, checks the digest and publishes
// the assembled body with a plain PUT to the server behind it (so a repeated commit is as
// idempotent as a repeated publish). Plans inject answers.
type fakeParts struct {
	next http.Handler

	mu          sync.Mutex
	noParts     bool // HEAD announces no Ursula-Max-Snapshot-Bytes
	parts       map[string][]byte
	seq         int
	staged      int
	commits     int
	discards    int
	inFlight    int
	maxInFlight int
	stagePlan   []int // statuses for the next stages (0: serve)
	commitPlan  []int // statuses for the next commits (0: serve, -1: serve, then drop the answer)
	corrupt     bool  // flip a byte of the next staged part
}

func (f *fakeParts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodHead:
		f.mu.Lock()
		if !f.noParts {
			w.Header().Set(streamcore.HdrMaxSnapshotBytes, "1073741824")
		}
		f.mu.Unlock()
	case r.Method == http.MethodPost && strings.Contains(p, "/snapshot/") && strings.HasSuffix(p, "/parts"):
		f.stage(w, r)
		return
	case r.Method == http.MethodDelete && strings.HasSuffix(p, "/snapshot/parts"):
		f.mu.Lock()
		f.discards++
		f.parts = nil
		f.mu.Unlock()
		w.Header().Set(streamcore.HdrIncarnation, "1")
		w.WriteHeader(http.StatusNoContent)
		return
	case r.Method == http.MethodPut && r.Header.Get(streamcore.HdrSnapshotParts) != "":
		f.commit(w, r)
		return
	}
	f.next.ServeHTTP(w, r)
}

func fail(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":"fake parts layer"}}`, code)
}

func (f *fakeParts) stage(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	status := 0
	if len(f.stagePlan) > 0 {
		status, f.stagePlan = f.stagePlan[0], f.stagePlan[1:]
	}
	f.mu.Unlock()
	time.Sleep(5 * time.Millisecond) // let a second part overlap
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	if status != 0 {
		fail(w, status, "STAGED_PARTS_LIMIT")
		return
	}
	if f.corrupt {
		f.corrupt = false
		body[len(body)/2] ^= 0xff
	}
	if f.parts == nil {
		f.parts = map[string][]byte{}
	}
	f.seq++
	id := "part-" + strconv.Itoa(f.seq)
	f.parts[id] = body
	f.staged++
	w.Header().Set(streamcore.HdrSnapshotPart, id)
	w.Header().Set(streamcore.HdrIncarnation, "1")
	w.WriteHeader(http.StatusCreated)
}

func (f *fakeParts) commit(w http.ResponseWriter, r *http.Request) {
	list, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.commits++
	status := 0
	if len(f.commitPlan) > 0 {
		status, f.commitPlan = f.commitPlan[0], f.commitPlan[1:]
	}
	if status > 0 {
		f.mu.Unlock()
		w.Header().Set("Retry-After", "0")
		fail(w, status, "SNAPSHOT_COMMITS_BUSY")
		return
	}
	// A repeat of the published snapshot answers 204 even with its parts gone (22.7).
	head := httptest.NewRecorder()
	f.next.ServeHTTP(head, httptest.NewRequestWithContext(r.Context(), http.MethodHead, strings.Split(r.URL.Path, "/snapshot/")[0], nil))
	if off := strings.Split(r.URL.Path, "/snapshot/")[1]; head.Header().Get(streamcore.HdrSnapshotOffset) == off &&
		head.Header().Get(streamcore.HdrSnapshotDigest) == r.Header.Get(streamcore.HdrSnapshotDigest) {
		f.mu.Unlock()
		w.Header().Set(streamcore.HdrSnapshotOffset, off)
		w.Header().Set(streamcore.HdrSnapshotDigest, r.Header.Get(streamcore.HdrSnapshotDigest))
		w.WriteHeader(http.StatusNoContent)
		return
	}
	ids := strings.Split(strings.TrimSuffix(string(list), "\n"), "\n")
	n, _ := strconv.Atoi(r.Header.Get(streamcore.HdrSnapshotParts))
	var body []byte
	for _, id := range ids {
		part, ok := f.parts[id]
		if !ok {
			f.mu.Unlock()
			fail(w, http.StatusBadRequest, "UNKNOWN_PART")
			return
		}
		body = append(body, part...)
	}
	if n != len(ids) || !bytes.HasSuffix(list, []byte("\n")) {
		f.mu.Unlock()
		fail(w, http.StatusBadRequest, "INVALID_PARTS_COMMIT")
		return
	}
	ct := r.Header.Get("Content-Type")
	if streamcore.SnapshotDigestOf(ct, body) != r.Header.Get(streamcore.HdrSnapshotDigest) {
		for _, id := range ids {
			delete(f.parts, id)
		}
		f.mu.Unlock()
		fail(w, http.StatusBadRequest, "SNAPSHOT_DIGEST_MISMATCH")
		return
	}
	f.mu.Unlock()
	put, _ := http.NewRequestWithContext(r.Context(), http.MethodPut, r.URL.String(), bytes.NewReader(body))
	put.Header.Set("Content-Type", ct)
	rec := httptest.NewRecorder()
	f.next.ServeHTTP(rec, put)
	if rec.Code == http.StatusNoContent || rec.Code == http.StatusOK {
		f.mu.Lock()
		for _, id := range ids {
			delete(f.parts, id)
		}
		f.mu.Unlock()
	}
	if status == -1 { // the commit ran; its answer is lost
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

func (f *fakeParts) counts() (staged, commits, discards, maxInFlight int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.staged, f.commits, f.discards, f.maxInFlight
}

// checkSnapshot restores the stream from its latest snapshot alone (up to the snapshot
// offset) and compares with the model.
func checkSnapshot(t *testing.T, c *client.Client, url string, x uint64, m *model) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "restored")
	img, err := Restore(context.Background(), c, url, dst, x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Commits != 0 {
		t.Fatalf("restore at the snapshot offset replayed %d commits, want the snapshot alone", img.Commits)
	}
	if !bytes.Equal(readFile(t, dst), m.at[x]) {
		t.Fatalf("the snapshot at %d installs an image that differs from the model", x)
	}
}

// TestSnapshotInParts: a body over SnapshotPartBytes goes up in parts, two in flight; a
// 503 and then a lost answer repeat the same commit, whose third try publishes; the body
// file is gone after the cycle, and the snapshot installs the model's image.
func TestSnapshotInParts(t *testing.T) {
	f := &fakeParts{commitPlan: []int{http.StatusServiceUnavailable, -1}}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	url := base + "/snap/parts"
	r, path, lb := snapAttach(t, url, Options{SnapshotPartBytes: 16 << 10})
	m := newModel()
	x := commitUntilSnapshot(t, r, m, "-1")
	staged, commits, discards, maxIn := f.counts()
	st := r.Status()
	if st.SnapshotBytes == nil || int64(staged) != (*st.SnapshotBytes+16<<10-1)/(16<<10) {
		t.Fatalf("%d parts staged for a body of %d bytes", staged, *st.SnapshotBytes)
	}
	if staged < 3 || commits != 3 || discards != 0 || maxIn != 2 {
		t.Fatalf("staged %d, commits %d, discards %d, at most %d in flight; want >= 3, 3, 0, 2", staged, commits, discards, maxIn)
	}
	if _, err := os.Stat(path + blobSuffix); !os.IsNotExist(err) {
		t.Fatalf("the snapshot body file outlives the cycle: %v", err)
	}
	if ev := lb.events("snapshot_failed"); len(ev) != 0 {
		t.Fatalf("repeated commits counted as failures: %v", ev)
	}
	checkSnapshot(t, r.opts.Client, url, x, m)
}

// TestSnapshotPartsRefused: a 429 on a part and a digest mismatch at the commit each fail
// the cycle and discard the staged parts; the next cycle stages anew and publishes.
func TestSnapshotPartsRefused(t *testing.T) {
	f := &fakeParts{stagePlan: []int{0, http.StatusTooManyRequests}, corrupt: false}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	url := base + "/snap/refused"
	r, _, lb := snapAttach(t, url, Options{SnapshotPartBytes: 16 << 10})
	m := newModel()
	x := commitUntilSnapshot(t, r, m, "-1")
	if _, _, discards, _ := f.counts(); discards != 1 || len(lb.events("snapshot_failed")) != 1 {
		t.Fatalf("after a 429: %d discards, failures %v", discards, lb.events("snapshot_failed"))
	}
	checkSnapshot(t, r.opts.Client, url, x, m)

	f.mu.Lock()
	f.corrupt = true
	f.mu.Unlock()
	x2 := commitUntilSnapshot(t, r, m, streamcore.FormatOffset(x))
	ev := lb.events("snapshot_failed")
	if _, _, discards, _ := f.counts(); discards != 2 || len(ev) != 2 || !strings.Contains(ev[1]["err"], "SNAPSHOT_DIGEST_MISMATCH") {
		t.Fatalf("after a digest mismatch: %d discards, failures %v", discards, ev)
	}
	checkSnapshot(t, r.opts.Client, url, x2, m)
}

// TestSnapshotTooLargeWithoutParts: a body over one request, on a server that announces no
// upload in parts, fails the cycle as a size failure with reason=too_large, and backs off
// (doubling) instead of spinning; nothing is staged.
func TestSnapshotTooLargeWithoutParts(t *testing.T) {
	f := &fakeParts{noParts: true}
	base := snapServer(t, func(h http.Handler) http.Handler { f.next = h; return f })
	url := base + "/snap/nopart"
	r, _, lb := snapAttach(t, url, Options{SnapshotPartBytes: 16 << 10})
	m := newModel()
	for len(lb.events("snapshot_failed")) < 2 {
		m.commit(t, r, 32, 4)
		time.Sleep(20 * time.Millisecond)
	}
	ev := lb.events("snapshot_failed")
	for _, e := range ev[:2] {
		if e["kind"] != FailSize || e["reason"] != reasonTooLarge || !strings.Contains(e["err"], "Ursula-Max-Snapshot-Bytes") {
			t.Fatalf("failure %v, want kind=size reason=too_large naming the missing header", e)
		}
	}
	a, _ := strconv.Atoi(ev[0]["retry_ms"])
	b, _ := strconv.Atoi(ev[1]["retry_ms"])
	if a < 80 || b <= a {
		t.Fatalf("retry_ms %d then %d: want a backoff that grows", a, b)
	}
	if staged, commits, _, _ := f.counts(); staged != 0 || commits != 0 || r.Status().Snapshot != "-1" {
		t.Fatalf("staged %d, committed %d, snapshot %s", staged, commits, r.Status().Snapshot)
	}
}
