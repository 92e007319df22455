package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/racetest"

	"github.com/ursula-go/ursula/coldtier"
	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/coldtier/store/s3test"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Cold-tier tests through the real HTTP server. The s3 variants run against versitygw
// (test/s3/install.sh); the fs variants against a temporary directory.

type coldEnv struct {
	t     *testing.T
	srv   *Server
	ts    *httptest.Server
	store coldstore.Store
	gw    *s3test.Gateway
}

type coldSetup struct {
	flushSize, hotCap int64
	grace             time.Duration
	cacheSize         int64
	maxHotAge         time.Duration
	parts             ColdOptions // bounds of snapshot upload in parts (0: defaults)
	partsGrace        time.Duration
	flushInterval     time.Duration // 0: 20 ms
	backpressureWait  time.Duration // 0: a write over the cap is refused at once
	wrapStore         func(coldstore.Store) coldstore.Store
	wrapEngine        func(engine.Engine) engine.Engine
}

func newColdEnv(t *testing.T, backend string, cs coldSetup) *coldEnv {
	t.Helper()
	env := &coldEnv{t: t}
	var err error
	switch backend {
	case "fs":
		env.store, err = coldstore.NewFS(t.TempDir())
	case "s3":
		env.gw = s3test.Start(t)
		env.store, err = coldstore.NewS3(context.Background(), env.gw.Config("cold-test"))
	}
	if err != nil {
		t.Fatal(err)
	}
	if cs.wrapStore != nil {
		env.store = cs.wrapStore(env.store)
	}
	eng := engine.NewMemory(0)
	var served engine.Engine = eng
	if cs.wrapEngine != nil {
		served = cs.wrapEngine(eng)
	}
	env.srv = New(served, Config{ClusterID: "cold-cluster"})
	hot := coldstore.Size(cs.hotCap)
	interval := cs.flushInterval
	if interval == 0 {
		interval = 20 * time.Millisecond
	}
	cfg := coldstore.Config{Backend: backend, Dir: "unused", Root: "root", FlushInterval: coldstore.Duration(interval),
		FlushSize: coldstore.Size(cs.flushSize), FlushMaxConcurrency: 4, MaxHotSizePerGroup: &hot, CacheSize: coldstore.Size(cs.cacheSize),
		GCInterval: coldstore.Duration(50 * time.Millisecond), GCGrace: coldstore.Duration(cs.grace)}
	if backend == "s3" {
		cfg.S3 = env.gw.Config("cold-test")
	}
	if cs.maxHotAge > 0 {
		a := coldstore.Duration(cs.maxHotAge)
		cfg.FlushMaxHotAge = &a
	}
	cfg.PartsGrace = coldstore.Duration(cs.partsGrace)
	wait := coldstore.Duration(cs.backpressureWait)
	cfg.BackpressureWait = &wait
	if cs.grace == 0 {
		cfg.GCGrace = coldstore.Duration(time.Hour)
	}
	if err := env.srv.EnableCold(env.store, cfg, ColdOptions{BackoffMax: 300 * time.Millisecond,
		MaxSnapshotBytes: cs.parts.MaxSnapshotBytes, MaxStagedParts: cs.parts.MaxStagedParts, MaxStagedBytes: cs.parts.MaxStagedBytes}); err != nil {
		t.Fatal(err)
	}
	env.ts = httptest.NewServer(env.srv)
	t.Cleanup(func() { env.ts.Close(); env.srv.StopCold(); eng.Close() })
	return env
}

func (env *coldEnv) url(path string) string { return env.ts.URL + path }

// patternTable is 1 MiB of pseudo-random bytes; the stream byte at i is
// patternTable[(i + 7919*(i>>20)) mod 1 MiB]: every MiB is a different rotation, and
// building a range is a couple of copies (cheap under -race).
var patternTable = func() []byte {
	b := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(42, 42))
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}()

// pattern returns the deterministic stream bytes [off, off+n).
func pattern(off, n uint64) []byte {
	const mask = 1<<20 - 1
	out := make([]byte, 0, n)
	for pos := off; pos < off+n; {
		seg := pos >> 20
		segEnd := min((seg+1)<<20, off+n)
		idx := (pos + 7919*seg) & mask
		for pos < segEnd {
			k := copy(out[len(out):cap(out)][:min(segEnd-pos, uint64(len(patternTable))-idx)], patternTable[idx:])
			out = out[:len(out)+k]
			pos += uint64(k)
			idx = 0
		}
	}
	return out
}

