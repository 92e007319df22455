package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/ursula-go/ursula/internal/testserver"
)

// TestProxyFromEnvironment (checklist-vfs A7): requests go through the proxy the
// environment names for their scheme (ALL_PROXY when the scheme has none), except hosts
// NO_PROXY lists and loopback hosts, which go direct. The target here is a name that
// never resolves: only the proxy, which maps it to a real server, can answer.
func TestProxyFromEnvironment(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	target, _ := url.Parse(srv.URL)
	var proxied atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		r.Host = target.Host
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()

	for _, env := range []string{"HTTP_PROXY", "http_proxy", "ALL_PROXY"} {
		t.Run(env, func(t *testing.T) {
			for _, v := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"} {
				t.Setenv(v, "")
			}
			t.Setenv(env, proxy.URL)
			c, err := New("", WithHTTPClient(&http.Client{Transport: NewTransport()}))
			if err != nil {
				t.Fatal(err)
			}
			before := proxied.Load()
			url := "http://db.ursula-test.invalid/proxy/" + env
			if _, err := c.Create(context.Background(), url, CreateOptions{ContentType: "application/octet-stream"}); err != nil {
				t.Fatalf("create through the proxy: %v", err)
			}
			if _, err := c.Head(context.Background(), url); err != nil {
				t.Fatalf("HEAD through the proxy: %v", err)
			}
			if got := proxied.Load() - before; got != 2 {
				t.Fatalf("%d requests went through the proxy, want 2", got)
			}
		})
	}

	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("HTTPS_PROXY", "")
	t.Setenv("ALL_PROXY", "")
	t.Setenv("NO_PROXY", "direct.example, .corp.example, 10.1.0.0/16, other.example:8080")
	pick := NewTransport().Proxy
	for u, want := range map[string]bool{
		"http://direct.example/b/s":        false,
		"http://a.direct.example/b/s":      false,
		"http://x.corp.example/b/s":        false,
		"http://10.1.2.3:4437/b/s":         false,
		"http://other.example:8080/b/s":    false,
		"http://other.example:4437/b/s":    true,
		"http://127.0.0.1:4437/b/s":        false,
		"http://localhost:4437/b/s":        false,
		"http://notdirect.example/b/s":     true,
		"https://secure.example/b/s":       false, // no HTTPS_PROXY, no ALL_PROXY
		"http://undirect.example.org/b/s":  true,
		"http://10.2.0.1/b/s":              true,
		"http://[::1]:4437/b/s":            false,
		"http://corp.example.attack/b/s":   true,
		"http://direct.example.attack/b/s": true,
	} {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		got, err := pick(req)
		if err != nil || (got != nil) != want {
			t.Errorf("%s: proxy %v (%v), want proxied=%t", u, got, err, want)
		}
	}
}
