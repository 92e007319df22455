package gateway

// Upstream choice: ejection of upstreams whose connections fail, and the memory of which
// upstream led a stream's group the last time a redirect was followed.

import (
	"net/url"
	"sync"
	"time"
)

// DefaultEjectFor is how long an upstream whose connection failed is tried only after the
// others.
const DefaultEjectFor = 5 * time.Second

// maxLeaderRoutes bounds the leader memory; past it, an arbitrary entry makes room.
const maxLeaderRoutes = 1 << 16

// upstreams is the listed nodes with their ejection and leader-memory state.
type upstreams struct {
	list     []*url.URL
	ejectFor time.Duration

	mu      sync.Mutex
	ejected map[string]time.Time // host -> until when it goes last
	leaders map[string]string    // routeKey -> host that answered after a redirect
}

func newUpstreams(list []*url.URL, ejectFor time.Duration) *upstreams {
	if ejectFor <= 0 {
		ejectFor = DefaultEjectFor
	}
	return &upstreams{list: list, ejectFor: ejectFor, ejected: map[string]time.Time{}, leaders: map[string]string{}}
}

// routeKey names what a leader is remembered for: a stream, or a bucket-level request.
func routeKey(bucket, stream string) string {
	if bucket == "" {
		return ""
	}
	return bucket + "\x00" + stream
}

// order is the upstreams to try for key at now: the remembered leader first (unless
// ejected), then the others in list order, the ejected ones last. An ejected upstream is
// still tried when nothing else answers, so ejection never refuses a request by itself.
func (s *upstreams) order(key string, now time.Time) []*url.URL {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*url.URL, 0, len(s.list))
	var late []*url.URL
	lead := s.leaders[key]
	for _, u := range s.list {
		if until, ok := s.ejected[u.Host]; ok {
			if now.Before(until) {
				late = append(late, u)
				continue
			}
		}
		if key != "" && u.Host == lead {
			out = append([]*url.URL{u}, out...)
		} else {
			out = append(out, u)
		}
	}
	return append(out, late...)
}

// eject puts host last for ejectFor from now, and forgets it as a leader.
func (s *upstreams) eject(host string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ejected[host] = now.Add(s.ejectFor)
	for k, h := range s.leaders {
		if h == host {
			delete(s.leaders, k)
		}
	}
}

// answered records that host completed an exchange: it is no longer ejected.
func (s *upstreams) answered(host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ejected, host)
}

// isEjected reports whether host goes last at now.
func (s *upstreams) isEjected(host string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.ejected[host]
	return ok && now.Before(until)
}

// remember records host as key's leader.
func (s *upstreams) remember(key, host string) {
	if key == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.leaders[key]; !ok && len(s.leaders) >= maxLeaderRoutes {
		for k := range s.leaders {
			delete(s.leaders, k)
			break
		}
	}
	s.leaders[key] = host
}

// leaderOf is key's remembered leader host, or "".
func (s *upstreams) leaderOf(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaders[key]
}

// counts is the number of remembered routes and of upstreams ejected at now.
func (s *upstreams) counts(now time.Time) (routes int, ejected map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ejected = map[string]bool{}
	for _, u := range s.list {
		until, ok := s.ejected[u.Host]
		ejected[u.Host] = ok && now.Before(until)
	}
	return len(s.leaders), ejected
}
