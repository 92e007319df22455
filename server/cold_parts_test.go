package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Snapshot upload in parts through the real HTTP server, on the
// fs store and on versitygw.

const partsCT = "application/x-sqlite3"

var z0 = streamcore.FormatOffset(0)

func (env *coldEnv) stagePart(path, off string, body []byte, hdr ...string) string {
	env.t.Helper()
	res, b := coldDo(env.t, "POST", env.url(path+"/snapshot/"+off+"/parts"), body, hdr...)
	id := res.Header.Get(streamcore.HdrSnapshotPart)
	if res.StatusCode != http.StatusCreated || id == "" || len(id) > 64 || res.Header.Get(streamcore.HdrIncarnation) == "" {
		env.t.Fatalf("stage part: %d %v %s", res.StatusCode, res.Header, b)
	}
	return id
}

func commitBody(ids ...string) []byte {
	var b bytes.Buffer
	for _, id := range ids {
		b.WriteString(id + "\n")
	}
	return b.Bytes()
}

func (env *coldEnv) commit(path, off, digest string, n int, body []byte, hdr ...string) (*http.Response, []byte) {
	h := append([]string{"Content-Type", partsCT, streamcore.HdrSnapshotParts, itoa(n), streamcore.HdrSnapshotDigest, digest}, hdr...)
	return coldDo(env.t, "PUT", env.url(path+"/snapshot/"+off), body, h...)
}

func wantErr(t *testing.T, what string, res *http.Response, body []byte, status int, code string) {
	t.Helper()
	if res.StatusCode != status || !strings.Contains(string(body), code) {
		t.Fatalf("%s: %d %s, want %d %s", what, res.StatusCode, body, status, code)
	}
}

// TestSnapshotPartsCommit: parts of several sizes commit into one snapshot that reads back
// byte-identical (whole, ranged, bootstrap), with the digest of the whole; the parts are
// gone after; a repeat answers from the key, a conflicting or superseded commit 409.
func TestSnapshotPartsCommit(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			env := newColdEnv(t, b, coldSetup{flushSize: 64 << 10, hotCap: 64 << 20})
			p := "/bkt1/parts"
			env.create(p, "application/octet-stream")
			env.appendAll(p, 0, 300<<10, 100<<10)
			res, _ := coldDo(t, "HEAD", env.url(p), nil)
			if res.Header.Get(streamcore.HdrMaxSnapshotBytes) != "1073741824" {
				t.Fatalf("HEAD with a cold store: Ursula-Max-Snapshot-Bytes %q", res.Header.Get(streamcore.HdrMaxSnapshotBytes))
			}
			// 20 MiB in three parts: bigger than one multipart piece of the s3 backend.
			whole := pattern(777, 20<<20+5)
			cuts := []int{0, 9 << 20, 9<<20 + 1, len(whole)}
			var ids []string
			for i := 0; i+1 < len(cuts); i++ {
				ids = append(ids, env.stagePart(p, streamcore.FormatOffset(5), whole[cuts[i]:cuts[i+1]]))
			}
			if got := env.objects("/__parts/"); len(got) != 3 {
				t.Fatalf("staged objects: %v", got)
			}
			// Staging is invisible to readers.
			res, _ = coldDo(t, "HEAD", env.url(p), nil)
			if res.Header.Get(streamcore.HdrSnapshotOffset) != "" {
				t.Fatalf("a staged part changed the stream: %v", res.Header)
			}
			off := streamcore.FormatOffset(200 << 10)
			digest := SnapshotDigest(partsCT, whole)
			res, body := env.commit(p, off, digest, 3, commitBody(ids...))
			if res.StatusCode != http.StatusNoContent || res.Header.Get(streamcore.HdrSnapshotDigest) != digest || res.Header.Get(streamcore.HdrSnapshotOffset) != off {
				t.Fatalf("commit: %d %v %s", res.StatusCode, res.Header, body)
			}
			res, body = coldDo(t, "GET", env.url(p+"/snapshot/"+off), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, whole) || res.Header.Get("Content-Type") != partsCT {
				t.Fatalf("snapshot read: %d, %d bytes (want %d)", res.StatusCode, len(body), len(whole))
			}
			res, body = coldDo(t, "GET", env.url(p+"/snapshot/"+off), nil, "Range", "bytes=9437180-9437190")
			if res.StatusCode != 206 || !bytes.Equal(body, whole[9437180:9437191]) {
				t.Fatalf("ranged read across a part boundary: %d", res.StatusCode)
			}
			if got := env.objects("/__parts/"); len(got) != 0 {
				t.Fatalf("parts left after the commit: %v", got)
			}
			// A repeat succeeds from the key although its parts are gone.
			res, body = env.commit(p, off, digest, 3, commitBody(ids...))
			if res.StatusCode != http.StatusNoContent || res.Header.Get(streamcore.HdrSnapshotDigest) != digest {
				t.Fatalf("repeat commit: %d %s", res.StatusCode, body)
			}
			// Other content at the same offset, and a superseded offset, answer 409 naming the latest.
			for _, o := range []string{off, streamcore.FormatOffset(100 << 10)} {
				res, body = env.commit(p, o, strings.Repeat("0", 64), 1, commitBody("nope"))
				wantErr(t, "conflicting commit", res, body, http.StatusConflict, streamcore.CodeSnapshotConflict)
				if res.Header.Get(streamcore.HdrSnapshotOffset) != off || res.Header.Get(streamcore.HdrSnapshotDigest) != digest {
					t.Fatalf("409 does not name the latest: %v", res.Header)
				}
			}
			// Superseded below retention: still 409 (before the retention check).
			if res, body = coldDo(t, "PUT", env.url(p+"/retention/"+off), nil); res.StatusCode != 204 {
				t.Fatalf("retain: %d %s", res.StatusCode, body)
			}
			res, body = env.commit(p, streamcore.FormatOffset(10), digest, 1, commitBody("x"))
			wantErr(t, "superseded commit below retention", res, body, http.StatusConflict, streamcore.CodeSnapshotConflict)
			if st := env.srv.ColdStats(); st.PartsCommitted != 1 || st.PartsStaged != 3 {
				t.Fatalf("stats: %+v", st)
			}
		})
	}
}

