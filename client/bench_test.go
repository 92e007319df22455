package client_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/testserver"
)

// BenchmarkAppendRoundTrip: one producer's appends to the real server (memory engine, in
// this process, loopback HTTP), one at a time, as a replicated commit sends them: with and
// without Producer-Digest, which both sides compute (BLAKE3-256), for a one-row commit's
// body, a 100-row transaction's and a larger one. p50/p99 in us.
//
//	go test -run '^$' -bench AppendRoundTrip -benchtime 3000x ./client
func BenchmarkAppendRoundTrip(b *testing.B) {
	ts := testserver.Start(b, testserver.Options{ClusterID: "client-bench"})
	c, err := client.New(ts.URL)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{1 << 10, 8 << 10, 64 << 10} {
		for _, digest := range []bool{false, true} {
			u := fmt.Sprintf("%s/bench/append-%d-%v", ts.URL, n, digest)
			if _, err := c.Create(ctx, u, client.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
				b.Fatal(err)
			}
			body := make([]byte, n)
			rand.Read(body)
			seq := uint64(0) // kept across the runs of one sub-benchmark
			b.Run(fmt.Sprintf("%dKiB/digest=%v", n>>10, digest), func(b *testing.B) {
				d := make([]time.Duration, 0, b.N)
				for b.Loop() {
					t0 := time.Now()
					_, err := c.Append(ctx, u, body, client.AppendOptions{ContentType: "application/octet-stream",
						Digest: digest, Producer: &client.ProducerKey{ID: "bench", Seq: seq}})
					if err != nil {
						b.Fatal(err)
					}
					d = append(d, time.Since(t0))
					seq++
				}
				sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
				b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-us")
				b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-us")
			})
		}
	}
}
