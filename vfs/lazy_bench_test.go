package vfs

import (
	"context"
	"database/sql"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// countingTransport counts the response bytes it reads.
type countingTransport struct {
	n atomic.Int64
}

// benchTransport keeps enough idle connections for the lazy reader's parallel fetches
// (the default keeps 2 a host, so a third fetch would dial anew each time).
var benchTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}()

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := benchTransport.RoundTrip(r)
	if err == nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &c.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// BenchmarkLazyOpen compares, on one database of URSULA_BENCH_LAZY_MB MiB (default 64)
// with a snapshot, the first point lookup after a lazy open with the same lookup after a
// full download, and the bytes each fetched; then 100 random point lookups (lazy), a
// full scan (lazy, and on the downloaded file), and the heap the open lazy database
// holds after a collection (against its page cache bound) and grew by at most. The sub-benchmark hot reads from the server's memory; s3 from a server whose
// cold tier is S3 (versitygw; skipped when it is not installed).
//
//	URSULA_BENCH_LAZY_MB=1024 go test -run '^$' -bench LazyOpen -benchtime 1x ./vfs
func BenchmarkLazyOpen(b *testing.B) {
	quiet(b)
	mb := 64
	if s := os.Getenv("URSULA_BENCH_LAZY_MB"); s != "" {
		mb, _ = strconv.Atoi(s)
	}
	b.Run("hot", func(b *testing.B) { lazyBench(b, startServer(b)+"/bench/lazy", mb) })
	b.Run("s3", func(b *testing.B) {
		base, _ := s3ColdServer(b, "lazybench", 8<<20)
		lazyBench(b, base+"/bench/lazy", mb)
	})
}