// TestSnapshotPartsRefusals: bad commits answer 400 with their code and change nothing;
// parts survive a 400 that copied nothing and go after a digest mismatch.
func TestSnapshotPartsRefusals(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 20, parts: ColdOptions{MaxSnapshotBytes: 1000}})
	p := "/bkt1/refuse"
	env.create(p, "application/octet-stream")
	env.appendAll(p, 0, 100<<10, 50<<10)
	a := env.stagePart(p, z0, []byte("hello "))
	bID := env.stagePart(p, z0, []byte("world"))
	off := streamcore.FormatOffset(50 << 10)
	good := SnapshotDigest(partsCT, []byte("hello world"))
	cases := []struct {
		name   string
		n      string
		digest string
		body   []byte
		status int
		code   string
	}{
		{"count zero", z0, good, commitBody(a), 400, streamcore.CodeInvalidPartsCommit},
		{"count leading zero", "02", good, commitBody(a, bID), 400, streamcore.CodeInvalidPartsCommit},
		{"count too big", "4097", good, commitBody(a), 400, streamcore.CodeInvalidPartsCommit},
		{"count mismatch", "3", good, commitBody(a, bID), 400, streamcore.CodeInvalidPartsCommit},
		{"no final LF", "2", good, []byte(a + "\n" + bID), 400, streamcore.CodeInvalidPartsCommit},
		{"CRLF", "2", good, []byte(a + "\r\n" + bID + "\r\n"), 400, streamcore.CodeInvalidPartsCommit},
		{"duplicate", "2", good, commitBody(a, a), 400, streamcore.CodeInvalidPartsCommit},
		{"id too long", "1", good, commitBody(strings.Repeat("a", 65)), 400, streamcore.CodeInvalidPartsCommit},
		{"list too long", "1", good, bytes.Repeat([]byte("a"), 4096*65+1), 400, streamcore.CodeInvalidPartsCommit},
		{"no digest", "2", "", commitBody(a, bID), 400, streamcore.CodeInvalidPartsCommit},
		{"unknown part", "2", good, commitBody(a, "0123456789abcdef0123456789abcdef"), 400, streamcore.CodeUnknownPart},
		{"path traversal id", "1", good, commitBody("../../x"), 400, streamcore.CodeUnknownPart},
	}
	for _, c := range cases {
		h := []string{"Content-Type", partsCT, streamcore.HdrSnapshotParts, c.n}
		if c.digest != "" {
			h = append(h, streamcore.HdrSnapshotDigest, c.digest)
		}
		res, body := coldDo(t, "PUT", env.url(p+"/snapshot/"+off), c.body, h...)
		wantErr(t, c.name, res, body, c.status, c.code)
	}
	if got := env.objects("/__parts/"); len(got) != 2 {
		t.Fatalf("parts after refusals that copied nothing: %v", got)
	}
	// Too large for the (lowered) bound: 413 naming Ursula-Max-Snapshot-Bytes.
	big := env.stagePart(p, z0, bytes.Repeat([]byte("z"), 1001))
	res, body := env.commit(p, off, good, 1, commitBody(big))
	wantErr(t, "too large", res, body, http.StatusRequestEntityTooLarge, streamcore.CodeSnapshotTooLarge)
	if res.Header.Get(streamcore.HdrMaxSnapshotBytes) != "1000" {
		t.Fatalf("413 without the bound: %v", res.Header)
	}
	// The parts of another stream are unknown here.
	env.create("/bkt1/other", "application/octet-stream")
	foreign := env.stagePart("/bkt1/other", z0, []byte("hello world"))
	res, body = env.commit(p, off, good, 1, commitBody(foreign))
	wantErr(t, "other stream's part", res, body, 400, streamcore.CodeUnknownPart)
	// Wrong digest: 400, and the copy used the parts up.
	res, body = env.commit(p, off, SnapshotDigest(partsCT, []byte("other")), 2, commitBody(a, bID))
	wantErr(t, "digest mismatch", res, body, 400, streamcore.CodeSnapshotDigest)
	res, body = env.commit(p, off, good, 2, commitBody(a, bID))
	wantErr(t, "parts after a mismatch", res, body, 400, streamcore.CodeUnknownPart)
	if res, _ := coldDo(t, "HEAD", env.url(p), nil); res.Header.Get(streamcore.HdrSnapshotOffset) != "" {
		t.Fatalf("a refused commit published: %v", res.Header)
	}
	if got := env.objects("/s/"); len(got) != 0 {
		t.Fatalf("snapshot objects after refused commits: %v", got)
	}
	// Bad offsets and missing streams.
	res, body = coldDo(t, "POST", env.url(p+"/snapshot/abc/parts"), []byte("x"))
	wantErr(t, "bad offset", res, body, 400, streamcore.CodeInvalidOffset)
	res, body = coldDo(t, "POST", env.url("/bkt1/missing/snapshot/"+z0+"/parts"), []byte("x"))
	wantErr(t, "missing stream part", res, body, 404, "NOT_FOUND")
	res, body = coldDo(t, "DELETE", env.url("/bkt1/missing/snapshot/parts"), nil)
	wantErr(t, "missing stream discard", res, body, 404, "NOT_FOUND")
	res, body = env.commit("/bkt1/missing", off, good, 1, commitBody(a))
	wantErr(t, "missing stream commit", res, body, 404, "NOT_FOUND")
	res, body = coldDo(t, "POST", env.url(p+"/snapshot/"+z0+"/parts"), []byte("x"), streamcore.HdrIncarnation, "4503599627370496")
	wantErr(t, "part precondition", res, body, 412, streamcore.CodeIncarnationMismatch)
	res, body = coldDo(t, "DELETE", env.url(p+"/snapshot/parts"), nil, streamcore.HdrIncarnation, "4503599627370496")
	wantErr(t, "discard precondition", res, body, 412, streamcore.CodeIncarnationMismatch)
}

