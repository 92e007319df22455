package cluster

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// A single node under fsync = "never" whose journal loses its tail while it is down (a
// simulated host crash: kill -9, then the last segment cut short) reports the possible loss;
// `ursula ctl accept-unsynced-loss` rewrites the surviving stream's history: a new token,
// Stream-Previous-Incarnation and Stream-Inherited-Offset on HEAD.
func TestAcceptUnsyncedLossAfterLostTail(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 1, groups: 2, raft: "wal.fsync = \"never\""})
	c.startAll()
	n := c.nodes[0]
	u := n.url + "/lossy/s"
	if res, b, err := httpDo(http.MethodPut, u, nil, map[string]string{"Content-Type": "text/plain"}); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %v %v %s", res, err, b)
	}
	for i := range 300 {
		if res, _, err := httpDo(http.MethodPost, u, []byte(strings.Repeat("x", 100)), map[string]string{"Content-Type": "text/plain"}); err != nil || res.StatusCode/100 != 2 {
			t.Fatalf("append %d: %v %v", i, res, err)
		}
	}
	head := func() http.Header {
		res, _, err := httpDo(http.MethodHead, u, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Header
	}
	before := head().Get("Stream-Incarnation")
	n.kill()
	var segs []string
	filepath.Walk(filepath.Join(c.dir, "node1"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".seg") {
			segs = append(segs, p)
		}
		return nil
	})
	sort.Strings(segs)
	if len(segs) == 0 {
		t.Fatal("no journal segment")
	}
	last := segs[len(segs)-1]
	fi, err := os.Stat(last)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(last, fi.Size()*2/3+7); err != nil { // mid-frame: a damaged tail
		t.Fatal(err)
	}
	n.start()
	n.waitReady(60 * time.Second)
	var rec struct {
		Possible bool `json:"unsynced_loss_possible"`
	}
	if err := json.Unmarshal([]byte(ctlRun(t, n.admin, "--json", "observe-unsynced-loss")), &rec); err != nil || !rec.Possible {
		t.Fatalf("the node does not report the possible loss: %+v %v", rec, err)
	}
	var acc struct {
		Outcome string `json:"outcome"`
		Rewrite struct {
			Rewritten int `json:"rewritten_streams"`
		} `json:"history_rewrite"`
	}
	if err := json.Unmarshal([]byte(ctlRun(t, n.admin, "--json", "accept-unsynced-loss")), &acc); err != nil || acc.Outcome != "accepted" || acc.Rewrite.Rewritten != 1 {
		t.Fatalf("accept: %+v %v", acc, err)
	}
	h := head()
	if h.Get("Stream-Incarnation") == before || h.Get("Stream-Previous-Incarnation") != before || h.Get("Stream-Inherited-Offset") == "" || h.Get("Stream-Inherited-Offset") != h.Get("Stream-Next-Offset") {
		t.Fatalf("history headers after the rewrite: %v (token before %s)", h, before)
	}
}
