package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// seen is one request a fake node received.
type seen struct {
	method, uri, auth string
	body              []byte
}

// fakeNode is an upstream answering with handle and recording what reached it.
type fakeNode struct {
	*httptest.Server
	mu   sync.Mutex
	got  []seen
	hits chan struct{}
}

func newFakeNode(t *testing.T, handle http.HandlerFunc) *fakeNode {
	n := &fakeNode{hits: make(chan struct{}, 100)}
	n.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.got = append(n.got, seen{r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), b})
		n.mu.Unlock()
		n.hits <- struct{}{}
		handle(w, r)
	}))
	t.Cleanup(n.Close)
	return n
}

func (n *fakeNode) requests() []seen {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]seen(nil), n.got...)
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// startGateway serves a gateway over cfg in front of upstreams.
func startGateway(t *testing.T, cfg Config, upstreams ...string) (*Gateway, string) {
	for _, u := range upstreams {
		cfg.Upstreams = append(cfg.Upstreams, mustURL(t, u))
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(g)
	t.Cleanup(s.Close)
	return g, s.URL
}

func do(t *testing.T, method, url, token string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == nil {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "text/plain")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, b
}

func marked(res *http.Response) bool {
	return res.Header.Get(streamcore.HdrNotApplied) != "" && res.Header.Get(streamcore.HdrNotAppliedChecked) == "1"
}

// A real node behind the gateway: writes, reads and an SSE read pass through unchanged.
func TestForwardsToNode(t *testing.T) {
	node := httptest.NewServer(server.New(engine.NewMemory(time.Minute), server.Config{}))
	t.Cleanup(node.Close)
	_, gw := startGateway(t, Config{}, node.URL)

	if res, b := do(t, "PUT", gw+"/bkt1/s1", "", nil); res.StatusCode != 201 {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	res, b := do(t, "POST", gw+"/bkt1/s1", "", []byte("hello"))
	if res.StatusCode != 200 && res.StatusCode != 204 {
		t.Fatalf("append: %d %s", res.StatusCode, b)
	}
	if res.Header.Get(streamcore.HdrNotAppliedChecked) != "1" {
		t.Fatal("answer without the vouch header")
	}
	if res.Header.Get("Ursula-Cluster-Id") == "" {
		t.Fatal("the node's route-level headers were not passed through")
	}
	if res, b := do(t, "GET", gw+"/bkt1/s1?offset=-1", "", nil); res.StatusCode != 200 || string(b) != "hello" {
		t.Fatalf("read: %d %q", res.StatusCode, b)
	}
	// An SSE read delivers its first event while the subscription stays open: the
	// gateway flushes as bytes arrive.
	res2, err := http.Get(gw + "/bkt1/s1?offset=-1&live=sse")
	if err != nil {
		t.Fatal(err)
	}
	defer res2.Body.Close()
	sc := bufio.NewScanner(res2.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sc.Text(), "hello") {
			return
		}
	}
	t.Fatalf("SSE ended without the data event: %v", sc.Err())
}

func writeTokens(t *testing.T, lines string) *auth.Authorizer {
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(t.Context(), auth.Config{TokenFile: p})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// With auth on, the gateway refuses unauthenticated and out-of-scope requests itself
// (marked, vouched, never forwarded) and never passes Authorization on.
func TestAuthAndCredentialTermination(t *testing.T) {
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	_, gw := startGateway(t, Config{Auth: writeTokens(t, "tok-a a\nadmin-tok admin\n")}, node.URL)

	res, b := do(t, "POST", gw+"/a/s", "", []byte("x"))
	if res.StatusCode != 401 || !marked(res) || !json.Valid(b) {
		t.Fatalf("no token: %d %v %s", res.StatusCode, res.Header, b)
	}
	if res, _ := do(t, "POST", gw+"/a/s", "wrong", []byte("x")); res.StatusCode != 401 {
		t.Fatalf("bad token: %d", res.StatusCode)
	}
	res, b = do(t, "POST", gw+"/other/s", "tok-a", []byte("x"))
	if res.StatusCode != 404 || !marked(res) || !strings.Contains(string(b), streamcore.CodeBucketNotFound) {
		t.Fatalf("out of scope: %d %s", res.StatusCode, b)
	}
	if res, _ := do(t, "GET", gw+"/__ursula/metrics", "tok-a", nil); res.StatusCode != 404 {
		t.Fatalf("admin route without admin scope: %d", res.StatusCode)
	}
	if n := len(node.requests()); n != 0 {
		t.Fatalf("refused requests reached the node: %d", n)
	}
	if res, _ := do(t, "POST", gw+"/a/s", "tok-a", []byte("x")); res.StatusCode != 204 {
		t.Fatalf("allowed: %d", res.StatusCode)
	}
	got := node.requests()
	if len(got) != 1 || got[0].auth != "" || string(got[0].body) != "x" {
		t.Fatalf("node saw %+v; want one request without Authorization", got)
	}
}

// redirectTo answers a leader redirect to base, marked or not.
func redirectTo(base *string, mark bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if mark {
			w.Header().Set(streamcore.HdrNotApplied, "NotLeader")
		}
		w.Header().Set("Location", *base+r.URL.RequestURI())
		w.WriteHeader(http.StatusTemporaryRedirect)
	}
}

func refuseMarked(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(streamcore.HdrNotApplied, "RaftLogPressure")
	w.Header().Set(streamcore.HdrRetryAfter, "1")
	w.WriteHeader(http.StatusServiceUnavailable)
}

func TestRedirects(t *testing.T) {
	t.Run("marked redirect keeps the leader's mark, vouched", func(t *testing.T) {
		leader := newFakeNode(t, refuseMarked)
		follower := newFakeNode(t, redirectTo(&leader.URL, true))
		_, gw := startGateway(t, Config{}, follower.URL, leader.URL)
		res, _ := do(t, "POST", gw+"/b/s?x=1", "", []byte("payload"))
		if res.StatusCode != 503 || !marked(res) {
			t.Fatalf("%d %v: want the marked 503 with the vouch", res.StatusCode, res.Header)
		}
		got := leader.requests()
		if len(got) != 1 || string(got[0].body) != "payload" || got[0].uri != "/b/s?x=1" {
			t.Fatalf("leader saw %+v: want the same request resent", got)
		}
	})
	t.Run("unmarked redirect drops the mark", func(t *testing.T) {
		leader := newFakeNode(t, refuseMarked)
		follower := newFakeNode(t, redirectTo(&leader.URL, false))
		_, gw := startGateway(t, Config{}, follower.URL, leader.URL)
		res, _ := do(t, "POST", gw+"/b/s", "", []byte("payload"))
		if res.StatusCode != 503 || res.Header.Get(streamcore.HdrNotApplied) != "" {
			t.Fatalf("%d %v: want the 503 without the mark", res.StatusCode, res.Header)
		}
		if res.Header.Get(streamcore.HdrNotAppliedChecked) != "1" {
			t.Fatal("every answer carries the vouch header")
		}
	})
	t.Run("a node's mark without redirects passes", func(t *testing.T) {
		leader := newFakeNode(t, refuseMarked)
		_, gw := startGateway(t, Config{}, leader.URL)
		if res, _ := do(t, "POST", gw+"/b/s", "", []byte("p")); !marked(res) {
			t.Fatalf("%v: want the node's mark with the vouch", res.Header)
		}
	})
	t.Run("target outside the list is never contacted", func(t *testing.T) {
		outside := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
		other := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from other") })
		first := newFakeNode(t, redirectTo(&outside.URL, true))
		_, gw := startGateway(t, Config{}, first.URL, other.URL)
		res, b := do(t, "GET", gw+"/b/s?offset=-1", "", nil)
		if res.StatusCode != 200 || string(b) != "from other" {
			t.Fatalf("%d %q: want the next listed upstream's answer", res.StatusCode, b)
		}
		if n := len(outside.requests()); n != 0 {
			t.Fatalf("the host outside the upstream list got %d requests", n)
		}
	})
	t.Run("a redirect loop ends in LeaderNotFound", func(t *testing.T) {
		var aURL, bURL, cURL string
		a := newFakeNode(t, redirectTo(&bURL, true))
		b := newFakeNode(t, redirectTo(&cURL, true))
		c := newFakeNode(t, redirectTo(&aURL, true))
		aURL, bURL, cURL = a.URL, b.URL, c.URL
		_, gw := startGateway(t, Config{}, a.URL, b.URL, c.URL)
		res, body := do(t, "POST", gw+"/b/s", "", []byte("p"))
		if res.StatusCode != 503 || res.Header.Get(streamcore.HdrNotApplied) != "LeaderNotFound" || !marked(res) || res.Header.Get("Retry-After") != "1" {
			t.Fatalf("%d %v %s", res.StatusCode, res.Header, body)
		}
		if n := len(a.requests()); n != 1 {
			t.Fatalf("upstream a contacted %d times, want once", n)
		}
	})
	t.Run("an unreachable upstream falls over to the next", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		deadURL := dead.URL
		dead.Close()
		live := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
		_, gw := startGateway(t, Config{}, deadURL, live.URL)
		if res, _ := do(t, "POST", gw+"/b/s", "", []byte("p")); res.StatusCode != 204 {
			t.Fatalf("%d: want the live upstream's answer", res.StatusCode)
		}
		_, gw = startGateway(t, Config{}, deadURL)
		if res, _ := do(t, "POST", gw+"/b/s", "", []byte("p")); res.StatusCode != 503 || res.Header.Get(streamcore.HdrNotApplied) != "UpstreamUnreachable" || !marked(res) {
			t.Fatalf("%d %v: want the marked 503", res.StatusCode, res.Header)
		}
	})
}

