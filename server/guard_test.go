package server

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/internal/testissuer"
	"github.com/ursula-go/ursula/streamcore"
)

// newAuthServer starts a server with a token file, a JWT issuer and a tenant policy:
//
//	tok-a      tenant-a          tok-admin  admin
//	tok-all    *                 alice (JWT) owns tenant-b; tenant-pub is public_read
func newAuthServer(t *testing.T, origins []string) (*httptest.Server, *testissuer.TestIssuer) {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("# test tokens\ntok-a tenant-a\ntok-admin admin\ntok-all *\n"), 0o600)
	policy := filepath.Join(dir, "policy.toml")
	os.WriteFile(policy, []byte(`
[[bucket]]
id = "tenant-b"
owners = [{ issuer = "`+testissuer.Issuer+`", subject = "alice" }]
[[bucket]]
id = "tenant-pub"
public_read = true
`), 0o600)
	is := testissuer.New(t, "k1")
	ctx, cancel := context.WithCancel(context.Background())
	a, err := auth.New(ctx, auth.Config{TokenFile: tokens, PolicyFile: policy,
		Issuer: testissuer.Issuer, Audience: testissuer.Audience, JWKSURL: is.JWKSURL()})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.NewMemory(0)
	ts := httptest.NewServer(New(eng, Config{ClusterID: "test-cluster", Auth: a, CORSAllowedOrigins: origins}))
	t.Cleanup(func() { ts.Close(); eng.Close(); cancel() })
	return ts, is
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

func TestAuthRefusals(t *testing.T) {
	ts, is := newAuthServer(t, nil)
	u := ts.URL
	ct := []string{"Content-Type", "text/plain"}
	with := func(tok string, h ...string) []string { return append(bearer(tok), h...) }
	alice := is.Sign(t, "k1", testissuer.Claims("alice", time.Hour), "at+jwt")
	bob := is.Sign(t, "k1", testissuer.Claims("bob", time.Hour), "at+jwt")
	expired := is.Sign(t, "k1", testissuer.Claims("alice", -time.Hour), "at+jwt")

	// No credential, a bad one, an expired one: 401 with the JSON error body.
	for _, hdr := range [][]string{ct, with("nope", ct...), with(expired, ct...), {"Authorization", "Basic dTpw"}} {
		a := do(t, "PUT", u+"/tenant-a/s1", "", hdr...)
		expect(t, a, http.StatusUnauthorized, CodeUnauthorized)
		if a.h.Get("Content-Type") != "application/json" || a.h.Get("WWW-Authenticate") == "" {
			t.Fatalf("401 headers: %v", a.h)
		}
	}
	// In scope: the requests go through.
	expect(t, do(t, "PUT", u+"/tenant-a/s1", "", with("tok-a", ct...)...), http.StatusCreated, "")
	if a := do(t, "POST", u+"/tenant-a/s1", "hi", with("tok-a", ct...)...); a.status/100 != 2 {
		t.Fatalf("append in scope: %d %s", a.status, a.body)
	}
	if a := do(t, "GET", u+"/tenant-a/s1?offset=-1", "", bearer("tok-a")...); a.status != 200 || a.body != "hi" {
		t.Fatalf("read in scope: %d %q", a.status, a.body)
	}
	// Out of scope: the 404 of a missing bucket, the same whether the bucket holds
	// streams (tenant-c, made by tok-all) or not (tenant-z).
	expect(t, do(t, "PUT", u+"/tenant-c/s1", "", with("tok-all", ct...)...), http.StatusCreated, "")
	exists := do(t, "GET", u+"/tenant-c/s1?offset=-1", "", bearer("tok-a")...)
	missing := do(t, "GET", u+"/tenant-z/s1?offset=-1", "", bearer("tok-a")...)
	expect(t, exists, http.StatusNotFound, streamcore.CodeBucketNotFound)
	if exists.body != missing.body {
		t.Fatalf("concealment differs: %q vs %q", exists.body, missing.body)
	}
	expect(t, do(t, "POST", u+"/tenant-c/s1", "x", with("tok-a", ct...)...), http.StatusNotFound, streamcore.CodeBucketNotFound)
	expect(t, do(t, "PUT", u+"/tenant-c", "", bearer("tok-a")...), http.StatusNotFound, streamcore.CodeBucketNotFound)
	expect(t, do(t, "GET", u+"/v1/stream/x", "", bearer("tok-a")...), http.StatusNotFound, streamcore.CodeBucketNotFound)

	// Policy: alice owns tenant-b, bob does not; tenant-pub is readable by anyone.
	expect(t, do(t, "PUT", u+"/tenant-b/s1", "", with(alice, ct...)...), http.StatusCreated, "")
	expect(t, do(t, "GET", u+"/tenant-b/s1?offset=-1", "", bearer(bob)...), http.StatusNotFound, streamcore.CodeBucketNotFound)
	expect(t, do(t, "PUT", u+"/tenant-pub/s1", "", with("tok-all", ct...)...), http.StatusCreated, "")
	if a := do(t, "GET", u+"/tenant-pub/s1?offset=-1", ""); a.status != 200 {
		t.Fatalf("anonymous public read: %d %s", a.status, a.body)
	}
	expect(t, do(t, "POST", u+"/tenant-pub/s1", "x", ct...), http.StatusUnauthorized, CodeUnauthorized)
	expect(t, do(t, "POST", u+"/tenant-pub/s1", "x", with(bob, ct...)...), http.StatusNotFound, streamcore.CodeBucketNotFound)

	// Operational routes need the admin scope; readiness stays open.
	expect(t, do(t, "GET", u+"/__ursula/metrics", ""), http.StatusUnauthorized, CodeUnauthorized)
	expect(t, do(t, "GET", u+"/__ursula/metrics", "", bearer("tok-all")...), http.StatusNotFound, streamcore.CodeNotFound)
	expect(t, do(t, "GET", u+"/metrics", "", bearer("tok-a")...), http.StatusNotFound, streamcore.CodeNotFound)
	if a := do(t, "GET", u+"/__ursula/metrics", "", bearer("tok-admin")...); a.status != 200 {
		t.Fatalf("admin metrics: %d", a.status)
	}
	if a := do(t, "GET", u+"/__ursula/ready", ""); a.status != 200 {
		t.Fatalf("ready without a token: %d", a.status)
	}

	// Preflight never consults the resource: one answer for every path, no credential.
	p1 := do(t, "OPTIONS", u+"/tenant-c/s1", "", "Origin", "https://app.test", "Access-Control-Request-Method", "POST")
	p2 := do(t, "OPTIONS", u+"/tenant-zz/none", "", "Origin", "https://app.test", "Access-Control-Request-Method", "POST")
	if p1.status != http.StatusNoContent || p2.status != p1.status || p1.h.Get("Access-Control-Allow-Methods") != p2.h.Get("Access-Control-Allow-Methods") {
		t.Fatalf("preflight differs: %d %v / %d %v", p1.status, p1.h, p2.status, p2.h)
	}
	// With auth on and no configured origins, no origin is allowed.
	if o := p1.h.Get("Access-Control-Allow-Origin"); o != "" {
		t.Fatalf("Access-Control-Allow-Origin %q with no configured origins", o)
	}
}