func coldDo(t testing.TB, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	if strings.Contains(url, "/__ursula/") {
		req.Header.Set(HdrAdmin, "1") // admin mutations must be explicit
		if _, pinned := req.Header[HdrProcessIncarnation]; !pinned && method != "GET" && method != "HEAD" {
			req.Header.Set(HdrProcessIncarnation, ProcessIncarnation()) // and pinned to this run
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// appendAll appends the pattern [from, to) in pieces of piece bytes, retrying on
// ColdBackpressure; it returns how many 503s it saw.
func (env *coldEnv) appendAll(path string, from, to, piece uint64) int {
	t := env.t
	refusals := 0
	for off := from; off < to; {
		n := min(piece, to-off)
		res, body := coldDo(t, "POST", env.url(path), pattern(off, n), "Content-Type", "application/octet-stream")
		switch res.StatusCode {
		case http.StatusNoContent:
			off += n
		case http.StatusServiceUnavailable:
			if res.Header.Get("X-Ursula-Not-Applied") != "ColdBackpressure" || res.Header.Get("Retry-After") != "1" ||
				!strings.Contains(string(body), coldtier.CodeColdBackpressure) || res.Header.Get("X-Ursula-Not-Applied-Checked") != "" {
				t.Fatalf("503 without the ColdBackpressure marking: %v %s", res.Header, body)
			}
			refusals++
			time.Sleep(5 * time.Millisecond)
		default:
			t.Fatalf("append at %d: %d %s", off, res.StatusCode, body)
		}
	}
	return refusals
}

// readFrom reads the stream from off to tail with catch-up GETs and checks every byte.
func (env *coldEnv) readFrom(path string, off string, want uint64, tail uint64) {
	t := env.t
	pos := want
	for first := true; ; first = false {
		o := off
		if !first {
			o = streamcore.FormatOffset(pos)
		}
		res, body := coldDo(t, "GET", env.url(path+"?offset="+o), nil)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("read at %d: %d %s", pos, res.StatusCode, body)
		}
		if !bytes.Equal(body, pattern(pos, uint64(len(body)))) {
			t.Fatalf("read at %d: %d bytes differ from what was written", pos, len(body))
		}
		next, _ := streamcore.ParseOffset(res.Header.Get(streamcore.HdrStreamNextOff))
		if next != pos+uint64(len(body)) {
			t.Fatalf("read at %d: next offset %d after %d bytes", pos, next, len(body))
		}
		pos = next
		if res.Header.Get(streamcore.HdrStreamUpToDate) == "true" {
			break
		}
	}
	if pos != tail {
		t.Fatalf("read ended at %d, tail %d", pos, tail)
	}
}

func (env *coldEnv) create(path, ct string) {
	res, body := coldDo(env.t, "PUT", env.url(path), nil, "Content-Type", ct)
	if res.StatusCode != http.StatusCreated {
		env.t.Fatalf("create: %d %s", res.StatusCode, body)
	}
}

// TestColdFlushKickedByWrite: a write that finds its group holding a full piece
// (flush_size) wakes the flusher; with a flush_interval of an hour nothing else would.
func TestColdFlushKickedByWrite(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 4 << 20, flushInterval: time.Hour})
	env.create("/bkt1/kick", "application/octet-stream")
	env.appendAll("/bkt1/kick", 0, 64<<10, 32<<10) // a full piece, and no write after it
	time.Sleep(200 * time.Millisecond)
	if got := env.hotStart("bkt1/kick"); got != 0 {
		t.Fatalf("flushed before any write found a full piece: hot start %d", got)
	}
	env.appendAll("/bkt1/kick", 64<<10, 96<<10, 32<<10) // its admission sees 64 KiB hot
	for deadline := time.Now().Add(30 * time.Second); env.hotStart("bkt1/kick") < 64<<10; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the write over flush_size did not wake the flusher")
		}
	}
	if len(env.objects("kick")) == 0 {
		t.Fatal("hot start moved without a chunk object")
	}
	env.readFrom("/bkt1/kick", "-1", 0, 96<<10)
}

// gatedStore holds every Put of a chunk object until its gate is closed.
type gatedStore struct {
	coldstore.Store
	gate chan struct{}
}