func TestQuotas(t *testing.T) {
	release := make(chan struct{})
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("live") {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-release
			return
		}
		w.WriteHeader(204)
	})
	t.Cleanup(func() { close(release) })
	q := NewQuotas(QuotaPolicy{Buckets: map[string]Limits{"q": {RequestsPerSec: 1, MaxLiveReads: 1, MaxRequestBodyBytes: 10}}})
	g, gw := startGateway(t, Config{Quotas: q}, node.URL)
	clock := time.Unix(1000, 0)
	g.now = func() time.Time { return clock }

	if res, _ := do(t, "POST", gw+"/q/s", "", []byte("1")); res.StatusCode != 204 {
		t.Fatalf("first: %d", res.StatusCode)
	}
	res, b := do(t, "POST", gw+"/q/s", "", []byte("2"))
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "1" || !marked(res) || !json.Valid(b) {
		t.Fatalf("over the rate: %d %v %s", res.StatusCode, res.Header, b)
	}
	if res, _ := do(t, "POST", gw+"/other/s", "", []byte("x")); res.StatusCode != 204 {
		t.Fatalf("another bucket is not limited: %d", res.StatusCode)
	}
	clock = clock.Add(time.Second)
	res, _ = do(t, "POST", gw+"/q/s", "", []byte("0123456789A"))
	if res.StatusCode != 413 || !marked(res) || res.Header.Get(streamcore.HdrMaxRequestBytes) != "10" {
		t.Fatalf("body over the bucket's limit: %d %v", res.StatusCode, res.Header)
	}

	clock = clock.Add(time.Second)
	first, err := http.Get(gw + "/q/s?offset=-1&live=long-poll")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	clock = clock.Add(time.Second)
	res, _ = do(t, "GET", gw+"/q/s?offset=-1&live=long-poll", "", nil)
	if res.StatusCode != 429 || !marked(res) {
		t.Fatalf("second live read: %d", res.StatusCode)
	}
	if n := len(node.requests()); n != 3 {
		t.Fatalf("node saw %d requests, want 3 (the refusals never forwarded)", n)
	}
}

