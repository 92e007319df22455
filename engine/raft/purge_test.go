package raftengine

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// A purge sent to one voter runs in every group (forwarded to the leaders it does not
// hold), every replica applies it, later creates in the bucket are refused with
// BUCKET_ERASED, and a repeat removes nothing.
func TestPurgeBucketAcrossGroupsAndVoters(t *testing.T) {
	es := threeVoters(t)
	ctx := context.Background()
	leaderOf := func(key string) *Engine { return es[es[0].LeaderOf(es[0].GroupOf(key))-1] }
	groups := map[uint64]bool{}
	var keys []string
	for i := range 12 {
		key := fmt.Sprintf("tnt1/s%d", i)
		keys = append(keys, key)
		groups[es[0].GroupOf(key)] = true
		if r, err := leaderOf(key).Propose(ctx, create(key)); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("create %s: %v %+v", key, err, r)
		}
	}
	if r, err := leaderOf("keep/s").Propose(ctx, create("keep/s")); err != nil || r.Status != http.StatusCreated {
		t.Fatalf("create keep/s: %v %+v", err, r)
	}

	// Sent to a voter that does not lead group 0: that group's purge is forwarded.
	P := es[es[0].LeaderOf(0)%3]
	rep, err := P.PurgeBucket(ctx, "tnt1", time.Now().UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != len(keys) || len(rep.Groups) != len(groups) || rep.HeldByForks != 0 {
		t.Fatalf("purge report: %+v (want %d streams in %d groups)", rep, len(keys), len(groups))
	}
	// Every replica applies the purge.
	for _, e := range es {
		deadline := time.Now().Add(10 * time.Second)
		for {
			g := e.BucketUsage()["tnt1"]
			if g.Streams == 0 && g.Erased && e.BucketUsage()["keep"].Streams == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d did not apply the purge: %+v", e.cfg.NodeID, g)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	r, err := leaderOf(keys[0]).Propose(ctx, create(keys[0]))
	if err != nil || r.Err == nil || r.Err.Code != streamcore.CodeBucketErased || r.Status != http.StatusNotFound {
		t.Fatalf("create after purge: %v %+v", err, r)
	}
	rep, err = es[1].PurgeBucket(ctx, "tnt1", time.Now().UnixMilli())
	if err != nil || len(rep.Removed) != 0 {
		t.Fatalf("repeated purge: %v %+v", err, rep)
	}
}
