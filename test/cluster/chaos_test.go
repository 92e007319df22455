package cluster

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ursula-go/ursula/client"
)

const chaosGroups = 8

// groupOf mirrors the raft engine's placement (FNV-1a 64 of "bucket/stream" mod group count).
func groupOf(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() % chaosGroups
}

type appendIn struct {
	stream string
	rec    string
}

type readIn struct{ stream string }

// streamModel: the state of one stream is its content. An append linearizes where its
// acknowledged start offset equals the content length; a read must return the content.
var streamModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range h {
			var s string
			switch in := op.Input.(type) {
			case appendIn:
				s = in.stream
			case readIn:
				s = in.stream
			}
			if _, ok := by[s]; !ok {
				order = append(order, s)
			}
			by[s] = append(by[s], op)
		}
		var out [][]porcupine.Operation
		for _, s := range order {
			out = append(out, by[s])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		st := state.(string)
		switch in := input.(type) {
		case appendIn:
			if output == nil { // never answered: it may apply anywhere after its call
				return true, st + in.rec
			}
			if output.(uint64) != uint64(len(st)) {
				return false, st
			}
			return true, st + in.rec
		case readIn:
			return output.(string) == st, st
		}
		return false, st
	},
	DescribeOperation: func(in, out any) string { return fmt.Sprintf("%v -> %v", in, out) },
}

type history struct {
	mu  sync.Mutex
	ops []porcupine.Operation
	t0  time.Time
}

func (h *history) add(client int, in any, call time.Time, out any) {
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call.Sub(h.t0).Nanoseconds(), Output: out, Return: time.Since(h.t0).Nanoseconds()})
	h.mu.Unlock()
}

