package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/coldtier/store/s3test"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Catch-up read throughput over loopback HTTP, 8 MiB responses, of a 64 MiB stream held
// in the hot tier, or flushed to the fs or s3 (versitygw) cold tier with the read cache
// off (every byte comes from the store). make bench runs these.

const benchStreamBytes = 64 << 20

func BenchmarkCatchUpHot(b *testing.B)    { benchCatchUp(b, "none") }
func BenchmarkCatchUpColdFS(b *testing.B) { benchCatchUp(b, "fs") }
func BenchmarkCatchUpColdS3(b *testing.B) { benchCatchUp(b, "s3") }

func benchCatchUp(b *testing.B, backend string) {
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "bench"})
	defer eng.Close()
	if backend != "none" {
		var store coldstore.Store
		var err error
		cfg := coldstore.Config{Backend: backend, Dir: "x", FlushInterval: coldstore.Duration(time.Hour), FlushSize: 8 << 20, CacheSize: 1}
		if backend == "fs" {
			store, err = coldstore.NewFS(b.TempDir())
		} else {
			gw := s3test.Start(b)
			cfg.S3 = gw.Config("bench")
			store, err = coldstore.NewS3(context.Background(), cfg.S3)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := srv.EnableCold(store, cfg, ColdOptions{}); err != nil {
			b.Fatal(err)
		}
		defer srv.StopCold()
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	url := ts.URL + "/bench/s"
	coldDo(b, "PUT", url, nil, "Content-Type", "application/octet-stream")
	for off := uint64(0); off < benchStreamBytes; off += 4 << 20 {
		if res, body := coldDo(b, "POST", url, pattern(off, 4<<20), "Content-Type", "application/octet-stream"); res.StatusCode != 204 {
			b.Fatal(res.StatusCode, string(body))
		}
	}
	if backend != "none" {
		if err := srv.FlushCold(true); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(benchStreamBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pos := uint64(0)
		for pos < benchStreamBytes {
			res, err := http.Get(url + "?offset=" + streamcore.FormatOffset(pos))
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || n == 0 {
				b.Fatal(res.StatusCode)
			}
			pos += uint64(n)
		}
	}
}
