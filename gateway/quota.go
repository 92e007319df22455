package gateway

// Per-bucket admission limits. They are local to one gateway process: several gateway
// replicas multiply them.

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Limits are one bucket's quotas; a zero field is no limit (or, in a bucket's entry,
// the default's value).
type Limits struct {
	// RequestsPerSec is the sustained request rate; a burst of up to one second's worth
	// (at least one request) passes at once. Over it: 429 with Retry-After.
	RequestsPerSec float64
	// MaxLiveReads bounds the bucket's concurrent long-poll and SSE reads (429 over it).
	MaxLiveReads int
	// MaxRequestBodyBytes lowers the gateway's body limit for the bucket (413 over it).
	MaxRequestBodyBytes int64
}

// QuotaPolicy is the quota configuration: a default and per-bucket overrides.
type QuotaPolicy struct {
	Default Limits
	Buckets map[string]Limits
}

// Quotas enforces a QuotaPolicy.
type Quotas struct {
	policy atomic.Pointer[QuotaPolicy]
	mu     sync.Mutex
	rate   map[string]*tokenBucket
	live   map[string]int
}

// NewQuotas returns the enforcement of p.
func NewQuotas(p QuotaPolicy) *Quotas {
	q := &Quotas{rate: map[string]*tokenBucket{}, live: map[string]int{}}
	q.SetPolicy(p)
	return q
}

// SetPolicy replaces the policy (a reload). Live-read counts carry over; a bucket whose
// rate changed starts a fresh token bucket at the new rate.
func (q *Quotas) SetPolicy(p QuotaPolicy) {
	q.policy.Store(&p)
}

// limitsOf is bucket's limits: its entry, with the default for the fields it leaves zero.
func (q *Quotas) limitsOf(bucket string) Limits {
	p := q.policy.Load()
	l := p.Default
	b, ok := p.Buckets[bucket]
	if !ok {
		return l
	}
	if b.RequestsPerSec != 0 {
		l.RequestsPerSec = b.RequestsPerSec
	}
	if b.MaxLiveReads != 0 {
		l.MaxLiveReads = b.MaxLiveReads
	}
	if b.MaxRequestBodyBytes != 0 {
		l.MaxRequestBodyBytes = b.MaxRequestBodyBytes
	}
	return l
}

// tokenBucket holds up to capacity tokens, refilled at rate per second.
type tokenBucket struct {
	tokens, capacity, rate float64
	last                   time.Time
}

// take spends one request of bucket's rate at now. When none is left it returns how
// long until one is, and false.
func (q *Quotas) take(bucket string, now time.Time) (time.Duration, bool) {
	rps := q.limitsOf(bucket).RequestsPerSec
	if rps <= 0 {
		return 0, true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	tb := q.rate[bucket]
	if tb == nil || tb.rate != rps {
		c := math.Max(1, rps)
		tb = &tokenBucket{tokens: c, capacity: c, rate: rps, last: now}
		q.rate[bucket] = tb
	}
	if d := now.Sub(tb.last).Seconds(); d > 0 {
		tb.tokens = math.Min(tb.capacity, tb.tokens+d*tb.rate)
		tb.last = now
	}
	if tb.tokens >= 1 {
		tb.tokens--
		return 0, true
	}
	return time.Duration((1 - tb.tokens) / tb.rate * float64(time.Second)), false
}

// acquireLive takes one of bucket's live-read slots; releaseLive gives it back.
func (q *Quotas) acquireLive(bucket string) bool {
	max := q.limitsOf(bucket).MaxLiveReads
	q.mu.Lock()
	defer q.mu.Unlock()
	if max > 0 && q.live[bucket] >= max {
		return false
	}
	q.live[bucket]++
	return true
}

func (q *Quotas) releaseLive(bucket string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.live[bucket]--; q.live[bucket] <= 0 {
		delete(q.live, bucket)
	}
}