// TestKillLeaderDuringProducerAppends: 3 voters on loopback. Idempotent producers append
// to streams concurrently (each write retried with the same Producer-Seq until
// acknowledged, through 307s and 503s), while consistency=leader readers read. The leader
// of the busiest groups is SIGKILLed mid-run and restarted. Then: every acknowledged append
// is present exactly once and in each producer's order on every node, and the history of
// appends and leader reads is linearizable (porcupine).
func TestKillLeaderDuringProducerAppends(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: chaosGroups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const streams, writersPer = 4, 2
	keys := make([]string, streams)
	for s := range streams {
		keys[s] = fmt.Sprintf("stream%d", s)
	}
	cl, err := client.New("", client.WithTimeouts(5*time.Second, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	urlOn := func(n *node, key string) string { return n.url + "/chaos/" + key }
	for _, k := range keys {
		if _, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
			return cl.Create(ctx, urlOn(n, k), client.CreateOptions{ContentType: "text/plain"})
		}); err != nil {
			t.Fatalf("create %s: %v", k, err)
		}
	}
	h := &history{t0: time.Now()}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string][]string{}
	var ackCount, readCount atomic.Int64
	for s, k := range keys {
		for w := range writersPer {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pid := fmt.Sprintf("p-%d-%d", s, w)
				for seq := uint64(0); !stop.Load(); seq++ {
					rec := fmt.Sprintf("%s:%d;", pid, seq)
					call := time.Now()
					res, err := retry(ctx, c, func(n *node) (*client.WriteResult, error) {
						return cl.Append(ctx, urlOn(n, k), []byte(rec), client.AppendOptions{ContentType: "text/plain",
							Producer: &client.ProducerKey{ID: pid, Epoch: 0, Seq: seq}})
					})
					if err != nil {
						// Only the test deadline ends a retry loop; the write stays unknown,
						// so it enters the history with no return (it may or may not apply).
						h.mu.Lock()
						h.ops = append(h.ops, porcupine.Operation{ClientId: s*10 + w, Input: appendIn{k, rec}, Call: call.Sub(h.t0).Nanoseconds(), Output: nil, Return: math.MaxInt64})
						h.mu.Unlock()
						return
					}
					off, perr := strconv.ParseUint(res.Offset, 10, 64)
					if perr != nil {
						t.Errorf("append %s: no Stream-Offset in %+v", rec, res)
						return
					}
					h.add(s*10+w, appendIn{k, rec}, call, off)
					mu.Lock()
					acked[k] = append(acked[k], rec)
					mu.Unlock()
					ackCount.Add(1)
				}
			}()
		}
		wg.Add(1)
		go func() { // a linearizable reader per stream
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				n := c.nodes[i%3]
				call := time.Now()
				rr, err := cl.Read(ctx, urlOn(n, k), client.ReadOptions{Offset: "-1", Consistency: "leader"})
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue // a failed read has no effect
				}
				if !rr.UpToDate {
					continue // a window of a long stream: not a whole-state observation
				}
				h.add(100+s, readIn{k}, call, string(rr.Data))
				readCount.Add(1)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	// Kill the node leading the most of the streams' groups.
	counts := map[int]int{}
	for _, k := range keys {
		counts[c.leaderOf(groupOf("chaos/"+k), c.nodes[0])]++
	}
	victim, best := 0, -1
	for id, n := range counts {
		if id != 0 && n > best {
			victim, best = id, n
		}
	}
	if victim == 0 {
		t.Fatal("no leader known for the streams' groups")
	}
	before := ackCount.Load()
	t.Logf("killing node %d (leads %d of %d stream groups) after %d acknowledged appends", victim, best, streams, before)
	vn := c.nodes[victim-1]
	vn.kill()
	time.Sleep(2500 * time.Millisecond)
	duringOutage := ackCount.Load() - before
	vn.start()
	vn.waitReady(30 * time.Second)
	time.Sleep(1500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d acknowledged appends (%d while node %d was down), %d leader reads", ackCount.Load(), duringOutage, victim, readCount.Load())
	if duringOutage == 0 {
		t.Error("no append was acknowledged while the old leader was down: no failover")
	}
	// Every node converges on the same content, with every acknowledged append once and in
	// producer order.
	for _, k := range keys {
		lr, err := cl.Read(ctx, urlOn(c.nodes[0], k), client.ReadOptions{Offset: "-1", Consistency: "leader", MaxBytes: 8 << 20})
		if err != nil {
			t.Fatalf("leader read %s: %v", k, err)
		}
		want := string(lr.Data)
		for _, n := range c.nodes {
			got := converge(t, cl, urlOn(n, k), want)
			mu.Lock()
			recs := acked[k]
			mu.Unlock()
			for _, rec := range recs {
				if strings.Count(";"+got, ";"+rec) != 1 {
					t.Fatalf("node %d %s: acknowledged %q present %d times", n.id, k, rec, strings.Count(";"+got, ";"+rec))
				}
			}
			last := map[string]int{}
			for _, part := range strings.Split(strings.TrimSuffix(got, ";"), ";") {
				pid, seqText, _ := strings.Cut(part, ":")
				seq, _ := strconv.Atoi(seqText)
				if prev, ok := last[pid]; ok && seq != prev+1 || !ok && seq != 0 {
					t.Fatalf("node %d %s: producer %s seq %d after %d", n.id, k, pid, seq, last[pid])
				}
				last[pid] = seq
			}
		}
	}
	res, info := porcupine.CheckOperationsVerbose(streamModel, h.ops, 30*time.Second)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Log("linearizability check timed out (history too large); not a failure")
	default:
		path := c.dir + "/linearizability.html"
		porcupine.VisualizePath(streamModel, info, path)
		t.Fatalf("history of %d operations is not linearizable; see %s", len(h.ops), path)
	}
}

// retry sends a write to the nodes in turn until it is acknowledged, retrying every
// not-applied and unknown outcome (the producer key makes a repeat safe).
func retry(ctx context.Context, c *testCluster, f func(*node) (*client.WriteResult, error)) (*client.WriteResult, error) {
	var last error
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			return nil, errors.Join(ctx.Err(), last)
		}
		res, err := f(c.nodes[i%len(c.nodes)])
		if err == nil {
			return res, nil
		}
		last = err
		var ce *client.Error
		if errors.As(err, &ce) && ce.Status >= 400 && ce.Status < 500 && ce.Status != http.StatusRequestTimeout {
			return nil, err // a protocol refusal: retrying cannot help
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// converge reads url until it equals want, so a follower that trails the leader by a commit
// round catches up.
func converge(t *testing.T, cl *client.Client, url, want string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	prev := "\x00"
	for {
		rr, err := cl.Read(context.Background(), url, client.ReadOptions{Offset: "-1", MaxBytes: 8 << 20})
		if err == nil {
			got := string(rr.Data)
			if got == want {
				return got
			}
			prev = got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not converge: last %v / %d bytes vs %d wanted", url, err, len(prev), len(want))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