func (g *gatedStore) Put(ctx context.Context, key string, body io.Reader, size int64) error {
	if !strings.Contains(key, "/c/") {
		return g.Store.Put(ctx, key, body, size)
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Store.Put(ctx, key, body, size)
}

// TestColdBackpressureWait: a write over the hot cap waits for the flusher (here held
// by its store) and goes ahead once the flush brings the group under the cap; while the
// store stays stuck, the write is refused once backpressure_wait is over, not applied.
func TestColdBackpressureWait(t *testing.T) {
	gate := make(chan struct{})
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 128 << 10, flushInterval: time.Hour,
		backpressureWait: 30 * time.Second, wrapStore: func(s coldstore.Store) coldstore.Store { return &gatedStore{Store: s, gate: gate} }})
	env.create("/bkt1/w", "application/octet-stream")
	env.appendAll("/bkt1/w", 0, 128<<10, 64<<10) // at the cap; the second write woke the flusher
	type answer struct {
		res  *http.Response
		body []byte
	}
	got := make(chan answer, 1)
	go func() {
		res, body := coldDo(t, "POST", env.url("/bkt1/w"), pattern(128<<10, 64<<10), "Content-Type", "application/octet-stream")
		got <- answer{res, body}
	}()
	// The held time counts from when the server first holds the write; wait for that,
	// then hold it 300ms more, so the counter below has a bound the test knows.
	for deadline := time.Now().Add(10 * time.Second); env.srv.ColdStats().BackpressureHeld == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the write over the cap was never held")
		}
	}
	select {
	case a := <-got:
		t.Fatalf("the write over the cap was answered while the flush was held: %d %s", a.res.StatusCode, a.body)
	case <-time.After(300 * time.Millisecond):
	}
	close(gate)
	a := <-got
	if a.res.StatusCode != http.StatusNoContent {
		t.Fatalf("the held write after the flush: %d %s", a.res.StatusCode, a.body)
	}
	env.readFrom("/bkt1/w", "-1", 0, 192<<10)
	if st := env.srv.ColdStats(); st.BackpressureHeld != 1 || st.BackpressureEvents != 0 || st.BackpressureHeldSec < 0.3 {
		t.Fatalf("after one write held about 300ms and let through: held %d for %.3fs, refused %d", st.BackpressureHeld, st.BackpressureHeldSec, st.BackpressureEvents)
	}
	if _, body := coldDo(t, "GET", env.url("/metrics"), nil); !strings.Contains(string(body), "ursula_cold_backpressure_held_total 1\n") {
		t.Fatalf("prometheus metrics lack the held write: %s", body)
	}

	// A store that never returns: the write waits backpressure_wait, then 503 not applied.
	stuck := make(chan struct{})
	env2 := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 64 << 10, flushInterval: time.Hour,
		backpressureWait: 400 * time.Millisecond, wrapStore: func(s coldstore.Store) coldstore.Store { return &gatedStore{Store: s, gate: stuck} }})
	env2.create("/bkt1/s", "application/octet-stream")
	env2.appendAll("/bkt1/s", 0, 64<<10, 64<<10)
	start := time.Now()
	res, body := coldDo(t, "POST", env2.url("/bkt1/s"), pattern(64<<10, 1), "Content-Type", "application/octet-stream")
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("X-Ursula-Not-Applied") != "ColdBackpressure" {
		t.Fatalf("write over the cap with the store stuck: %d %v %s", res.StatusCode, res.Header, body)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("refused after %v, before backpressure_wait (400ms)", waited)
	}
	if res, _ := coldDo(t, "HEAD", env2.url("/bkt1/s"), nil); res.Header.Get("Stream-Next-Offset") != streamcore.FormatOffset(64<<10) {
		t.Fatalf("the refused write changed the stream: next offset %q", res.Header.Get("Stream-Next-Offset"))
	}
	if st := env2.srv.ColdStats(); st.BackpressureHeld != 1 || st.BackpressureEvents != 1 || st.BackpressureHeldSec < 0.4 {
		t.Fatalf("after one write held 400ms and refused: held %d for %.3fs, refused %d", st.BackpressureHeld, st.BackpressureHeldSec, st.BackpressureEvents)
	}
	close(stuck)
}

func (env *coldEnv) objects(sub string) []string {
	var keys []string
	env.store.List(context.Background(), "root/cold-cluster/", func(o coldstore.ObjectInfo) bool {
		if strings.Contains(o.Key, sub) {
			keys = append(keys, o.Key)
		}
		return true
	})
	return keys
}

func (env *coldEnv) hotStart(key string) uint64 {
	var base uint64
	env.srv.engine.View(key, env.srv.now(), func(_ *streamcore.State, s *streamcore.Stream) {
		if s != nil {
			base = s.Data.Base()
		}
	})
	return base
}

func backends() []string { return []string{"fs", "s3"} }