// TestSnapshotPartsBoundAndDiscard: past the staged bound a part answers 429 with the
// bound and no Retry-After; a discard frees it; a recreated stream's commit of its old
// parts answers 400 unknown part, or 412 with the precondition.
func TestSnapshotPartsBoundAndDiscard(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 20, parts: ColdOptions{MaxStagedParts: 3, MaxStagedBytes: 100}})
	p := "/bkt1/bound"
	env.create(p, "application/octet-stream")
	env.appendAll(p, 0, 10<<10, 10<<10)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, env.stagePart(p, z0, []byte("part")))
	}
	res, body := coldDo(t, "POST", env.url(p+"/snapshot/"+z0+"/parts"), []byte("part"))
	wantErr(t, "4th part", res, body, http.StatusTooManyRequests, streamcore.CodeStagedPartsLimit)
	if res.Header.Get(streamcore.HdrMaxStagedParts) != "3" || res.Header.Get("Retry-After") != "" || res.Header.Get(streamcore.HdrIncarnation) == "" {
		t.Fatalf("429 headers: %v", res.Header)
	}
	res, _ = coldDo(t, "DELETE", env.url(p+"/snapshot/parts"), nil)
	if res.StatusCode != http.StatusNoContent || res.Header.Get(streamcore.HdrIncarnation) == "" || len(env.objects("/__parts/")) != 0 {
		t.Fatalf("discard: %d %v, left %v", res.StatusCode, res.Header, env.objects("/__parts/"))
	}
	res, body = env.commit(p, z0, SnapshotDigest(partsCT, []byte("partpartpart")), 3, commitBody(ids...))
	wantErr(t, "commit of discarded parts", res, body, 400, streamcore.CodeUnknownPart)
	// The byte bound, decided from Content-Length.
	res, body = coldDo(t, "POST", env.url(p+"/snapshot/"+z0+"/parts"), bytes.Repeat([]byte("b"), 101))
	wantErr(t, "bytes bound", res, body, http.StatusTooManyRequests, streamcore.CodeStagedPartsLimit)
	if res.Header.Get(streamcore.HdrMaxStagedBytes) != "100" {
		t.Fatalf("429 headers: %v", res.Header)
	}
	// A part of the old incarnation is not one of the new stream's.
	old := env.stagePart(p, z0, []byte("snap"))
	hd, _ := coldDo(t, "HEAD", env.url(p), nil)
	oldInc := hd.Header.Get(streamcore.HdrIncarnation)
	if res, body := coldDo(t, "DELETE", env.url(p), nil); res.StatusCode != 204 {
		t.Fatalf("delete: %d %s", res.StatusCode, body)
	}
	env.create(p, "application/octet-stream")
	env.appendAll(p, 0, 10<<10, 10<<10)
	d := SnapshotDigest(partsCT, []byte("snap"))
	res, body = env.commit(p, z0, d, 1, commitBody(old))
	wantErr(t, "old incarnation's part", res, body, 400, streamcore.CodeUnknownPart)
	res, body = env.commit(p, z0, d, 1, commitBody(old), streamcore.HdrIncarnation, oldInc)
	wantErr(t, "old incarnation with precondition", res, body, 412, streamcore.CodeIncarnationMismatch)
}

