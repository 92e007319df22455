package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// deadAddr is a loopback URL whose connections are refused (its listener is closed).
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func realNode(t *testing.T, cfg server.Config) string {
	node := httptest.NewServer(server.New(engine.NewMemory(time.Minute), cfg))
	t.Cleanup(node.Close)
	return node.URL
}

// metricsText is the gateway's /metrics.
func metricsText(t *testing.T, gw, token string) string {
	res, b := do(t, "GET", gw+"/metrics", token, nil)
	if res.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", res.StatusCode, b)
	}
	return string(b)
}

// An upstream whose connection fails is tried last until its ejection ends, then again.
func TestUpstreamEjection(t *testing.T) {
	dead := deadAddr(t)
	g, gw := startGateway(t, Config{EjectFor: time.Hour}, dead, realNode(t, server.Config{}))
	connectErrors := func() string {
		for _, l := range strings.Split(metricsText(t, gw, ""), "\n") {
			if strings.HasPrefix(l, "ursula_gateway_upstream_errors_total{upstream=\""+strings.TrimPrefix(dead, "http://")) {
				return l[strings.LastIndex(l, " ")+1:]
			}
		}
		return "0"
	}
	if res, b := do(t, "PUT", gw+"/bkt1/s", "", nil); res.StatusCode != 201 {
		t.Fatalf("create past a dead upstream: %d %s", res.StatusCode, b)
	}
	if n := connectErrors(); n != "1" {
		t.Fatalf("connect errors after the first request: %s", n)
	}
	if !strings.Contains(metricsText(t, gw, ""), `ursula_gateway_upstream_ejected{upstream="`+strings.TrimPrefix(dead, "http://")+`"} 1`) {
		t.Fatal("the dead upstream is not reported ejected")
	}
	for range 3 {
		if res, _ := do(t, "POST", gw+"/bkt1/s", "", []byte("x")); res.StatusCode/100 != 2 {
			t.Fatalf("append: %d", res.StatusCode)
		}
	}
	if n := connectErrors(); n != "1" {
		t.Fatalf("an ejected upstream was dialed again within its ejection: %s connect errors", n)
	}
	// After the ejection, the upstream is tried again (first in order).
	later := time.Now().Add(2 * time.Hour)
	g.now = func() time.Time { return later }
	if res, _ := do(t, "POST", gw+"/bkt1/s", "", []byte("x")); res.StatusCode/100 != 2 {
		t.Fatalf("append: %d", res.StatusCode)
	}
	if n := connectErrors(); n != "2" {
		t.Fatalf("the upstream was not retried after its ejection: %s connect errors", n)
	}
}

// When every upstream is ejected, they are still tried: ejection never refuses by itself.
func TestEjectedUpstreamsStillServeWhenAlone(t *testing.T) {
	node := realNode(t, server.Config{})
	g, gw := startGateway(t, Config{EjectFor: time.Hour}, node)
	g.up.eject(strings.TrimPrefix(node, "http://"), time.Now())
	if res, b := do(t, "PUT", gw+"/bkt1/s", "", nil); res.StatusCode != 201 {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	if g.up.isEjected(strings.TrimPrefix(node, "http://"), time.Now()) {
		t.Fatal("an upstream that answered stays ejected")
	}
}

// After a redirect, the stream's requests go to the upstream that answered first.
func TestLeaderMemory(t *testing.T) {
	var leaderURL string
	leader := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	leaderURL = leader.URL
	follower := newFakeNode(t, redirectTo(&leaderURL, true))
	_, gw := startGateway(t, Config{}, follower.URL, leader.URL)

	if res, _ := do(t, "POST", gw+"/bkt1/s", "", []byte("1")); res.StatusCode != 204 {
		t.Fatalf("first append: %d", res.StatusCode)
	}
	if f, l := len(follower.requests()), len(leader.requests()); f != 1 || l != 1 {
		t.Fatalf("first append: follower %d leader %d requests; want 1 and 1", f, l)
	}
	for range 3 {
		if res, _ := do(t, "POST", gw+"/bkt1/s", "", []byte("2")); res.StatusCode != 204 {
			t.Fatalf("append: %d", res.StatusCode)
		}
	}
	if f, l := len(follower.requests()), len(leader.requests()); f != 1 || l != 4 {
		t.Fatalf("after the redirect: follower %d leader %d requests; want 1 and 4 (remembered leader)", f, l)
	}
	// Another stream has no memory yet: list order.
	do(t, "POST", gw+"/b/other", "", []byte("3"))
	if f := len(follower.requests()); f != 2 {
		t.Fatalf("another stream went to the remembered leader: follower saw %d", f)
	}
}

// Bodies beyond the gateway's in-flight budget are refused like a node refuses them, and
// nothing stays charged.
func TestInflightBodyBudget(t *testing.T) {
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	g, gw := startGateway(t, Config{MaxInflightBodyBytes: 100 << 10}, node.URL)
	res, b := do(t, "POST", gw+"/bkt1/s", "", bytes.Repeat([]byte("x"), 200<<10))
	if res.StatusCode != 503 || !marked(res) || res.Header.Get(streamcore.HdrNotApplied) != "IngressBodyBytesLimitReached" ||
		!strings.Contains(string(b), CodeIngressBodyLimit) || res.Header.Get("Retry-After") == "" {
		t.Fatalf("declared body over the budget: %d %v %s", res.StatusCode, res.Header, b)
	}
	// A chunked body (no declared length) is charged as it is read.
	req, _ := http.NewRequest("POST", gw+"/bkt1/s", io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("y"), 300<<10))))
	req.ContentLength = -1
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 503 || r2.Header.Get(streamcore.HdrNotApplied) != "IngressBodyBytesLimitReached" {
		t.Fatalf("chunked body over the budget: %d", r2.StatusCode)
	}
	if n := len(node.requests()); n != 0 {
		t.Fatalf("refused bodies reached the node: %d", n)
	}
	if res, _ := do(t, "POST", gw+"/bkt1/s", "", bytes.Repeat([]byte("z"), 50<<10)); res.StatusCode != 204 {
		t.Fatalf("a body within the budget: %d", res.StatusCode)
	}
	// The charge is released when the handler returns, which may be just after the client
	// read the answer: wait for it, boundedly.
	deadline := time.Now().Add(5 * time.Second)
	for g.bodyUsed.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if u := g.bodyUsed.Load(); u != 0 {
		t.Fatalf("%d body bytes still charged after every request ended", u)
	}
	if !strings.Contains(metricsText(t, gw, ""), `ursula_gateway_refusals_total{reason="IngressBodyBytesLimitReached"} 2`) {
		t.Fatal("the refusals are not counted in /metrics")
	}
}