func TestUsageLog(t *testing.T) {
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "0123456789") })
	path := filepath.Join(t.TempDir(), "usage.jsonl")
	u := OpenUsageLog(path, 10, time.Hour, nil)
	defer u.Close()
	_, gw := startGateway(t, Config{Usage: u}, node.URL)
	// Two writes of 5 and 25 bytes owe 1+3 units; two of 10 and 20 bytes owe 1+2: the
	// byte totals agree, the chunks do not.
	do(t, "POST", gw+"/b/s", "", bytes.Repeat([]byte("x"), 5))
	do(t, "POST", gw+"/b/s2", "", bytes.Repeat([]byte("x"), 25))
	do(t, "POST", gw+"/c/s", "", bytes.Repeat([]byte("x"), 10))
	do(t, "POST", gw+"/c/s", "", bytes.Repeat([]byte("x"), 20))
	do(t, "GET", gw+"/b/s?offset=-1", "", nil)
	do(t, "GET", gw+"/b/s?offset=-1", "", nil)
	do(t, "DELETE", gw+"/b/s", "", nil)
	// A request is counted once its handler returns, which may be just after the client
	// has the answer: flush until all seven are in.
	type key struct{ bucket, action string }
	var sum map[key]UsageLine
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := u.Flush(); err != nil {
			t.Fatal(err)
		}
		sum = map[key]UsageLine{}
		var n int64
		var seq uint64
		seen := map[key]bool{}
		for _, l := range readUsage(t, path) {
			if l.Seq != seq {
				if l.Seq != seq+1 {
					t.Fatalf("batch %d after %d", l.Seq, seq)
				}
				seq, seen = l.Seq, map[key]bool{}
			}
			k := key{l.Bucket, l.Action}
			if seen[k] {
				t.Fatalf("batch %d has two lines for %v", seq, k)
			}
			seen[k] = true
			s := sum[k]
			s.Requests += l.Requests
			s.BytesIn += l.BytesIn
			s.BytesOut += l.BytesOut
			s.Chunks += l.Chunks
			s.Errors += l.Errors
			sum[k] = s
			n += l.Requests
		}
		if n == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests counted, want 7: %+v", n, sum)
		}
	}
	for k, w := range map[key]UsageLine{
		{"b", ActionRead}:   {Requests: 2, BytesOut: 20},
		{"b", ActionWrite}:  {Requests: 2, BytesIn: 30, BytesOut: 20, Chunks: 4},
		{"c", ActionWrite}:  {Requests: 2, BytesIn: 30, BytesOut: 20, Chunks: 3},
		{"b", ActionDelete}: {Requests: 1, BytesOut: 10},
	} {
		if got := sum[k]; got != w {
			t.Fatalf("%v: %+v, want %+v", k, got, w)
		}
	}
}