// TestSnapshotPartsConcurrentCommits: commits racing on one stream publish once; the
// others answer 503 in progress (retryable) or from the key.
func TestSnapshotPartsConcurrentCommits(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 20})
	p := "/bkt1/race"
	env.create(p, "application/octet-stream")
	env.appendAll(p, 0, 10<<10, 10<<10)
	whole := pattern(1, 24<<20)
	ids := []string{env.stagePart(p, z0, whole[:12<<20]), env.stagePart(p, z0, whole[12<<20:])}
	d := SnapshotDigest(partsCT, whole)
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				res, body := env.commit(p, z0, d, 2, commitBody(ids...))
				if res.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), streamcore.CodeCommitInProgress) && res.Header.Get("Retry-After") != "" {
					codes[i] = 503
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if codes[i] == 0 {
					codes[i] = res.StatusCode
				}
				if res.StatusCode != 204 {
					t.Errorf("commit %d: %d %s", i, res.StatusCode, body)
				}
				return
			}
		}()
	}
	wg.Wait()
	res, body := coldDo(t, "GET", env.url(p+"/snapshot/"+z0), nil)
	if res.StatusCode != 200 || !bytes.Equal(body, whole) {
		t.Fatalf("read: %d, %d bytes", res.StatusCode, len(body))
	}
	if got := env.objects("/s/"); len(got) != 1 {
		t.Fatalf("snapshot objects: %v (codes %v)", got, codes)
	}
}

