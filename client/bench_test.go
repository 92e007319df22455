package client_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/testserver"
)

// BenchmarkAppendRoundTrip: one producer's appends, one at a time, as a replicated commit
// sends them, to the real server over loopback HTTP: the memory engine in this process
// (in-process), and `ursula server --engine memory` in another (process), as a deployment
// runs it. Through the client's default transport (inline) and through net/http's
// (nethttp) side by side; with and without Producer-Digest, which both sides compute
// (BLAKE3-256); for a one-row commit's body, a 100-row transaction's and a larger one.
// p50/p99 in us.
//
//	go test -run '^$' -bench AppendRoundTrip -benchtime 2000x ./client
func BenchmarkAppendRoundTrip(b *testing.B) {
	servers := []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"in-process", func(b *testing.B) string {
			return testserver.Start(b, testserver.Options{ClusterID: "client-bench"}).URL
		}},
		{"process", func(b *testing.B) string { return testserver.StartProcess(b, "--engine", "memory") }},
	}
	transports := []struct {
		name string
		rt   func() http.RoundTripper
	}{
		{"inline", func() http.RoundTripper { return client.NewInlineTransport(nil) }},
		{"nethttp", func() http.RoundTripper { return client.NewTransport() }},
	}
	ctx := context.Background()
	for _, srv := range servers {
		b.Run(srv.name, func(b *testing.B) {
			base := srv.url(b)
			for _, tr := range transports {
				c, err := client.New(base, client.WithHTTPClient(&http.Client{Transport: tr.rt()}))
				if err != nil {
					b.Fatal(err)
				}
				for _, n := range []int{1 << 10, 8 << 10, 64 << 10} {
					for _, digest := range []bool{false, true} {
						u := fmt.Sprintf("%s/bench/append-%s-%d-%v", base, tr.name, n, digest)
						if _, err := c.Create(ctx, u, client.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
							b.Fatal(err)
						}
						body := make([]byte, n)
						rand.Read(body)
						seq := uint64(0) // kept across the runs of one sub-benchmark
						b.Run(fmt.Sprintf("%s/%dKiB/digest=%v", tr.name, n>>10, digest), func(b *testing.B) {
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
		})
	}
}