// TestColdReadsSpanTiers: catch-up from -1 and from random offsets, small windows,
// long-poll, SSE and immutable chunk reads all return the written bytes across tiers.
func TestColdReadsSpanTiers(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			env := newColdEnv(t, b, coldSetup{flushSize: 256 << 10, hotCap: 4 << 20, cacheSize: 1 << 20})
			env.create("/bkt1/bin", "application/octet-stream")
			const total = 3<<20 + 12345
			env.appendAll("/bkt1/bin", 0, total, 100_000)
			if err := env.srv.FlushCold(false); err != nil {
				t.Fatal(err)
			}
			if hs := env.hotStart("bkt1/bin"); hs < 2<<20 {
				t.Fatalf("hot start %d after a flush", hs)
			}
			env.readFrom("/bkt1/bin", "-1", 0, total)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 20; i++ {
				off := rng.Uint64N(total)
				n := 1 + rng.Uint64N(700_000)
				res, body := coldDo(t, "GET", env.url(fmt.Sprintf("/bkt1/bin?offset=%s&max_bytes=%d", streamcore.FormatOffset(off), n)), nil)
				if res.StatusCode != 200 || !bytes.Equal(body, pattern(off, min(n, total-off))) {
					t.Fatalf("read %d+%d: %d, %d bytes, mismatch", off, n, res.StatusCode, len(body))
				}
			}
			// Long-poll from a cold offset answers at once with cold bytes.
			res, body := coldDo(t, "GET", env.url("/bkt1/bin?offset="+streamcore.FormatOffset(1000)+"&live=long-poll&max_bytes=5000"), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, pattern(1000, 5000)) {
				t.Fatalf("long-poll: %d %d", res.StatusCode, len(body))
			}
			// Immutable chunk resource of a cold chunk.
			inc := res.Header.Get(streamcore.HdrIncarnation)
			res, body = coldDo(t, "GET", env.url("/bkt1/bin/incarnation/"+inc+"/chunk/"+streamcore.FormatOffset(0)), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, pattern(0, streamcore.ChunkGrid)[:len(body)]) || len(body) != min(total, streamcore.ChunkGrid) {
				t.Fatalf("immutable chunk: %d %d", res.StatusCode, len(body))
			}

			// A JSON stream: SSE catch-up and compat-style whole messages across tiers.
			env.create("/bkt1/json", "application/json")
			var all bytes.Buffer
			for i := 0; i < 3000; i++ {
				msg := fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", i%97))
				all.WriteString(msg + "\n")
				res, body := coldDo(t, "POST", env.url("/bkt1/json"), []byte(msg), "Content-Type", "application/json")
				if res.StatusCode != 204 {
					t.Fatalf("json append: %d %s", res.StatusCode, body)
				}
			}
			if err := env.srv.FlushCold(true); err != nil {
				t.Fatal(err)
			}
			if env.hotStart("bkt1/json") != uint64(all.Len()) {
				t.Fatalf("json stream not fully flushed: hot start %d of %d", env.hotStart("bkt1/json"), all.Len())
			}
			res, body = coldDo(t, "GET", env.url("/bkt1/json?offset=-1"), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, all.Bytes()) {
				t.Fatalf("json catch-up: %d, %d bytes of %d", res.StatusCode, len(body), all.Len())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", env.url("/bkt1/json?offset=-1&live=sse&max_bytes=10000"), nil)
			sres, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			events := streamcore.NewSSEReader(sres.Body)
			for got.Len() < all.Len() {
				ev, err := events.Next()
				if err != nil {
					t.Fatalf("sse: %v after %d bytes", err, got.Len())
				}
				if ev.Type == "data" {
					got.Write(ev.Data)
				}
			}
			sres.Body.Close()
			if !bytes.Equal(got.Bytes(), all.Bytes()) {
				t.Fatalf("sse catch-up differs")
			}
			// Snapshot + retention at a cold offset need the cold boundary check.
			boundary := uint64(bytes.Index(all.Bytes(), []byte(`{"i":1000,`)))
			res, body = coldDo(t, "PUT", env.url("/bkt1/json/snapshot/"+streamcore.FormatOffset(boundary)), []byte(`{"state":1}`), "Content-Type", "application/json")
			if res.StatusCode != 204 {
				t.Fatalf("snapshot at a cold boundary: %d %s", res.StatusCode, body)
			}
			res, body = coldDo(t, "PUT", env.url("/bkt1/json/snapshot/"+streamcore.FormatOffset(boundary+1)), []byte(`{"state":1}`), "Content-Type", "application/json")
			if res.StatusCode != 400 {
				t.Fatalf("snapshot inside a cold message: %d %s", res.StatusCode, body)
			}
			res, body = coldDo(t, "PUT", env.url("/bkt1/json/retention/"+streamcore.FormatOffset(boundary)), nil)
			if res.StatusCode != 204 {
				t.Fatalf("retention at a cold boundary: %d %s", res.StatusCode, body)
			}
			res, body = coldDo(t, "GET", env.url("/bkt1/json?offset="+streamcore.FormatOffset(boundary)), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, all.Bytes()[boundary:]) {
				t.Fatalf("read from the retained offset: %d", res.StatusCode)
			}
		})
	}
}

// coldLargeBytes is the size of the large-stream test: 256 MiB, or 48 MiB under -short
// or -race.
func coldLargeBytes() uint64 {
	if testing.Short() || racetest.Enabled { // the race detector slows byte shuffling about tenfold
		return 48 << 20
	}
	return 256 << 20
}

// TestColdS3LargeStream writes a stream of a few hundred MB through the HTTP server while
// the flusher moves it to versitygw, then reads it back byte-identical from offset -1 and
// from random offsets.
func TestColdS3LargeStream(t *testing.T) {
	env := newColdEnv(t, "s3", coldSetup{flushSize: 8 << 20, hotCap: 64 << 20, cacheSize: 32 << 20})
	env.create("/bkt1/big", "application/octet-stream")
	total := coldLargeBytes()
	start := time.Now()
	refusals := env.appendAll("/bkt1/big", 0, total, 4<<20)
	wrote := time.Since(start)
	st := env.srv.ColdStats()
	if st.MaxGroupHotBytes > 64<<20+4<<20 {
		t.Fatalf("group hot bytes %d went past the cap", st.MaxGroupHotBytes)
	}
	if total-env.hotStart("bkt1/big") > 64<<20+8<<20 {
		t.Fatalf("flusher fell behind: hot start %d of %d", env.hotStart("bkt1/big"), total)
	}
	start = time.Now()
	env.readFrom("/bkt1/big", "-1", 0, total)
	read := time.Since(start)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 25; i++ {
		off := rng.Uint64N(total)
		res, body := coldDo(t, "GET", env.url("/bkt1/big?offset="+streamcore.FormatOffset(off)), nil)
		if res.StatusCode != 200 || !bytes.Equal(body, pattern(off, uint64(len(body)))) || len(body) == 0 {
			t.Fatalf("read at %d: %d, %d bytes, mismatch", off, res.StatusCode, len(body))
		}
	}
	t.Logf("%d MiB: append %.0f MB/s (%d backpressure refusals), catch-up read %.0f MB/s; %d objects flushed",
		total>>20, float64(total)/wrote.Seconds()/1e6, refusals, float64(total)/read.Seconds()/1e6, env.srv.ColdStats().FlushedObjects)
}

