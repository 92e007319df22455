package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/coldtier/store/s3test"
	"github.com/ursula-go/ursula/streamcore"
)

// Cold tier on the raft engine, with real processes and real HTTP.

// coldPattern is n deterministic pseudo-random bytes (every MiB differs).
func coldPattern(n int) []byte {
	r := rand.New(rand.NewPCG(42, 7))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// readFrom reads the stream at url from offset (a formatted offset or "-1") to the tail,
// following Stream-Next-Offset, from one node only (a redirect fails the read).
func readFrom(url, offset string) ([]byte, error) {
	var out []byte
	for {
		res, b, err := httpDo(http.MethodGet, url+"?offset="+offset, nil, nil)
		if err != nil {
			return nil, err
		}
		if res.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s?offset=%s: %d %s", url, offset, res.StatusCode, b)
		}
		out = append(out, b...)
		next := res.Header.Get(streamcore.HdrStreamNextOff)
		if next == "" {
			return nil, fmt.Errorf("no %s", streamcore.HdrStreamNextOff)
		}
		if res.Header.Get("Stream-Up-To-Date") == "true" || len(b) == 0 {
			return out, nil
		}
		offset = next
	}
}

func appendAll(t *testing.T, url string, data []byte, piece int) {
	t.Helper()
	ct := map[string]string{"Content-Type": "application/octet-stream"}
	if res, b, err := httpDo(http.MethodPut, url, nil, ct); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create %s: %v %v %s", url, err, res, b)
	}
	for i := 0; i < len(data); i += piece {
		chunk := data[i:min(i+piece, len(data))]
		for attempt := 0; ; attempt++ {
			res, b, err := httpDo(http.MethodPost, url, chunk, ct)
			if err != nil {
				t.Fatalf("append at %d: %v", i, err)
			}
			if res.StatusCode == http.StatusNoContent {
				break
			}
			// Backpressure while the flusher catches up: not applied, retry.
			if res.StatusCode == http.StatusServiceUnavailable && res.Header.Get(streamcore.HdrNotApplied) != "" && attempt < 200 {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			t.Fatalf("append at %d: %d %s", i, res.StatusCode, b)
		}
	}
}