// TestAuthCORSOrigins: stream routes grant configured origins only (operational routes
// grant none: see isOpsPath), never with credentials.
func TestAuthCORSOrigins(t *testing.T) {
	ts, _ := newAuthServer(t, []string{"https://app.test"})
	a := do(t, "GET", ts.URL+"/tenant-x/none", "", "Origin", "https://app.test")
	if a.h.Get("Access-Control-Allow-Origin") != "https://app.test" || a.h.Get("Access-Control-Expose-Headers") != "*" || a.h.Get("Vary") != "Origin" {
		t.Fatalf("listed origin: %v", a.h)
	}
	if a.h.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatal("credentials allowed")
	}
	if o := do(t, "GET", ts.URL+"/tenant-x/none", "", "Origin", "https://evil.test").h.Get("Access-Control-Allow-Origin"); o != "" {
		t.Fatalf("unlisted origin allowed: %q", o)
	}
	// A node without auth and without configured origins stays open to every origin.
	if o := do(t, "GET", newTestServer(t).URL+"/tenant-x/none", "", "Origin", "https://x.test").h.Get("Access-Control-Allow-Origin"); o != "*" {
		t.Fatalf("bare node: Access-Control-Allow-Origin %q", o)
	}
}

// An SSE subscription ends at its credential's exp with the credential-expired event.
func TestSSEEndsAtCredentialExpiry(t *testing.T) {
	ts, is := newAuthServer(t, nil)
	alice := is.Sign(t, "k1", testissuer.Claims("alice", 2*time.Second), "at+jwt")
	expect(t, do(t, "PUT", ts.URL+"/tenant-b/live", "", append(bearer(alice), "Content-Type", "text/plain")...), http.StatusCreated, "")
	req, _ := http.NewRequest("GET", ts.URL+"/tenant-b/live?offset=-1&live=sse", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang fails, not a slow run
	defer cancel()
	res, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	var events []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, ev)
		}
	}
	if len(events) == 0 || events[len(events)-1] != "credential-expired" {
		t.Fatalf("events %v: want the last to be credential-expired", events)
	}
}
