package cluster

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"os"
	"path/filepath"
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

// chaosRun is the load of the chaos tests: idempotent producers append to streams
// concurrently (each write retried with the same Producer-Seq until acknowledged, through
// 307s, 503s and dead nodes), while consistency=leader readers read, all through the
// nodes of live (which a test may change while the load runs).
type chaosRun struct {
	t         *testing.T
	ctx       context.Context
	cl        *client.Client
	keys      []string
	live      atomic.Pointer[[]*node]
	h         *history
	stop      atomic.Bool
	wg        sync.WaitGroup
	mu        sync.Mutex
	acked     map[string][]string
	ackCount  atomic.Int64
	readCount atomic.Int64
}

func (r *chaosRun) url(n *node, key string) string { return n.url + "/chaos/" + key }

func (r *chaosRun) nodes() []*node { return *r.live.Load() }

// retry sends a write to the live nodes in turn until it is acknowledged (see retry).
func (r *chaosRun) retry(f func(*node) (*client.WriteResult, error)) (*client.WriteResult, error) {
	var last error
	for i := 0; ; i++ {
		if r.ctx.Err() != nil {
			return nil, errors.Join(r.ctx.Err(), last)
		}
		ns := r.nodes()
		res, err := f(ns[i%len(ns)])
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

// startChaos creates the streams and starts writersPer producers and one reader per stream.
func startChaos(t *testing.T, ctx context.Context, nodes []*node, streams, writersPer int) *chaosRun {
	cl, err := client.New("", client.WithTimeouts(5*time.Second, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := &chaosRun{t: t, ctx: ctx, cl: cl, h: &history{t0: time.Now()}, acked: map[string][]string{}}
	r.live.Store(&nodes)
	for s := range streams {
		r.keys = append(r.keys, fmt.Sprintf("stream%d", s))
	}
	for _, k := range r.keys {
		if _, err := r.retry(func(n *node) (*client.WriteResult, error) {
			return cl.Create(ctx, r.url(n, k), client.CreateOptions{ContentType: "text/plain"})
		}); err != nil {
			t.Fatalf("create %s: %v", k, err)
		}
	}
	h := r.h
	for s, k := range r.keys {
		for w := range writersPer {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				pid := fmt.Sprintf("p-%d-%d", s, w)
				for seq := uint64(0); !r.stop.Load(); seq++ {
					rec := fmt.Sprintf("%s:%d;", pid, seq)
					call := time.Now()
					res, err := r.retry(func(n *node) (*client.WriteResult, error) {
						return cl.Append(ctx, r.url(n, k), []byte(rec), client.AppendOptions{ContentType: "text/plain",
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
					r.mu.Lock()
					r.acked[k] = append(r.acked[k], rec)
					r.mu.Unlock()
					r.ackCount.Add(1)
				}
			}()
		}
		r.wg.Add(1)
		go func() { // a linearizable reader per stream
			defer r.wg.Done()
			for i := 0; !r.stop.Load(); i++ {
				ns := r.nodes()
				n := ns[i%len(ns)]
				call := time.Now()
				rr, err := cl.Read(ctx, r.url(n, k), client.ReadOptions{Offset: "-1", Consistency: "leader"})
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue // a failed read has no effect
				}
				if !rr.UpToDate {
					continue // a window of a long stream: not a whole-state observation
				}
				h.add(100+s, readIn{k}, call, string(rr.Data))
				r.readCount.Add(1)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	return r
}

// waitAcks waits for n more acknowledged appends.
func (r *chaosRun) waitAcks(n int64) {
	r.t.Helper()
	for target := r.ackCount.Load() + n; r.ackCount.Load() < target; time.Sleep(20 * time.Millisecond) {
		if r.ctx.Err() != nil {
			r.t.Fatal("producers stalled")
		}
	}
}

// finish stops the load, then checks that every node of on converges on the same content,
// with every acknowledged append once and in producer order, and that the history of
// appends and leader reads is linearizable (porcupine).
func (r *chaosRun) finish(c *testCluster, on []*node) {
	t, cl, ctx := r.t, r.cl, r.ctx
	r.stop.Store(true)
	r.wg.Wait()
	if t.Failed() {
		return
	}
	for _, k := range r.keys {
		lr, err := cl.Read(ctx, r.url(on[0], k), client.ReadOptions{Offset: "-1", Consistency: "leader", MaxBytes: 8 << 20})
		if err != nil {
			t.Fatalf("leader read %s: %v", k, err)
		}
		want := string(lr.Data)
		for _, n := range on {
			got := converge(t, cl, r.url(n, k), want)
			r.mu.Lock()
			recs := r.acked[k]
			r.mu.Unlock()
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
	res, info := porcupine.CheckOperationsVerbose(streamModel, r.h.ops, 30*time.Second)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Log("linearizability check timed out (history too large); not a failure")
	default:
		path := c.dir + "/linearizability.html"
		porcupine.VisualizePath(streamModel, info, path)
		t.Fatalf("history of %d operations is not linearizable; see %s", len(r.h.ops), path)
	}
}

// TestKillLeaderDuringProducerAppends: 3 voters on loopback under the chaos load. The
// leader of the busiest groups is SIGKILLed mid-run and restarted. Then: every
// acknowledged append is present exactly once and in each producer's order on every node,
// and the history of appends and leader reads is linearizable (porcupine).
func TestKillLeaderDuringProducerAppends(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: chaosGroups, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const streams = 4
	r := startChaos(t, ctx, c.nodes, streams, 2)
	time.Sleep(2 * time.Second)
	// Kill the node leading the most of the streams' groups.
	counts := map[int]int{}
	for _, k := range r.keys {
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
	before := r.ackCount.Load()
	t.Logf("killing node %d (leads %d of %d stream groups) after %d acknowledged appends", victim, best, streams, before)
	vn := c.nodes[victim-1]
	vn.kill()
	time.Sleep(2500 * time.Millisecond)
	duringOutage := r.ackCount.Load() - before
	vn.start()
	vn.waitReady(30 * time.Second)
	time.Sleep(1500 * time.Millisecond)
	r.stop.Store(true)
	r.wg.Wait()
	t.Logf("%d acknowledged appends (%d while node %d was down), %d leader reads", r.ackCount.Load(), duringOutage, victim, r.readCount.Load())
	if duringOutage == 0 {
		t.Error("no append was acknowledged while the old leader was down: no failover")
	}
	r.finish(c, c.nodes)
}

// TestReplaceNodeDuringChaos keeps the chaos test's checks running across membership
// changes: under the same load, node 3 is SIGKILLed and its data wiped, node 4 joins with
// --join and becomes a voter of every group (`ursula ctl members add`), node 3 is removed
// (`ursula ctl members remove`), and the load moves to nodes 1, 2 and 4. Every
// acknowledged append is on nodes 1, 2 and 4 once and in order, and the history of
// appends and leader reads across the replacement is linearizable (porcupine).
func TestReplaceNodeDuringChaos(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: 4, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := startChaos(t, ctx, c.nodes, 3, 2)
	r.waitAcks(30)
	n3 := c.nodes[2]
	n3.kill()
	if err := os.RemoveAll(filepath.Join(c.dir, "node3")); err != nil {
		t.Fatal(err)
	}
	two := []*node{c.nodes[0], c.nodes[1]}
	r.live.Store(&two)
	r.waitAcks(30)
	n4 := c.joiner(4)
	n4.start()
	c.nodes = append(c.nodes, n4) // cleanup kills it (the load uses r.live, not c.nodes)
	n4.waitListening(30 * time.Second)
	t.Logf("members add: %s", strings.TrimSpace(ctlRun(t, c.nodes[0].admin, "members", "add", "4", n4.url)))
	r.waitAcks(30)
	t.Logf("members remove: %s", strings.TrimSpace(ctlRun(t, c.nodes[1].admin, "members", "remove", "3")))
	n4.waitReady(60 * time.Second)
	live := []*node{c.nodes[0], c.nodes[1], n4}
	r.live.Store(&live)
	r.waitAcks(30)
	t.Logf("%d acknowledged appends, %d leader reads", r.ackCount.Load(), r.readCount.Load())
	r.finish(c, live)
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