// TestColdS3Outage: with the store down, appends continue until the per-group hot cap,
// then answer 503 ColdBackpressure; when the store returns, the flusher recovers and
// nothing is lost.
func TestColdS3Outage(t *testing.T) {
	env := newColdEnv(t, "s3", coldSetup{flushSize: 256 << 10, hotCap: 2 << 20, cacheSize: 1 << 20})
	env.create("/bkt1/out", "application/octet-stream")
	env.appendAll("/bkt1/out", 0, 1<<20, 64<<10)
	if err := env.srv.FlushCold(true); err != nil {
		t.Fatal(err)
	}
	env.gw.Stop()
	// Append until refused.
	off := uint64(1 << 20)
	refused := false
	for i := 0; i < 200 && !refused; i++ {
		res, body := coldDo(t, "POST", env.url("/bkt1/out"), pattern(off, 64<<10), "Content-Type", "application/octet-stream")
		switch res.StatusCode {
		case 204:
			off += 64 << 10
		case 503:
			if res.Header.Get("X-Ursula-Not-Applied") != "ColdBackpressure" || res.Header.Get("Retry-After") != "1" {
				t.Fatalf("503 without marking: %v %s", res.Header, body)
			}
			refused = true
		default:
			t.Fatalf("append: %d %s", res.StatusCode, body)
		}
	}
	if !refused {
		t.Fatal("appends were never refused while the store was down")
	}
	if off-(1<<20) < 2<<20-64<<10 {
		t.Fatalf("refused after only %d bytes; the cap is 2 MiB", off-(1<<20))
	}
	for deadline := time.Now().Add(30 * time.Second); env.srv.ColdStats().FlushWriteErrors == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no flush write error was counted while the store was down")
		}
	}
	// Reads of the hot tail still work; reads of cold bytes fail with 502.
	res, _ := coldDo(t, "GET", env.url("/bkt1/out?offset="+streamcore.FormatOffset(off-10)), nil)
	if res.StatusCode != 200 {
		t.Fatalf("hot read during the outage: %d", res.StatusCode)
	}
	env.srv.cold.DropCache() // forget cached cold blocks
	res, body := coldDo(t, "GET", env.url("/bkt1/out?offset=-1"), nil)
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), coldtier.CodeColdStoreFailed) {
		t.Fatalf("cold read during the outage: %d %s", res.StatusCode, body)
	}
	time.Sleep(300 * time.Millisecond)
	if err := env.gw.Restart(); err != nil {
		t.Fatal(err)
	}
	// Writes pass again once the flush catches up (retry as a client would).
	final := off + 3<<20
	env.appendAll("/bkt1/out", off, final, 64<<10)
	env.readFrom("/bkt1/out", "-1", 0, final)
	if env.hotStart("bkt1/out") == 0 {
		t.Fatal("nothing was flushed after the store came back")
	}
}

