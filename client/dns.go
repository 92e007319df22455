package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// The transport resolves host names itself, so that a flapping or slow DNS server costs
// a replicated database as little as possible:
//   - a host is looked up at most once every dnsRefresh, and one lookup runs at a time;
//     while it runs, other dials use the host's last addresses;
//   - a lookup may take dnsLookupTimeout;
//   - while lookups fail, the last addresses keep serving for dnsStaleFor after the last
//     successful lookup, and the lookup is retried dnsRetry after each failure;
//   - a host without usable addresses fails its dials at once (the request was never
//     sent) until a lookup succeeds, with one lookup every dnsRetry;
//   - a dial that reaches none of the addresses makes the next lookup due, though no
//     sooner than dnsRetry after the previous one (the host may have moved).
//
// Go's transport dials only when no pooled connection is free, so a lookup never holds
// up a request that a pooled connection could serve.
const (
	dnsRefresh       = 30 * time.Second
	dnsRetry         = 5 * time.Second
	dnsStaleFor      = 10 * time.Minute
	dnsLookupTimeout = 5 * time.Second
	dnsStaleLogEvery = 5 * time.Second
	connectTimeout   = 5 * time.Second
)

// addrCache holds the last addresses of each host the transport dialed by name.
type addrCache struct {
	lookup  func(ctx context.Context, host string) ([]string, error)
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	now     func() time.Time
	onStale func(host string, age time.Duration, reason error)

	mu    sync.Mutex
	hosts map[string]*hostAddrs
}

type hostAddrs struct {
	addrs      []string
	okAt       time.Time     // the last successful lookup
	lookupAt   time.Time     // the start of the last lookup
	nextLookup time.Time     // when the next lookup is due
	running    chan struct{} // closed when the running lookup ends; nil when none runs
	lastErr    error         // the last lookup's failure; nil after a success
	staleLogAt time.Time     // the last dns_stale report
}

func newAddrCache(onStale func(host string, age time.Duration, reason error)) *addrCache {
	d := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	return &addrCache{
		lookup:  net.DefaultResolver.LookupHost,
		dial:    d.DialContext,
		now:     time.Now,
		onStale: onStale,
		hosts:   map[string]*hostAddrs{},
	}
}

// dialContext is the transport's DialContext: a host name is dialed at its cached
// addresses, in order; an IP address is dialed as it is.
func (c *addrCache) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) != nil {
		return c.dial(ctx, network, addr)
	}
	ips, err := c.addrs(ctx, host)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	var first error
	for _, ip := range ips {
		conn, err := c.dial(ctx, network, net.JoinHostPort(ip, port))
		if err == nil {
			return conn, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			return nil, first
		}
	}
	c.connectFailed(host)
	return nil, first
}

// addrs returns the addresses to dial host at, looking it up when a lookup is due.
func (c *addrCache) addrs(ctx context.Context, host string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.hosts[host]
	if h == nil {
		h = &hostAddrs{}
		c.hosts[host] = h
	}
	for {
		now := c.now()
		if h.running == nil && !now.Before(h.nextLookup) {
			return c.lookupLocked(ctx, host, h)
		}
		if c.usable(h, now) {
			c.noteStale(host, h, now)
			return h.addrs, nil
		}
		if h.running == nil {
			return nil, fmt.Errorf("no usable addresses for %s (%v); next lookup in %s", host, h.lastErr, h.nextLookup.Sub(now).Round(time.Millisecond))
		}
		// Nothing to dial yet: wait for the running lookup.
		running := h.running
		c.mu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
			c.mu.Lock()
			return nil, ctx.Err()
		}
		c.mu.Lock()
	}
}

// lookupLocked runs one lookup of host with c.mu released while it runs.
func (c *addrCache) lookupLocked(ctx context.Context, host string, h *hostAddrs) ([]string, error) {
	done := make(chan struct{})
	h.running, h.lookupAt = done, c.now()
	c.mu.Unlock()
	// The lookup outlives a cancelled request: its answer serves the next ones.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dnsLookupTimeout)
	ips, err := c.lookup(lctx, host)
	cancel()
	if err == nil && len(ips) == 0 {
		err = errors.New("the lookup gave no addresses")
	}
	c.mu.Lock()
	h.running = nil
	close(done)
	now := c.now()
	if err == nil {
		h.addrs, h.okAt, h.lastErr = ips, now, nil
		h.nextLookup = now.Add(dnsRefresh)
		return ips, nil
	}
	h.lastErr = err
	h.nextLookup = now.Add(dnsRetry)
	if c.usable(h, now) {
		c.noteStale(host, h, now)
		return h.addrs, nil
	}
	return nil, fmt.Errorf("looking up %s: %w", host, err)
}

func (c *addrCache) usable(h *hostAddrs, now time.Time) bool {
	return len(h.addrs) > 0 && now.Sub(h.okAt) <= dnsStaleFor
}

// noteStale reports stale addresses serving a dial after a failed lookup, at most once
// per host every dnsStaleLogEvery.
func (c *addrCache) noteStale(host string, h *hostAddrs, now time.Time) {
	if h.lastErr == nil || c.onStale == nil {
		return
	}
	if !h.staleLogAt.IsZero() && now.Sub(h.staleLogAt) < dnsStaleLogEvery {
		return
	}
	h.staleLogAt = now
	c.onStale(host, now.Sub(h.okAt), h.lastErr)
}

// connectFailed makes host's next lookup due, no sooner than dnsRetry after the last.
func (c *addrCache) connectFailed(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.hosts[host]; h != nil {
		if due := h.lookupAt.Add(dnsRetry); due.Before(h.nextLookup) {
			h.nextLookup = due
		}
	}
}
