package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"
)

// fakeDNS answers the transport's lookups from the test, on a clock the test moves: no
// DNS traffic leaves the process and every address it gives is on loopback.
type fakeDNS struct {
	mu      sync.Mutex
	now     time.Time
	ips     []string
	err     error
	lookups int
	hold    chan struct{} // when set, the next lookup signals entered and waits for it
	entered chan struct{}
	stale   []time.Duration // ages reported as dns_stale
}

func (f *fakeDNS) clock() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }

func (f *fakeDNS) advance(d time.Duration) { f.mu.Lock(); f.now = f.now.Add(d); f.mu.Unlock() }

func (f *fakeDNS) answer(ips []string, err error) {
	f.mu.Lock()
	f.ips, f.err = ips, err
	f.mu.Unlock()
}

func (f *fakeDNS) lookup(ctx context.Context, host string) ([]string, error) {
	f.mu.Lock()
	f.lookups++
	hold, entered := f.hold, f.entered
	f.hold = nil
	f.mu.Unlock()
	if hold != nil {
		close(entered)
		<-hold
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ips, f.err
}

func (f *fakeDNS) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.lookups }

// TestDNSRules (checklist-vfs T32, L102-105) checks the transport's host resolution, on
// an injected clock and resolver (no real waits): at most one lookup every 30 s;
// after a failed lookup the last addresses serve for up to 10 minutes, the lookup is
// retried 5 s later and dns_stale is reported at most once every 5 s; one lookup runs at
// a time while other requests use the last addresses; a host without usable addresses
// fails at once as never sent, with one lookup every 5 s; and a failed connect makes the
// next lookup due 5 s after the previous one instead of 30 s.
func TestDNSRules(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{ClusterID: "dns-test"})
	su, _ := url.Parse(ts.URL)
	f := &fakeDNS{now: time.Unix(1_000_000, 0)}
	f.answer([]string{"127.0.0.1"}, nil)
	ac := newAddrCache(func(host string, age time.Duration, reason error) {
		f.stale = append(f.stale, age) // called with the cache locked: no race with the test
	})
	ac.lookup, ac.now = f.lookup, f.clock
	tr := newTransport(ac)
	tr.Proxy = nil              // nothing may leave loopback, whatever the environment says
	tr.DisableKeepAlives = true // every request dials, so every request meets the resolver
	c, err := New("", WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	streamURL := "http://dns-rules.test:" + su.Port() + "/bucket/dns"
	ctx := context.Background()
	if _, err := c.Create(ctx, streamURL, CreateOptions{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	head := func() error { _, err := c.Head(ctx, streamURL); return err }
	mustHead := func(step string, lookups int) {
		t.Helper()
		if err := head(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if n := f.count(); n != lookups {
			t.Fatalf("%s: %d lookups, want %d", step, n, lookups)
		}
	}
	mustHead("the first request looks the host up", 1)
	f.advance(10 * time.Second)
	mustHead("within 30 s, no lookup", 1)

	f.advance(21 * time.Second) // 31 s after the lookup
	f.answer(nil, errors.New("SERVFAIL"))
	mustHead("a failed lookup serves the last addresses", 2)
	if len(f.stale) != 1 || f.stale[0] != 31*time.Second {
		t.Fatalf("dns_stale after the failed lookup: %v", f.stale)
	}
	f.advance(time.Second)
	mustHead("within 5 s of the failure, no lookup", 2)
	if len(f.stale) != 1 {
		t.Fatalf("dns_stale again within 5 s: %v", f.stale)
	}
	f.advance(4 * time.Second)
	mustHead("5 s after the failure, the lookup is retried", 3)
	if len(f.stale) != 2 || f.stale[1] != 36*time.Second {
		t.Fatalf("dns_stale 5 s later: %v", f.stale)
	}

	// One lookup at a time: while one hangs, another request uses the last addresses.
	f.advance(5 * time.Second)
	hold, entered := make(chan struct{}), make(chan struct{})
	f.mu.Lock()
	f.hold, f.entered = hold, entered
	f.mu.Unlock()
	first := make(chan error, 1)
	go func() { first <- head() }()
	<-entered
	mustHead("a request during a running lookup", 4)
	close(hold)
	if err := <-first; err != nil {
		t.Fatalf("the request that looked up: %v", err)
	}

	// Ten minutes after the last successful lookup the addresses are no longer used: the
	// request fails as never sent, and again at once until the next lookup is due.
	f.advance(10*time.Minute - 41*time.Second + time.Second)
	if err := head(); OutcomeOf(err) != NotApplied {
		t.Fatalf("no usable addresses: outcome %v (%v)", OutcomeOf(err), err)
	}
	if f.count() != 5 {
		t.Fatalf("%d lookups, want 5", f.count())
	}
	f.advance(time.Second)
	if err := head(); OutcomeOf(err) != NotApplied || f.count() != 5 {
		t.Fatalf("within 5 s, no lookup and never sent: %d lookups, %v", f.count(), err)
	}
	f.advance(4 * time.Second)
	f.answer([]string{"127.0.0.1"}, nil)
	mustHead("the lookup after 5 s succeeds", 6)

	// A failed connect (nothing listens at 127.0.0.2) makes the next lookup due 5 s after
	// the previous one, not 30 s.
	f.advance(30 * time.Second)
	f.answer([]string{"127.0.0.2"}, nil)
	if err := head(); OutcomeOf(err) != NotApplied || f.count() != 7 {
		t.Fatalf("refused connect: %d lookups, %v", f.count(), err)
	}
	var oe *net.OpError
	if err := head(); !errors.As(err, &oe) || f.count() != 7 {
		t.Fatalf("within 5 s the same addresses are dialed again: %d lookups, %v", f.count(), err)
	}
	f.advance(5 * time.Second)
	f.answer([]string{"127.0.0.1"}, nil)
	mustHead("5 s after the lookup whose address refused", 8)
}
