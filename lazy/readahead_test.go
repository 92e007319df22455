package lazy_test

import (
	"bytes"
	"crypto/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/testserver"
	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// concurrencyTransport counts the snapshot reads in flight at once, each held a moment
// (a store with a long first-byte time, as an S3 cold tier) so that overlap shows.
type concurrencyTransport struct {
	mu        sync.Mutex
	now, peak int
	reads     int
}

func (c *concurrencyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.Contains(r.URL.Path, "/snapshot/") {
		return http.DefaultTransport.RoundTrip(r)
	}
	c.mu.Lock()
	c.now++
	c.reads++
	c.peak = max(c.peak, c.now)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.now--
		c.mu.Unlock()
	}()
	time.Sleep(20 * time.Millisecond)
	return http.DefaultTransport.RoundTrip(r)
}

// TestScanFetchesRunsInParallel: a reader going through the pages in order has several
// runs of frames in flight at once (Options.Parallel ahead of the one it reads), the
// runs grow to ReadAhead frames so a scan takes few ranged GETs, no frame is fetched
// twice, and the pages are the snapshot's.
func TestScanFetchesRunsInParallel(t *testing.T) {
	const (
		pageSize  = 4096
		dbPages   = 1024 // 4 MiB of random bytes: frames that do not compress
		parallel  = 3
		readAhead = 4
	)
	img := make([]byte, dbPages*pageSize)
	rand.Read(img)
	streamURL := testserver.Start(t, testserver.Options{ClusterID: "lazy-test"}).URL + "/dbs1/scan"
	c := newClient(t)
	if _, err := c.Create(ctx, streamURL, client.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
		t.Fatal(err)
	}
	tail := tailOf(t, streamURL)
	blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: pageSize, DBPages: dbPages, Epoch: 1, Offset: tail}, img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishSnapshot(ctx, streamURL, streamcore.FormatOffset(tail), "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name      string
		cache     int64
		wantPeak  int // at least
		peakBound int // at most
	}{
		{"parallel", 64 << 20, 3, parallel + 1},
		// A cache that holds two runs of 4 frames (64 KiB each) leaves room for one
		// run ahead: the bound wins over Parallel.
		{"bounded by the cache", 4 * readAhead * 64 << 10, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &concurrencyTransport{}
			hc, err := client.New("", client.WithHTTPClient(&http.Client{Transport: tr}))
			if err != nil {
				t.Fatal(err)
			}
			src, err := lazy.Open(ctx, streamURL, lazy.Options{Client: hc, CacheBytes: tc.cache, ReadAhead: readAhead, Parallel: parallel})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			got, err := readAll(src.View())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, img) {
				t.Fatal("the scan read other bytes than the snapshot holds")
			}
			st := src.Stats()
			tr.mu.Lock()
			peak, reads := tr.peak, tr.reads
			tr.mu.Unlock()
			t.Logf("%d snapshot reads, at most %d at once, %d bytes of a %d-byte snapshot", reads, peak, st.BytesFetched, len(blob))
			if peak < tc.wantPeak || peak > tc.peakBound {
				t.Errorf("at most %d snapshot reads in flight at once, want %d..%d", peak, tc.wantPeak, tc.peakBound)
			}
			frames := (dbPages*pageSize + 64<<10 - 1) / (64 << 10)
			if limit := frames/readAhead + 8; reads > limit {
				t.Errorf("%d snapshot reads for %d frames, want at most %d (runs of up to %d frames)", reads, frames, limit, readAhead)
			}
			if st.BytesFetched > int64(len(blob))+int64(len(blob))/20 {
				t.Errorf("fetched %d bytes of a %d-byte snapshot: frames fetched twice", st.BytesFetched, len(blob))
			}
		})
	}
}