// The gateway answers CORS from its own config: preflight without the node, the
// configured origin only (not the node's "*"), none on operational routes.
func TestGatewayCORS(t *testing.T) {
	node := newFakeNode(t, server.New(engine.NewMemory(time.Minute), server.Config{}).ServeHTTP) // the node grants "*"
	_, gw := startGateway(t, Config{Auth: writeTokens(t, "tok bkt1\nadm admin\n"), CORSAllowedOrigins: []string{"https://app.example"}}, node.URL)
	get := func(method, path, token, origin string) *http.Response {
		req, _ := http.NewRequest(method, gw+path, nil)
		req.Header.Set("Origin", origin)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if method == "OPTIONS" {
			req.Header.Set("Access-Control-Request-Method", "PUT")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	res := get("OPTIONS", "/bkt1/s", "", "https://app.example")
	if res.StatusCode != 204 || res.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(res.Header.Get("Access-Control-Allow-Methods"), "PUT") || res.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Fatalf("preflight: %d %v", res.StatusCode, res.Header)
	}
	if n := len(node.requests()); n != 0 {
		t.Fatalf("preflight reached the node: %d", n)
	}
	if res := get("PUT", "/bkt1/s", "tok", "https://app.example"); res.StatusCode != 201 || res.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || res.Header.Get("Vary") == "" {
		t.Fatalf("allowed origin: %d %v", res.StatusCode, res.Header)
	}
	if res := get("GET", "/bkt1/s?offset=-1", "tok", "https://evil.example"); res.StatusCode != 200 || res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin: %d %v (the node's grant leaked through)", res.StatusCode, res.Header)
	}
	if res := get("GET", "/bkt1/s", "", "https://app.example"); res.StatusCode != 401 || res.Header.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Fatalf("a refusal a page must be able to read: %d %v", res.StatusCode, res.Header)
	}
	if res := get("GET", "/metrics", "adm", "https://app.example"); res.StatusCode != 200 || res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("/metrics: %d %v", res.StatusCode, res.Header)
	}
	if res := get("GET", "/metrics", "tok", ""); res.StatusCode != 404 {
		t.Fatalf("/metrics without the admin scope: %d", res.StatusCode)
	}
}

// Update changes the body limit and CORS at once, and refuses bad values whole.
func TestUpdateSettings(t *testing.T) {
	node := newFakeNode(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	g, gw := startGateway(t, Config{}, node.URL)
	for _, bad := range []struct {
		body, inflight int64
		cors           []string
	}{{-1, 0, nil}, {streamcore.MaxRequestBytes + 1, 0, nil}, {0, -5, nil}, {0, 0, []string{"app.example"}}} {
		if err := g.Update(bad.body, bad.inflight, bad.cors); err == nil {
			t.Fatalf("Update(%v) accepted", bad)
		}
	}
	if res, _ := do(t, "POST", gw+"/bkt1/s", "", bytes.Repeat([]byte("x"), 20)); res.StatusCode != 204 {
		t.Fatalf("a refused update changed the limit: %d", res.StatusCode)
	}
	if err := g.Update(10, 0, nil); err != nil {
		t.Fatal(err)
	}
	if res, _ := do(t, "POST", gw+"/bkt1/s", "", bytes.Repeat([]byte("x"), 20)); res.StatusCode != 413 {
		t.Fatalf("after lowering the limit: %d", res.StatusCode)
	}
}

// A full map is written at once rather than at the next interval.
func TestUsageLogWritesFullBatches(t *testing.T) {
	path := t.TempDir() + "/usage.jsonl"
	u := OpenUsageLog(path, 0, time.Hour, nil)
	defer u.Close()
	for i := range UsageBatchKeys + 10 {
		u.Add(UsageRecord{Bucket: fmt.Sprint("b", i), Action: ActionRead, Status: 200})
	}
	deadline := time.Now().Add(20 * time.Second)
	for u.writes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u.writes.Load() == 0 {
		t.Fatal("a full batch was not written before the (hour-long) interval")
	}
}
