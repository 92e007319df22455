package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// TestMembershipBench is the benchmark of the cluster's membership changes, run by
// `make bench` (skipped unless URSULA_BENCH_MEMBERSHIP=1). On 3 real nodes it
//  1. writes URSULA_BENCH_CATCHUP_MB (64; 1024 for the 1 GB figure) MiB into
//     8 streams and times it (the ingest rate);
//  2. times `ursula ctl members add` of an idle cluster's new node 4 (learner catch-up of
//     every group, then promotion): the catch-up rate, as a ratio to the ingest rate;
//  3. runs a load generator (16 writers, 1 KiB appends) and measures the append rate in a
//     steady window, during `ursula ctl members add 5` (learner + promotion, the same data
//     to catch up) and during `members remove 5`, each as a ratio to the steady rate of
//     the same run.
//
// The figures are printed (lines starting "membership-bench:"); nothing is asserted on them.
func TestMembershipBench(t *testing.T) {
	if os.Getenv("URSULA_BENCH_MEMBERSHIP") == "" {
		t.Skip("a benchmark: set URSULA_BENCH_MEMBERSHIP=1 (make bench does)")
	}
	mb := 64
	if v := os.Getenv("URSULA_BENCH_CATCHUP_MB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("URSULA_BENCH_CATCHUP_MB=%q: a positive number of MiB", v)
		}
		mb = n
	}
	const groups = 4
	c := newCluster(t, clusterOpts{nodes: 3, groups: groups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cl, err := client.New("", client.WithTimeouts(30*time.Second, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	say := func(format string, a ...any) {
		line := fmt.Sprintf("membership-bench: "+format, a...)
		t.Log(line)
		fmt.Println(line)
	}

	// 1. Ingest: mb MiB in 256 KiB appends by 8 writers, one stream each.
	const chunk = 256 << 10
	var keys []string
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("mbench/catch%d", i))
	}
	for _, k := range keys {
		if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
			return cl.Create(ctx, n.url+"/"+k, client.CreateOptions{ContentType: "application/octet-stream"})
		}); err != nil {
			t.Fatalf("create %s: %v", k, err)
		}
	}
	total := mb << 20 / chunk
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := bytes.Repeat([]byte{byte('a' + w)}, chunk)
			for s := uint64(0); next.Add(1) <= int64(total); s++ {
				if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
					return cl.Append(ctx, n.url+"/"+k, body, client.AppendOptions{ContentType: "application/octet-stream",
						Producer: &client.ProducerKey{ID: "ingest", Epoch: 0, Seq: s}})
				}); err != nil {
					t.Errorf("append to %s: %v", k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ingest := time.Since(start)
	ingestRate := float64(mb) / ingest.Seconds()
	say("ingest of %d MiB on 3 voters: %v (%.1f MiB/s)", mb, ingest.Round(time.Millisecond), ingestRate)

	// 2. Catch-up of an idle cluster's new node.
	addNode := func(id int) time.Duration {
		n := c.joiner(id)
		n.start()
		c.nodes = append(c.nodes, n) // cleanup kills it
		n.waitListening(60 * time.Second)
		began := time.Now()
		ctlRun(t, c.nodes[0].admin, "--timeout", "30m", "members", "add", strconv.Itoa(id), n.url)
		return time.Since(began)
	}
	catchUp := addNode(4)
	catchRate := float64(mb) / catchUp.Seconds()
	say("catch-up of %d MiB by a new node (members add: learner in %d groups, then voter): %v (%.1f MiB/s), ratio to ingest rate %.2f",
		mb, groups, catchUp.Round(time.Millisecond), catchRate, catchRate/ingestRate)

	// 3. Append throughput under a membership change against the steady state.
	var acks atomic.Int64
	var stop atomic.Bool
	writers := c.nodes[:3]
	for w := range 16 {
		k := fmt.Sprintf("mbench/load%d", w)
		if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
			return cl.Create(ctx, n.url+"/"+k, client.CreateOptions{ContentType: "application/octet-stream"})
		}); err != nil {
			t.Fatalf("create %s: %v", k, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := bytes.Repeat([]byte("l"), 1024)
			for i := 0; !stop.Load(); i++ {
				if _, err := cl.Append(ctx, writers[i%len(writers)].url+"/"+k, body, client.AppendOptions{ContentType: "application/octet-stream"}); err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				acks.Add(1)
			}
		}()
	}
	rate := func(f func()) float64 {
		a, began := acks.Load(), time.Now()
		f()
		return float64(acks.Load()-a) / time.Since(began).Seconds()
	}
	window := func() { time.Sleep(5 * time.Second) }
	window() // warm-up
	steady := rate(window)
	var addTook time.Duration
	during := rate(func() { addTook = addNode(5) })
	removing := rate(func() { ctlRun(t, c.nodes[0].admin, "members", "remove", "5") })
	after := rate(window)
	stop.Store(true)
	wg.Wait()
	say("appends/s (16 writers, 1 KiB): steady %.0f; during members add 5 (%v, %d MiB to catch up) %.0f, ratio %.2f; during members remove 5 %.0f, ratio %.2f; after %.0f, ratio %.2f",
		steady, addTook.Round(time.Millisecond), mb, during, during/steady, removing, removing/steady, after, after/steady)
	if strings.TrimSpace(ctlRun(t, c.nodes[0].admin, "members", "list")) == "" {
		t.Fatal("no members listed")
	}
}
