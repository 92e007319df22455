package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// TestFollowerAnswers: what a follower answers, over real HTTP. Writes: 307 to the same
// path and query on the leader, marked NotLeader for appends and creates, unmarked for
// deletes; tail-sensitive reads (HEAD, consistency=leader, live, offset=now, a missing
// stream or an offset beyond the local tail) redirect too; catch-up reads are served
// locally. Admin: status, transfer, and their refusals.
func TestFollowerAnswers(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: 2, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	key := "redir/stream"
	g := fnvGroup(key, 2)
	leader := c.leaderOf(g, c.nodes[0])
	if leader == 0 {
		t.Fatal("no leader")
	}
	L, F := c.nodes[leader-1], c.nodes[leader%3]
	ct := map[string]string{"Content-Type": "text/plain"}
	if res, _, err := httpDo(http.MethodPut, L.url+"/"+key, nil, ct); err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create on leader: %v %v", err, res)
	}
	if res, _, err := httpDo(http.MethodPost, L.url+"/"+key, []byte("a;"), ct); err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("append on leader: %v %v", err, res)
	}
	check := func(method, pathQuery string, body []byte, marked bool) {
		t.Helper()
		res, _, err := httpDo(method, F.url+pathQuery, body, ct)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusTemporaryRedirect || res.Header.Get("Location") != L.url+pathQuery {
			t.Fatalf("%s %s on a follower: %d Location %q, want 307 to %s", method, pathQuery, res.StatusCode, res.Header.Get("Location"), L.url+pathQuery)
		}
		if got := res.Header.Get(streamcore.HdrNotApplied); (got == "NotLeader") != marked {
			t.Fatalf("%s %s: x-ursula-not-applied %q, marked=%v wanted", method, pathQuery, got, marked)
		}
		if res.Header.Get(streamcore.HdrNotAppliedChecked) != "" {
			t.Fatal("a node sent the gateway's vouch")
		}
	}
	check(http.MethodPost, "/"+key+"?x=1", []byte("b;"), true)
	other := "redir/other0"
	for i := 1; fnvGroup(other, 2) != g; i++ {
		other = fmt.Sprintf("redir/other%d", i)
	}
	check(http.MethodPut, "/"+other, nil, true)
	check(http.MethodDelete, "/"+key, nil, false)
	check(http.MethodHead, "/"+key, nil, false)
	check(http.MethodGet, "/"+key+"?offset=-1&consistency=leader", nil, false)
	check(http.MethodGet, "/"+key+"?offset=-1&live=long-poll", nil, false)
	check(http.MethodGet, "/"+key+"?offset=now", nil, false)
	check(http.MethodGet, "/"+key+"?offset=00000000000000001000", nil, false) // beyond the local tail
	check(http.MethodGet, "/"+other+"?offset=-1", nil, false)                 // missing here: ask the leader
	// A catch-up read on the follower is local (once it has applied the append).
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, body, err := httpDo(http.MethodGet, F.url+"/"+key+"?offset=-1", nil, nil)
		if err == nil && res.StatusCode == 200 && string(body) == "a;" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower catch-up read: %v %v %q", err, res, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Admin.
	res, body, err := httpDo(http.MethodGet, F.admin+"/__ursula/raft/status", nil, nil)
	var st raftStatus
	if err != nil || res.StatusCode != 200 || json.Unmarshal(body, &st) != nil || st.GroupCount != 2 || len(st.Groups) != 2 {
		t.Fatalf("status: %v %v %s", err, res, body)
	}
	if res, _, _ := httpDo(http.MethodPost, L.admin+"/__ursula/raft/transfer?group=9", nil, nil); res.StatusCode != http.StatusNotFound {
		t.Fatalf("transfer of an unknown group: %d", res.StatusCode)
	}
	if res, _, _ := httpDo(http.MethodPost, F.admin+fmt.Sprintf("/__ursula/raft/transfer?group=%d", g), nil, nil); res.StatusCode != http.StatusConflict {
		t.Fatalf("transfer on a follower: %d", res.StatusCode)
	}
	if res, body, _ := httpDo(http.MethodPost, L.admin+fmt.Sprintf("/__ursula/raft/transfer?group=%d&to=%d", g, F.id), nil, nil); res.StatusCode != 200 {
		t.Fatalf("transfer: %d %s", res.StatusCode, body)
	}
	for deadline := time.Now().Add(5 * time.Second); c.leaderOf(g, F) != F.id; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("transfer did not complete")
		}
	}
	// Drain: the new leader hands everything away.
	if res, body, _ := httpDo(http.MethodPost, F.admin+"/__ursula/raft/drain", nil, nil); res.StatusCode != 200 {
		t.Fatalf("drain: %d %s", res.StatusCode, body)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, _ := F.status()
		if st.Leading == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d still leads %d groups after drain", F.id, st.Leading)
		}
	}
}

// TestFollowerReadsRenewSlidingTTL: reads served by a follower keep a sliding-TTL stream
// alive (the follower asks the leader to renew it), as reads on the leader do.
func TestFollowerReadsRenewSlidingTTL(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: 2, raft: "heartbeat_timeout_ms = 500"})
	c.startAll()
	key := "expiring/stream"
	g := fnvGroup(key, 2)
	leader := c.leaderOf(g, c.nodes[0])
	if leader == 0 {
		t.Fatal("no leader")
	}
	L, F := c.nodes[leader-1], c.nodes[leader%3]
	res, _, err := httpDo(http.MethodPut, L.url+"/"+key, []byte("x"), map[string]string{"Content-Type": "text/plain", "Stream-TTL": "2"})
	if err != nil || res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %v %v", err, res)
	}
	// Read on the follower for 4.5 s (more than two TTLs), never on the leader.
	start := time.Now()
	for time.Since(start) < 4500*time.Millisecond {
		res, body, err := httpDo(http.MethodGet, F.url+"/"+key+"?offset=-1", nil, nil)
		if err == nil && res.StatusCode == http.StatusOK && string(body) == "x" {
			time.Sleep(300 * time.Millisecond)
			continue
		}
		if err == nil && res.StatusCode == http.StatusTemporaryRedirect && time.Since(start) < time.Second {
			time.Sleep(50 * time.Millisecond) // the follower has not applied the create yet
			continue
		}
		t.Fatalf("after %v the follower answers %v %v %q: the stream expired although read", time.Since(start), err, res, body)
	}
	res, _, err = httpDo(http.MethodHead, L.url+"/"+key, nil, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("leader HEAD after follower reads: %v %v", err, res)
	}
}