func lazyBench(b *testing.B, streamURL string, mb int) {
	dir := b.TempDir()
	owner, err := Open(streamURL, Options{Path: filepath.Join(dir, "owner.db")})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := owner.Exec(`CREATE TABLE kv(id INTEGER PRIMARY KEY, v BLOB)`); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	plain, _ := client.New("")
	// The rows compress to about a third; a snapshot over one request needs a server
	// that takes snapshots in parts (a cold tier). Say so before building the database.
	if info, err := plain.Head(ctx, streamURL); err == nil && int64(mb)<<20/3 > streamcore.MaxRequestBytes && info.MaxSnapshotBytes < int64(mb)<<20/3 {
		owner.Close()
		b.Skipf("a %d MiB database has a snapshot of about %d MiB: this server holds snapshots of one request (%d MiB) only; larger ones need a cold tier", mb, mb/3, streamcore.MaxRequestBytes>>20)
	}
	rows := mb << 10 // about 1 KiB a row
	for lo := 0; lo < rows; lo += 4000 {
		if _, err := owner.Exec(`INSERT INTO kv(id, v) SELECT value, hex(randomblob(300)) || zeroblob(300) FROM generate_series(?, ?)`, lo+1, min(lo+4000, rows)); err != nil {
			b.Fatal(err)
		}
	}
	// The owner publishes a snapshot itself once the log outgrows the database (in parts
	// when it is large); wait for it a while, else publish one here.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if info, err := plain.Head(ctx, streamURL); err == nil && info.SnapshotOffset != "" {
			break
		}
	}
	owner.Close()
	info, err := plain.Head(ctx, streamURL)
	if err != nil {
		b.Fatal(err)
	}
	snapPath := filepath.Join(dir, "snap.db")
	img, err := replicator.Restore(ctx, plain, streamURL, snapPath, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		b.Fatal(err)
	}
	if info.SnapshotOffset == "" {
		image, _ := os.ReadFile(snapPath)
		blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: img.Tail}, image)
		if err != nil {
			b.Fatal(err)
		}
		publishBenchSnapshot(b, plain, streamURL, info, streamcore.FormatOffset(img.Tail), blob)
	}
	os.Remove(snapPath)
	dbBytes := float64(img.DBPages) * float64(img.PageSize)
	scanQuery := `SELECT count(*) FROM kv WHERE length(v) > 0`
	lazyCache := int64(lazy.DefaultCacheBytes)
	b.ResetTimer()
	for range b.N {
		// Full download, then the lookup, then a full scan.
		full := &countingTransport{}
		fc, _ := client.New("", client.WithHTTPClient(&http.Client{Transport: full}))
		start := time.Now()
		path := filepath.Join(dir, "full.db")
		if _, err := replicator.Restore(ctx, fc, streamURL, path, 0, streamcore.MaxRequestBytes, nil); err != nil {
			b.Fatal(err)
		}
		fdb := fullOpen(b, path)
		var v []byte
		if err := fdb.QueryRow(`SELECT v FROM kv WHERE id = ?`, rows/2).Scan(&v); err != nil {
			b.Fatal(err)
		}
		fullFirst := time.Since(start)
		start = time.Now()
		var n int
		if err := fdb.QueryRow(scanQuery).Scan(&n); err != nil || n != rows {
			b.Fatalf("scan: %d rows, %v", n, err)
		}
		fullScan := time.Since(start)
		fdb.Close()
		os.Remove(path)
		// Lazy open, then the same lookup, 100 random ones, and a full scan, while the
		// heap is sampled.
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heapBefore := ms.HeapInuse
		var heapPeak atomic.Uint64
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			for {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > heapPeak.Load() {
					heapPeak.Store(ms.HeapInuse)
				}
				select {
				case <-stopSampling:
					return
				case <-t.C:
				}
			}
		}()
		lz := &countingTransport{}
		lc, _ := client.New("", client.WithHTTPClient(&http.Client{Transport: lz}))
		start = time.Now()
		ldb, err := Open(streamURL, Options{ReadOnly: true, Lazy: true, Client: lc, LazyCacheBytes: lazyCache})
		if err != nil {
			b.Fatal(err)
		}
		if err := ldb.QueryRow(`SELECT v FROM kv WHERE id = ?`, rows/2).Scan(&v); err != nil {
			b.Fatal(err)
		}
		lazyFirst := time.Since(start)
		lazyFirstBytes := lz.n.Load()
		rng := rand.New(rand.NewPCG(1, 2))
		for range 100 {
			if err := ldb.QueryRow(`SELECT v FROM kv WHERE id = ?`, 1+rng.IntN(rows)).Scan(&v); err != nil {
				b.Fatal(err)
			}
		}
		lookupBytes := lz.n.Load() - lazyFirstBytes
		start = time.Now()
		if err := ldb.QueryRow(scanQuery).Scan(&n); err != nil || n != rows {
			b.Fatalf("scan: %d rows, %v", n, err)
		}
		scan := time.Since(start)
		close(stopSampling)
		<-sampled
		// What the open database holds (its page cache and index): the heap in use with it
		// open less the heap once it is closed, each after a collection, so neither the
		// garbage of the scan nor what the in-process server keeps counts.
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heapOpen := ms.HeapInuse
		ldb.Close()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heapLive := int64(heapOpen) - int64(ms.HeapInuse)
		b.ReportMetric(float64(fullFirst.Milliseconds()), "full-first-ms")
		b.ReportMetric(float64(full.n.Load())/dbBytes*100, "full-fetched-%")
		b.ReportMetric(float64(fullScan.Milliseconds()), "full-scan-ms")
		b.ReportMetric(float64(lazyFirst.Milliseconds()), "lazy-first-ms")
		b.ReportMetric(float64(lazyFirstBytes)/dbBytes*100, "lazy-first-fetched-%")
		b.ReportMetric(float64(lookupBytes)/dbBytes*100, "lazy-100-lookups-fetched-%")
		b.ReportMetric(float64(scan.Milliseconds()), "lazy-scan-ms")
		b.ReportMetric(float64(scan)/float64(fullFirst+fullScan), "lazy-scan/full-download+scan")
		// The peak counts garbage not yet collected and the in-process server's buffers.
		b.ReportMetric(float64(int64(heapPeak.Load())-int64(heapBefore))/(1<<20), "lazy-heap-peak-growth-MiB")
		b.ReportMetric(float64(heapLive)/(1<<20), "lazy-heap-held-MiB")
		b.ReportMetric(float64(lazyCache)/(1<<20), "lazy-cache-MiB")
		b.ReportMetric(dbBytes/(1<<20), "db-MiB")
	}
}

// publishBenchSnapshot publishes blob as the snapshot at off: whole when it fits one
// request, else in parts of 16 MiB where the server takes them (a cold tier); a server
// that cannot hold it skips the benchmark.
func publishBenchSnapshot(b *testing.B, c *client.Client, streamURL string, info *client.StreamInfo, off string, blob []byte) {
	const ct = "application/octet-stream"
	if len(blob) <= streamcore.MaxRequestBytes-(1<<20) {
		if _, err := c.PublishSnapshot(context.Background(), streamURL, off, ct, blob); err != nil {
			b.Fatal(err)
		}
		return
	}
	if info.MaxSnapshotBytes < int64(len(blob)) {
		b.Skipf("a %d-byte snapshot: this server holds snapshots of at most %d bytes (one request; larger ones need a cold tier)", len(blob), max(info.MaxSnapshotBytes, streamcore.MaxRequestBytes))
	}
	var ids []string
	for lo := 0; lo < len(blob); lo += 16 << 20 {
		wr, err := c.StageSnapshotPart(context.Background(), streamURL, off, blob[lo:min(lo+16<<20, len(blob))])
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, wr.Header.Get(streamcore.HdrSnapshotPart))
	}
	if _, err := c.CommitSnapshotParts(context.Background(), streamURL, off, ct, streamcore.SnapshotDigestOf(ct, blob), ids); err != nil {
		b.Fatal(err)
	}
}

// fullOpen opens a restored file read-only.
func fullOpen(b *testing.B, path string) *sql.DB {
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?immutable=1")
	if err != nil {
		b.Fatal(err)
	}
	return db
}