// TestSnapshotPartsSweep: the collector reclaims parts no commit used after
// storage.cold.parts_grace (not after the 5-minute object grace), and a delete of the
// stream drops its parts at once.
func TestSnapshotPartsSweep(t *testing.T) {
	const partsGrace = 4 * time.Second
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 20, grace: 50 * time.Millisecond, partsGrace: partsGrace})
	env.create("/bkt1/sweep", "application/octet-stream")
	env.create("/bkt1/gone", "application/octet-stream")
	stagedAt := time.Now()
	env.stagePart("/bkt1/sweep", z0, []byte("orphan"))
	env.stagePart("/bkt1/gone", z0, []byte("deleted with its stream"))
	if res, b := coldDo(t, "DELETE", env.url("/bkt1/gone"), nil); res.StatusCode != 204 {
		t.Fatalf("delete: %d %s", res.StatusCode, b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(env.objects("/__parts/")) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted stream's part stays: %v", env.objects("/__parts/"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // many collector passes past the object grace
	// Checked only while the part is surely younger than parts_grace (a slow machine may
	// have spent the grace already).
	if got := env.objects("/__parts/"); len(got) != 1 && time.Since(stagedAt) < partsGrace-time.Second {
		t.Fatalf("a part went before parts_grace: %v", got)
	}
	for len(env.objects("/__parts/")) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan part stays past parts_grace: %v", env.objects("/__parts/"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// laggingLeader plays a node elected a moment ago: it leads (LeaderHint says so) but its
// state has not applied its predecessors' entries yet, so View sees an empty state until
// a ReadIndex (VerifyLeader) has brought it up to date, as the barrier of a new term does.
type laggingLeader struct {
	engine.Engine
	engine.Groups // the cold tier's need
	lagging       atomic.Bool
}

func (l *laggingLeader) LeaderHint(string) error { return nil }
func (l *laggingLeader) VerifyLeader(context.Context, string) error {
	l.lagging.Store(false)
	return nil
}
func (l *laggingLeader) View(key string, now int64, fn func(*streamcore.State, *streamcore.Stream)) {
	if l.lagging.Load() {
		fn(streamcore.NewState(), nil)
		return
	}
	l.Engine.View(key, now, fn)
}

// TestPartsOnNewLeaderWaitForItsState: the parts requests (stage, discard, commit) and the
// cold flush look the stream up before they propose anything, so on a replicated engine
// they confirm the leadership with a ReadIndex first. On a leader that has not applied its
// predecessors' entries, the bare leadership hint answered 404 BUCKET_NOT_FOUND for a
// stream that exists (seen in engine/raft's TestColdSnapshotPartsThreeVoters after a
// leadership transfer).
func TestPartsOnNewLeaderWaitForItsState(t *testing.T) {
	var ll *laggingLeader
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 20, flushInterval: time.Hour,
		wrapEngine: func(e engine.Engine) engine.Engine {
			ll = &laggingLeader{Engine: e, Groups: e.(engine.Groups)}
			return ll
		}})
	p := "/bkt1/newleader"
	env.create(p, "application/octet-stream")
	body := []byte(strings.Repeat("page", 1024))
	if res, b := coldDo(t, "POST", env.url(p), body, "Content-Type", "application/octet-stream"); res.StatusCode != http.StatusNoContent {
		t.Fatalf("append: %d %s", res.StatusCode, b)
	}
	off := streamcore.FormatOffset(uint64(len(body)))

	ll.lagging.Store(true)
	id := env.stagePart(p, off, body)

	ll.lagging.Store(true)
	res, b := coldDo(t, "DELETE", env.url(p+"/snapshot/parts"), nil)
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("discard: %d %s", res.StatusCode, b)
	}
	id = env.stagePart(p, off, body)

	ll.lagging.Store(true)
	digest := SnapshotDigest(partsCT, body)
	if res, b := env.commit(p, off, digest, 1, commitBody(id)); res.StatusCode != http.StatusNoContent || res.Header.Get(streamcore.HdrSnapshotDigest) != digest {
		t.Fatalf("commit: %d %s", res.StatusCode, b)
	}

	ll.lagging.Store(true)
	admin := httptest.NewServer(env.srv.AdminHandler())
	defer admin.Close()
	res, b = coldDo(t, "POST", admin.URL+"/__ursula/flush-cold"+p, nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("flush: %d %s", res.StatusCode, b)
	}
}

// TestDeleteOnNewLeaderDropsItsParts: a delete drops the staged parts of the incarnation
// it removed. That incarnation comes from the apply, not from a read before proposing: on
// a leader that has not applied its predecessors' entries the read found no stream, and
// the parts waited for storage.cold.parts_grace.
func TestDeleteOnNewLeaderDropsItsParts(t *testing.T) {
	var ll *laggingLeader
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 20, flushInterval: time.Hour, partsGrace: time.Hour,
		wrapEngine: func(e engine.Engine) engine.Engine {
			ll = &laggingLeader{Engine: e, Groups: e.(engine.Groups)}
			return ll
		}})
	env.create("/bkt1/kept", "application/octet-stream")
	env.create("/bkt1/gone", "application/octet-stream")
	env.stagePart("/bkt1/kept", z0, []byte("kept"))
	env.stagePart("/bkt1/gone", z0, []byte("deleted with its stream"))
	if got := env.objects("/__parts/"); len(got) != 2 {
		t.Fatalf("staged: %v", got)
	}
	ll.lagging.Store(true)
	if res, b := coldDo(t, "DELETE", env.url("/bkt1/gone"), nil); res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d %s", res.StatusCode, b)
	}
	ll.lagging.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := env.objects("/__parts/")
		if len(got) == 1 && strings.Contains(got[0], "kept") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("parts after the delete: %v (want only /bkt1/kept's)", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