func flushCold(t *testing.T, base, key string) string {
	t.Helper()
	res, b, err := httpDo(http.MethodPost, base+"/__ursula/flush-cold/"+key, nil, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("flush-cold on %s: %v %v %s", base, err, res, b)
	}
	var out struct {
		HotStart string `json:"hot_start_offset"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out.HotStart
}

type coldMetrics struct {
	Cold *struct {
		Backend        string `json:"backend"`
		FlushedBytes   uint64 `json:"cold_flushed_bytes"`
		FlushedObjects uint64 `json:"cold_flushed_objects"`
		ColdReadBytes  uint64 `json:"cold_read_bytes"`
	} `json:"cold"`
}

func metricsOf(t *testing.T, base string) coldMetrics {
	t.Helper()
	var m coldMetrics
	res, b, err := httpDo(http.MethodGet, base+"/__ursula/metrics", nil, nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("metrics: %v %v", err, res)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Cold == nil {
		t.Fatalf("%s has no cold tier: %s", base, b)
	}
	return m
}

// checkRandomReads reads random offsets of the stream at url and compares with want.
func checkRandomReads(t *testing.T, url string, want []byte, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(1, uint64(len(want))))
	for range n {
		off := r.IntN(len(want))
		got, err := readFrom(url, streamcore.FormatOffset(uint64(off)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[off:]) {
			t.Fatalf("read from %d: %d bytes, want %d (equal prefix: %v)", off, len(got), len(want)-off, bytes.HasPrefix(want[off:], got))
		}
	}
}

// TestColdSingleNodeDefaultKill9: `ursula server` on the raft engine with no
// [storage.cold] section runs the fs cold tier under <data_dir>/cold. 50 MiB are
// appended and flushed, the process is SIGKILLed and restarted, and the stream reads back
// byte-identical from the start and from random offsets.
func TestColdSingleNodeDefaultKill9(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 1, groups: 4})
	n := c.nodes[0]
	n.start()
	n.waitReady(20 * time.Second)
	data := coldPattern(50 << 20)
	url := n.url + "/coldb/big"
	appendAll(t, url, data, 1<<20)
	hot := flushCold(t, n.admin, "coldb/big")
	if hot != streamcore.FormatOffset(uint64(len(data))) {
		t.Fatalf("hot start after flush %s, want the tail %d", hot, len(data))
	}
	if m := metricsOf(t, n.url); m.Cold.Backend != "fs" || m.Cold.FlushedBytes != uint64(len(data)) {
		t.Fatalf("metrics: %+v", *m.Cold)
	}
	coldDir := filepath.Join(c.dir, "node1", "cold")
	var objects int
	filepath.Walk(coldDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && strings.Contains(p, string(filepath.Separator)+"c"+string(filepath.Separator)) {
			objects++
		}
		return nil
	})
	if objects == 0 {
		t.Fatalf("no chunk objects under %s", coldDir)
	}
	n.kill()
	n.start()
	n.waitReady(30 * time.Second)
	got, err := readFrom(url, "-1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("after kill -9: read %d bytes, want %d identical", len(got), len(data))
	}
	checkRandomReads(t, url, data, 8)
	if m := metricsOf(t, n.url); m.Cold.ColdReadBytes == 0 {
		t.Fatalf("the reads after the restart did not come from the cold tier: %+v", *m.Cold)
	}
	// The restarted node keeps flushing and serving: one more append reads back.
	more := coldPattern(3 << 20)[1<<20:]
	res, b, err := httpDo(http.MethodPost, url, more, map[string]string{"Content-Type": "application/octet-stream"})
	if err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("append after restart: %v %v %s", err, res, b)
	}
	flushCold(t, n.admin, "coldb/big")
	all := append(append([]byte(nil), data...), more...)
	checkRandomReads(t, url, all, 3)
}

// TestColdClusterFollowerReads: 3 voters share one fs cold directory. The group's leader
// flushes (the record goes through Raft, so every replica trims its hot buffer); a
// follower serves the flushed bytes from the shared store, byte-identical, and answers
// the flush endpoint with a redirect to the leader.
func TestColdClusterFollowerReads(t *testing.T) {
	coldClusterFollowerReads(t, fmt.Sprintf("backend = \"fs\"\ndir = %q\n", t.TempDir()), 12<<20)
}

// TestColdClusterFollowerReadsS3: the same on one S3 bucket (versitygw, coldtier/store/s3test).
func TestColdClusterFollowerReadsS3(t *testing.T) {
	gw := s3test.Start(t)
	cfg := gw.Config("cluster")
	coldClusterFollowerReads(t, fmt.Sprintf("backend = \"s3\"\n[storage.cold.s3]\nbucket = %q\nregion = %q\nendpoint = %q\nprefix = %q\naccess_key_id = %q\nsecret_access_key = %q\nserver_side_encryption = \"none\"\n",
		cfg.Bucket, cfg.Region, cfg.Endpoint, cfg.Prefix, cfg.AccessKeyID, cfg.SecretAccessKey), 6<<20)
}

func coldClusterFollowerReads(t *testing.T, backend string, size int) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: 2, raft: "heartbeat_timeout_ms = 500",
		extra: "[storage.cold]\nflush_size = \"1MiB\"\nflush_interval = \"200ms\"\n" + backend})
	c.startAll()
	key := "coldc/shared"
	g := fnvGroup(key, 2)
	leader := c.leaderOf(g, c.nodes[0])
	if leader == 0 {
		t.Fatal("no leader")
	}
	L, F := c.nodes[leader-1], c.nodes[leader%3]
	data := coldPattern(size)
	appendAll(t, L.url+"/"+key, data, 512<<10)
	if res, _, err := httpDo(http.MethodPost, F.url+"/__ursula/flush-cold/"+key, nil, nil); err != nil || res.StatusCode != http.StatusNotFound {
		t.Fatalf("flush-cold on a client listener: %v %v", err, res)
	}
	if res, _, err := httpDo(http.MethodPost, F.admin+"/__ursula/flush-cold/"+key, nil, nil); err != nil || res.StatusCode != http.StatusConflict {
		t.Fatalf("flush-cold on a follower: %v %v", err, res)
	}
	if hot := flushCold(t, L.admin, key); hot != streamcore.FormatOffset(uint64(len(data))) {
		t.Fatalf("hot start after flush %s", hot)
	}
	// The follower applies the records and reads the flushed bytes from the shared store.
	deadline := time.Now().Add(20 * time.Second)
	var got []byte
	var err error
	for {
		got, err = readFrom(F.url+"/"+key, "-1")
		if err == nil && bytes.Equal(got, data) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower read: %v, %d bytes of %d", err, len(got), len(data))
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkRandomReads(t, F.url+"/"+key, data, 5)
	if m := metricsOf(t, F.url); m.Cold.ColdReadBytes == 0 || m.Cold.FlushedBytes != 0 {
		t.Fatalf("follower metrics: %+v (it should read cold and flush nothing)", *m.Cold)
	}
}