// TestColdRetentionGC: retention makes the chunks below it and superseded snapshot bodies
// collectable; they are deleted after the grace period, the rest stays readable.
func TestColdRetentionGC(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			env := newColdEnv(t, b, coldSetup{flushSize: 64 << 10, hotCap: 4 << 20, grace: 400 * time.Millisecond})
			env.create("/bkt1/gc", "application/octet-stream")
			env.appendAll("/bkt1/gc", 0, 1<<20, 64<<10)
			if err := env.srv.FlushCold(true); err != nil {
				t.Fatal(err)
			}
			chunks := env.objects("/c/")
			if len(chunks) != 16 {
				t.Fatalf("%d chunks, want 16: %v", len(chunks), chunks)
			}
			snap1 := pattern(7, 2<<20) // >= 1 MiB: stored as an object
			res, body := coldDo(t, "PUT", env.url("/bkt1/gc/snapshot/"+streamcore.FormatOffset(256<<10)), snap1, "Content-Type", "application/octet-stream")
			if res.StatusCode != 204 {
				t.Fatalf("snapshot: %d %s", res.StatusCode, body)
			}
			snap2 := pattern(9, 1<<20)
			res, body = coldDo(t, "PUT", env.url("/bkt1/gc/snapshot/"+streamcore.FormatOffset(512<<10)), snap2, "Content-Type", "application/octet-stream")
			if res.StatusCode != 204 {
				t.Fatalf("snapshot 2: %d %s", res.StatusCode, body)
			}
			res, body = coldDo(t, "PUT", env.url("/bkt1/gc/retention/"+streamcore.FormatOffset(512<<10)), nil)
			if res.StatusCode != 204 {
				t.Fatalf("retention: %d %s", res.StatusCode, body)
			}
			// Hold a read of a doomed chunk in flight: pinned objects survive the grace.
			doomed := chunks[0]
			env.srv.cold.Pin(doomed)
			deadline := time.Now().Add(60 * time.Second)
			for {
				if len(env.objects("/c/")) == 9 && len(env.objects("/s/")) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the grace: chunks %v snapshots %v", env.objects("/c/"), env.objects("/s/"))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, err := env.store.Head(context.Background(), doomed); err != nil {
				t.Fatalf("a pinned chunk was deleted: %v", err)
			}
			env.srv.cold.Unpin(doomed)
			for len(env.objects("/c/")) != 8 {
				if time.Now().After(deadline) {
					t.Fatalf("unpinned chunk stays: %v", env.objects("/c/"))
				}
				time.Sleep(50 * time.Millisecond)
			}
			env.readFrom("/bkt1/gc", streamcore.FormatOffset(512<<10), 512<<10, 1<<20)
			res, body = coldDo(t, "GET", env.url("/bkt1/gc/snapshot/"+streamcore.FormatOffset(512<<10)), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, snap2) {
				t.Fatalf("latest snapshot after GC: %d, %d bytes", res.StatusCode, len(body))
			}
			// Deleting the stream makes everything collectable.
			res, _ = coldDo(t, "DELETE", env.url("/bkt1/gc"), nil)
			if res.StatusCode != 204 {
				t.Fatalf("delete: %d", res.StatusCode)
			}
			for len(env.objects("")) != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("objects of a deleted stream stay: %v", env.objects(""))
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestColdSnapshotBootstrap: a snapshot body of at least 1 MiB is stored as an object;
// snapshot reads (whole and ranged) and bootstrap return it byte-identical, and the
// bootstrap updates come from both tiers.
func TestColdSnapshotBootstrap(t *testing.T) {
	for _, b := range backends() {
		t.Run(b, func(t *testing.T) {
			env := newColdEnv(t, b, coldSetup{flushSize: 64 << 10, hotCap: 4 << 20})
			env.create("/bkt1/snap", "application/octet-stream")
			env.appendAll("/bkt1/snap", 0, 600<<10, 50<<10)
			snap := pattern(12345, 3<<20+17)
			res, body := coldDo(t, "PUT", env.url("/bkt1/snap/snapshot/"+streamcore.FormatOffset(100<<10)), snap, "Content-Type", "application/x-sqlite3")
			if res.StatusCode != 204 {
				t.Fatalf("snapshot: %d %s", res.StatusCode, body)
			}
			if keys := env.objects("/s/"); len(keys) != 1 {
				t.Fatalf("snapshot objects: %v", keys)
			}
			// Repeating the publish stores nothing new.
			res, _ = coldDo(t, "PUT", env.url("/bkt1/snap/snapshot/"+streamcore.FormatOffset(100<<10)), snap, "Content-Type", "application/x-sqlite3")
			if res.StatusCode != 204 || len(env.objects("/s/")) != 1 {
				t.Fatalf("repeat publish: %d, objects %v", res.StatusCode, env.objects("/s/"))
			}
			if err := env.srv.FlushCold(true); err != nil {
				t.Fatal(err)
			}
			env.appendAll("/bkt1/snap", 600<<10, 700<<10, 50<<10) // a hot tail after the cold part
			res, body = coldDo(t, "GET", env.url("/bkt1/snap/snapshot/"+streamcore.FormatOffset(100<<10)), nil)
			if res.StatusCode != 200 || !bytes.Equal(body, snap) || res.Header.Get("Content-Type") != "application/x-sqlite3" {
				t.Fatalf("snapshot read: %d, %d bytes", res.StatusCode, len(body))
			}
			res, body = coldDo(t, "GET", env.url("/bkt1/snap/snapshot/"+streamcore.FormatOffset(100<<10)), nil, "Range", "bytes=1000-2999")
			if res.StatusCode != 206 || !bytes.Equal(body, snap[1000:3000]) {
				t.Fatalf("ranged snapshot read: %d, %d bytes", res.StatusCode, len(body))
			}
			res, body = coldDo(t, "GET", env.url("/bkt1/snap/bootstrap"), nil)
			if res.StatusCode != 200 {
				t.Fatalf("bootstrap: %d %s", res.StatusCode, body)
			}
			parts, err := streamcore.ReadMultipart(res.Header.Get("Content-Type"), bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if len(parts) != 2 || !bytes.Equal(parts[0].Body, snap) || !bytes.Equal(parts[1].Body, pattern(100<<10, 600<<10)) {
				t.Fatalf("bootstrap parts: %d", len(parts))
			}
			if res.Header.Get(streamcore.HdrStreamUpToDate) != "true" {
				t.Fatalf("bootstrap not up to date: %v", res.Header)
			}
		})
	}
}

// TestColdFork: a fork whose fork point lies inside a cold chunk of its source reads the
// source's bytes below it, then its own, across tiers, also after its own flush.
func TestColdFork(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 4 << 20, cacheSize: 1 << 20})
	env.create("/bkt1/src", "application/octet-stream")
	env.appendAll("/bkt1/src", 0, 512<<10, 50_000)
	if err := env.srv.FlushCold(true); err != nil {
		t.Fatal(err)
	}
	forkAt := uint64(100_000) // inside the chunk [65536, 131072)
	res, body := coldDo(t, "PUT", env.url("/bkt1/fork"), nil, "Content-Type", "application/octet-stream",
		streamcore.HdrForkedFrom, "/bkt1/src", streamcore.HdrForkOffset, streamcore.FormatOffset(forkAt))
	if res.StatusCode != 201 {
		t.Fatalf("fork: %d %s", res.StatusCode, body)
	}
	own := bytes.Repeat([]byte("fork!"), 40_000)
	if res, body := coldDo(t, "POST", env.url("/bkt1/fork"), own, "Content-Type", "application/octet-stream"); res.StatusCode != 204 {
		t.Fatalf("fork append: %d %s", res.StatusCode, body)
	}
	want := append(pattern(0, forkAt), own...)
	check := func(when string) {
		t.Helper()
		var got []byte
		for pos := uint64(0); pos < uint64(len(want)); {
			res, body := coldDo(t, "GET", env.url("/bkt1/fork?max_bytes=30000&offset="+streamcore.FormatOffset(pos)), nil)
			if res.StatusCode != 200 || len(body) == 0 {
				t.Fatalf("%s: read at %d: %d", when, pos, res.StatusCode)
			}
			got = append(got, body...)
			pos += uint64(len(body))
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: fork bytes differ", when)
		}
	}
	check("before the fork's flush")
	if err := env.srv.FlushCold(true); err != nil {
		t.Fatal(err)
	}
	if env.hotStart("bkt1/fork") != uint64(len(want)) {
		t.Fatalf("fork not flushed: hot start %d", env.hotStart("bkt1/fork"))
	}
	check("after the fork's flush")
	env.readFrom("/bkt1/src", "-1", 0, 512<<10)
}