func readUsage(t *testing.T, path string) []UsageLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []UsageLine
	for _, s := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var l UsageLine
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("line %q: %v", s, err)
		}
		out = append(out, l)
	}
	return out
}

// A failing sink merges its batches into the next one: no count is lost and no batch
// number is skipped.
func TestUsageLogFailingSinkMerges(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	path := filepath.Join(dir, "usage.jsonl")
	u := OpenUsageLog(path, 0, time.Hour, nil)
	defer u.Close()
	rec := UsageRecord{Bucket: "b", Principal: "iss|sub", Action: ActionWrite, Status: 200, BytesIn: 7, BytesOut: 1}
	u.Add(rec)
	if err := u.Flush(); err == nil {
		t.Fatal("flush into a missing directory succeeded")
	}
	rec.Status = 503
	u.Add(rec)
	if err := u.Flush(); err == nil {
		t.Fatal("second flush into a missing directory succeeded")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	u.Add(UsageRecord{Bucket: "a", Action: ActionRead, Status: 200, BytesOut: 3})
	if err := u.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := readUsage(t, path)
	if len(lines) != 2 {
		t.Fatalf("%d lines: %+v", len(lines), lines)
	}
	a, b := lines[0], lines[1]
	if a.Seq != 1 || b.Seq != 1 || a.Bucket != "a" || a.Requests != 1 || a.BytesOut != 3 {
		t.Fatalf("line a %+v", a)
	}
	if b.Bucket != "b" || b.Principal != "iss|sub" || b.Requests != 2 || b.Errors != 1 || b.BytesIn != 14 || b.BytesOut != 2 {
		t.Fatalf("line b %+v", b)
	}
}
