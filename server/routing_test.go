package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// notLeading is a memory engine that plays a replicated node which does not lead any
// group: every write and every leadership check meets err.
type notLeading struct {
	engine.Engine
	err error
}

func (n *notLeading) Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error) {
	return streamcore.Result{}, n.err
}
func (n *notLeading) VerifyLeader(context.Context, string) error { return n.err }
func (n *notLeading) LeaderHint(string) error                    { return n.err }

func serverNotLeading(t *testing.T, err error) string {
	t.Helper()
	eng := engine.NewMemory(0)
	ts := httptest.NewServer(New(&notLeading{Engine: eng, err: err}, Config{ClusterID: "test-cluster"}))
	t.Cleanup(func() { ts.Close(); eng.Close() })
	return ts.URL
}

// A redirect to the leader names the leader's node id, the group and the leader's term,
// so a router can cache the leader per group and discard a hint of an older term
// (protocol 28.5).
func TestRedirectNamesLeaderGroupAndTerm(t *testing.T) {
	u := serverNotLeading(t, &engine.NotLeaderError{LeaderURL: "http://127.0.0.1:1", LeaderID: 3, Group: 7, Term: 42})
	for _, m := range []string{"POST", "PUT", "DELETE", "HEAD"} {
		a := doNoFollow(t, m, u+"/bkt1/s?x=1")
		if a.status != http.StatusTemporaryRedirect || a.h.Get("Location") != "http://127.0.0.1:1/bkt1/s?x=1" {
			t.Fatalf("%s: %d Location %q", m, a.status, a.h.Get("Location"))
		}
		if a.h.Get("x-ursula-raft-leader-id") != "3" || a.h.Get("x-ursula-raft-group") != "7" || a.h.Get("x-ursula-raft-term") != "42" {
			t.Fatalf("%s: redirect headers %v", m, a.h)
		}
	}
}

// A group without a known leader answers 503 NO_LEADER with Retry-After and the group,
// never the redirect code (protocol 28.5); a write refused so is marked not applied.
func TestNoLeaderAnswersNoLeaderCode(t *testing.T) {
	u := serverNotLeading(t, &engine.NotLeaderError{Group: 5})
	a := do(t, "POST", u+"/bkt1/s", "x", "Content-Type", "text/plain")
	expect(t, a, http.StatusServiceUnavailable, streamcore.CodeNoLeader)
	if a.h.Get("Retry-After") != "1" || a.h.Get("x-ursula-raft-group") != "5" || a.h.Get(streamcore.HdrNotApplied) != "NotLeader" {
		t.Fatalf("no-leader headers %v", a.h)
	}
	if a.h.Get("x-ursula-raft-leader-id") != "" || a.h.Get("x-ursula-raft-term") != "" {
		t.Fatal("a no-leader answer named a leader or a term")
	}
	expect(t, do(t, "HEAD", u+"/bkt1/s", ""), http.StatusServiceUnavailable, "")
	// The bare sentinel means the same.
	u = serverNotLeading(t, engine.ErrNoLeader)
	expect(t, do(t, "POST", u+"/bkt1/s", "x", "Content-Type", "text/plain"), http.StatusServiceUnavailable, streamcore.CodeNoLeader)
}

// A node configured without peers answers a not-leader refusal with 500 and
// Retry-After: 1: no other node can take the request (protocol 28.3).
func TestNodeWithoutPeersAnswers500(t *testing.T) {
	u := serverNotLeading(t, &engine.NotLeaderError{NoPeers: true})
	a := do(t, "POST", u+"/bkt1/s", "x", "Content-Type", "text/plain")
	expect(t, a, http.StatusInternalServerError, streamcore.CodeInternal)
	if a.h.Get("Retry-After") != "1" || a.h.Get(streamcore.HdrNotApplied) != "NotLeader" {
		t.Fatalf("headers %v", a.h)
	}
}

// A write that lost the leadership after it was proposed may have applied: it answers
// 503 OUTCOME_UNKNOWN, never a redirect or NO_LEADER, and carries no not-applied marker.
func TestProposedThenLostLeadershipIsUnknown(t *testing.T) {
	u := serverNotLeading(t, &engine.NotLeaderError{LeaderURL: "http://127.0.0.1:1", Proposed: true})
	// LeaderHint is checked before the body; a proposal-time loss comes from Propose only,
	// so drive the delete, which has no pre-body leadership check.
	a := do(t, "DELETE", u+"/bkt1/s", "")
	expect(t, a, http.StatusServiceUnavailable, streamcore.CodeOutcomeUnknown)
	if a.h.Get(streamcore.HdrNotApplied) != "" {
		t.Fatal("an unknown outcome was marked not applied")
	}
}

// doNoFollow sends a bodiless request and returns the answer itself, not where it points.
func doNoFollow(t *testing.T, method, url string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return answer{status: res.StatusCode, h: res.Header}
}