func TestColdMetrics(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 64 << 10, hotCap: 4 << 20})
	env.create("/bkt1/m", "application/octet-stream")
	env.appendAll("/bkt1/m", 0, 200<<10, 50<<10)
	if err := env.srv.FlushCold(true); err != nil {
		t.Fatal(err)
	}
	_, body := coldDo(t, "GET", env.url("/__ursula/metrics"), nil)
	if !strings.Contains(string(body), `"cold_flushed_bytes":204800`) {
		t.Fatalf("metrics: %s", body)
	}
	_, body = coldDo(t, "GET", env.url("/metrics"), nil)
	if !strings.Contains(string(body), "ursula_cold_flushed_bytes_total 204800") {
		t.Fatalf("prometheus metrics: %s", body)
	}
}

func TestColdFlushEndpoint(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 1 << 20, hotCap: 4 << 20})
	env.create("/bkt1/f1", "application/octet-stream")
	env.create("/bkt1/f2", "application/octet-stream")
	env.appendAll("/bkt1/f1", 0, 300<<10, 100<<10)
	env.appendAll("/bkt1/f2", 0, 300<<10, 100<<10)
	// An admin endpoint: the client listener refuses it, the admin listener serves it.
	if res, _ := coldDo(t, "POST", env.url("/__ursula/flush-cold/bkt1/f1"), nil); res.StatusCode != 404 {
		t.Fatalf("flush-cold on the client listener: %d", res.StatusCode)
	}
	admin := httptest.NewServer(env.srv.AdminHandler())
	defer admin.Close()
	res, body := coldDo(t, "POST", admin.URL+"/__ursula/flush-cold/bkt1/f1", nil)
	if res.StatusCode != 200 || !strings.Contains(string(body), streamcore.FormatOffset(300<<10)) {
		t.Fatalf("flush-cold: %d %s", res.StatusCode, body)
	}
	if res, _ := coldDo(t, "HEAD", env.url("/bkt1/f1"), nil); res.Header.Get(coldtier.HdrColdHotStart) != streamcore.FormatOffset(300<<10) {
		t.Fatalf("HEAD %s: %q", coldtier.HdrColdHotStart, res.Header.Get(coldtier.HdrColdHotStart))
	}
	if env.hotStart("bkt1/f1") != 300<<10 || env.hotStart("bkt1/f2") != 0 {
		t.Fatalf("hot starts %d %d", env.hotStart("bkt1/f1"), env.hotStart("bkt1/f2"))
	}
	env.readFrom("/bkt1/f1", "-1", 0, 300<<10)
	if res, _ := coldDo(t, "POST", admin.URL+("/__ursula/flush-cold/bkt1/nope"), nil); res.StatusCode != 404 {
		t.Fatalf("missing stream: %d", res.StatusCode)
	}
}

// TestColdMaxHotAge: a small stream below every threshold is flushed once its hot tail
// is older than flush_max_hot_age.
func TestColdMaxHotAge(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 1 << 20, hotCap: 4 << 20, maxHotAge: 200 * time.Millisecond})
	env.create("/bkt1/aged", "application/octet-stream")
	env.appendAll("/bkt1/aged", 0, 1000, 1000)
	for deadline := time.Now().Add(30 * time.Second); env.hotStart("bkt1/aged") != 1000; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the aged tail was never flushed")
		}
	}
	env.readFrom("/bkt1/aged", "-1", 0, 1000)
}

