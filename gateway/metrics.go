package gateway

// The gateway's own /metrics (Prometheus text format): requests by status, the gateway's
// refusals by reason, upstream errors by upstream and kind, and its state gauges.

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
)

type metrics struct {
	mu        sync.Mutex
	requests  map[int]uint64
	refusals  map[string]uint64
	upErrors  map[[2]string]uint64 // upstream host, kind (connect, exchange)
	redirects uint64
}

func newMetrics() *metrics {
	return &metrics{requests: map[int]uint64{}, refusals: map[string]uint64{}, upErrors: map[[2]string]uint64{}}
}

func (m *metrics) request(status int) {
	m.mu.Lock()
	m.requests[status]++
	m.mu.Unlock()
}

func (m *metrics) refusal(reason string) {
	if reason == "" {
		reason = "other"
	}
	m.mu.Lock()
	m.refusals[reason]++
	m.mu.Unlock()
}

func (m *metrics) upstreamError(host, kind string) {
	m.mu.Lock()
	m.upErrors[[2]string{host, kind}]++
	m.mu.Unlock()
}

func (m *metrics) redirect() {
	m.mu.Lock()
	m.redirects++
	m.mu.Unlock()
}

// serveMetrics writes the metrics.
func (g *Gateway) serveMetrics(w http.ResponseWriter) {
	m := g.metrics
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Header().Set("Cache-Control", "no-store")
	m.mu.Lock()
	req, ref, ue, redirects := maps.Clone(m.requests), maps.Clone(m.refusals), maps.Clone(m.upErrors), m.redirects
	m.mu.Unlock()
	routes, ejected := g.up.counts(g.now())
	var b []byte
	add := func(format string, a ...any) { b = fmt.Appendf(b, format, a...) }
	add("# HELP ursula_gateway_requests_total Requests answered, by status.\n# TYPE ursula_gateway_requests_total counter\n")
	for _, s := range slices.Sorted(maps.Keys(req)) {
		add("ursula_gateway_requests_total{code=\"%d\"} %d\n", s, req[s])
	}
	add("# HELP ursula_gateway_refusals_total Requests the gateway refused itself, by reason.\n# TYPE ursula_gateway_refusals_total counter\n")
	for _, r := range slices.Sorted(maps.Keys(ref)) {
		add("ursula_gateway_refusals_total{reason=%q} %d\n", r, ref[r])
	}
	add("# HELP ursula_gateway_upstream_errors_total Failed upstream exchanges, by upstream and kind (connect: nothing was sent; exchange: the outcome is unknown).\n# TYPE ursula_gateway_upstream_errors_total counter\n")
	keys := slices.SortedFunc(maps.Keys(ue), func(a, b [2]string) int {
		if a[0] != b[0] {
			return strings.Compare(a[0], b[0])
		}
		return strings.Compare(a[1], b[1])
	})
	for _, k := range keys {
		add("ursula_gateway_upstream_errors_total{upstream=%q,kind=%q} %d\n", k[0], k[1], ue[k])
	}
	add("# HELP ursula_gateway_redirects_followed_total Leader redirects the gateway followed.\n# TYPE ursula_gateway_redirects_followed_total counter\nursula_gateway_redirects_followed_total %d\n", redirects)
	add("# HELP ursula_gateway_upstream_ejected Whether an upstream is ejected (tried last) now.\n# TYPE ursula_gateway_upstream_ejected gauge\n")
	for _, u := range g.up.list {
		v := 0
		if ejected[u.Host] {
			v = 1
		}
		add("ursula_gateway_upstream_ejected{upstream=%q} %d\n", u.Host, v)
	}
	add("# HELP ursula_gateway_leader_routes Streams whose leader the gateway remembers.\n# TYPE ursula_gateway_leader_routes gauge\nursula_gateway_leader_routes %d\n", routes)
	add("# HELP ursula_gateway_inflight_body_bytes Request body bytes the gateway holds.\n# TYPE ursula_gateway_inflight_body_bytes gauge\nursula_gateway_inflight_body_bytes %d\n", g.bodyUsed.Load())
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, string(b))
}