func TestColdFormatMarker(t *testing.T) {
	dir := t.TempDir()
	st, _ := coldstore.NewFS(dir)
	cfg := coldstore.Config{Backend: "fs", Dir: dir, Root: "r1"}
	srv := New(engine.NewMemory(0), Config{ClusterID: "c1"})
	if err := srv.EnableCold(st, cfg, ColdOptions{}); err != nil {
		t.Fatal(err)
	}
	srv.StopCold()
	if _, err := st.Head(context.Background(), "r1/"+coldtier.FormatMarker); err != nil {
		t.Fatalf("no marker written: %v", err)
	}
	// Same root again: accepted.
	srv = New(engine.NewMemory(0), Config{ClusterID: "c1"})
	if err := srv.EnableCold(st, cfg, ColdOptions{}); err != nil {
		t.Fatal(err)
	}
	srv.StopCold()
	// A root holding someone else's objects: refused.
	st.Put(context.Background(), "r2/other", strings.NewReader("x"), 1)
	cfg.Root = "r2"
	err := New(engine.NewMemory(0), Config{ClusterID: "c1"}).EnableCold(st, cfg, ColdOptions{})
	if err == nil || !strings.Contains(err.Error(), "is not empty and has no URSULA_FORMAT_EPOCH marker") {
		t.Fatalf("foreign root: %v", err)
	}
	st.Put(context.Background(), "r3/"+coldtier.FormatMarker, strings.NewReader("3\n"), 2)
	cfg.Root = "r3"
	err = New(engine.NewMemory(0), Config{ClusterID: "c1"}).EnableCold(st, cfg, ColdOptions{})
	if err == nil || !strings.Contains(err.Error(), "is format epoch") {
		t.Fatalf("other epoch: %v", err)
	}
}

// TestColdConcurrent shakes appends, flushes, tiered reads, retention and the collector
// together (run it with -race): every byte a read returns is the byte written there.
func TestColdConcurrent(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 16 << 10, hotCap: 8 << 20, cacheSize: 256 << 10, grace: 50 * time.Millisecond, maxHotAge: 20 * time.Millisecond})
	streams := []string{"/bkt1/c1", "/bkt1/c2"}
	for _, p := range streams {
		env.create(p, "application/octet-stream")
	}
	stop := make(chan struct{})
	errs := make(chan error, 16)
	done := make(chan struct{})
	var running int
	goFn := func(f func() error) {
		running++
		go func() {
			defer func() { done <- struct{}{} }()
			if err := f(); err != nil {
				errs <- err
			}
		}()
	}
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for _, p := range streams {
		p := p
		goFn(func() error { // writer
			for off := uint64(0); !stopped(); {
				n := uint64(1 + (off*7919)%20000)
				res, body := coldDo(t, "POST", env.url(p), pattern(off, n), "Content-Type", "application/octet-stream")
				switch res.StatusCode {
				case 204:
					off += n
				case 503:
					time.Sleep(time.Millisecond)
				default:
					return fmt.Errorf("append %s: %d %s", p, res.StatusCode, body)
				}
			}
			return nil
		})
		goFn(func() error { // reader
			rng := rand.New(rand.NewPCG(uint64(len(p)), 9))
			for !stopped() {
				res, _ := coldDo(t, "HEAD", env.url(p), nil)
				tail, _ := streamcore.ParseOffset(res.Header.Get(streamcore.HdrStreamNextOff))
				if tail == 0 {
					continue
				}
				off := rng.Uint64N(tail)
				res, body := coldDo(t, "GET", env.url(fmt.Sprintf("%s?offset=%s&max_bytes=%d", p, streamcore.FormatOffset(off), 1+rng.Uint64N(100000))), nil)
				switch res.StatusCode {
				case 200:
					if !bytes.Equal(body, pattern(off, uint64(len(body)))) {
						return fmt.Errorf("read %s at %d: %d bytes differ", p, off, len(body))
					}
				case 410: // below retention meanwhile
				default:
					return fmt.Errorf("read %s at %d: %d %s", p, off, res.StatusCode, body)
				}
			}
			return nil
		})
		goFn(func() error { // snapshot + retention
			for !stopped() {
				time.Sleep(30 * time.Millisecond)
				res, _ := coldDo(t, "HEAD", env.url(p), nil)
				tail, _ := streamcore.ParseOffset(res.Header.Get(streamcore.HdrStreamNextOff))
				at := tail / 2
				res, body := coldDo(t, "PUT", env.url(p+"/snapshot/"+streamcore.FormatOffset(at)), pattern(at, 1<<20+at%1000), "Content-Type", "application/octet-stream")
				if res.StatusCode != 204 && res.StatusCode != 409 {
					return fmt.Errorf("snapshot %s at %d: %d %s", p, at, res.StatusCode, body)
				}
				if res.StatusCode == 204 {
					if res, body := coldDo(t, "PUT", env.url(p+"/retention/"+streamcore.FormatOffset(at)), nil); res.StatusCode != 204 {
						return fmt.Errorf("retention %s at %d: %d %s", p, at, res.StatusCode, body)
					}
				}
			}
			return nil
		})
	}
	// Run at least 3 s, and on a loaded machine until every part of the tier has worked.
	exercised := func(st coldtier.Stats) bool {
		return st.FlushedObjects > 0 && st.GCDeletedObjects > 0 && st.ColdReadBytes > 0
	}
	time.Sleep(3 * time.Second)
	for deadline := time.Now().Add(60 * time.Second); !exercised(env.srv.ColdStats()) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	for ; running > 0; running-- {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := env.srv.ColdStats()
	if !exercised(st) {
		t.Fatalf("the run did not exercise the cold tier: %+v", st)
	}
	t.Logf("%+v", st)
	env.srv.StopCold()
	if n := env.srv.ColdStats().PinnedObjectsInRead; n != 0 {
		t.Fatalf("%d objects still pinned with no read or flush running", n)
	}
}
