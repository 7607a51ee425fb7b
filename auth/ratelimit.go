package auth

import (
	"math"
	"sync"
	"time"
)

// Limit is a token bucket: Rate tokens per second, at most Burst at once. A zero Rate means no limit.
type Limit struct {
	Rate  float64
	Burst int
}

// Limiter keeps one token bucket per name (a key id, a client address). Its state is in this
// process only: with N replicas behind a balancer, a client gets up to N times the limit.
type Limiter struct {
	limit Limit
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets bounds memory: past it, buckets that have refilled completely are dropped (they are
// indistinguishable from new ones).
const maxBuckets = 100_000

// NewLimiter returns a limiter; now may be nil (time.Now). A nil *Limiter allows everything.
func NewLimiter(l Limit, now func() time.Time) *Limiter {
	if l.Rate <= 0 {
		return nil
	}
	if l.Burst < 1 {
		l.Burst = 1
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter{limit: l, now: now, buckets: map[string]*bucket{}}
}

// Allow takes one token from name's bucket. When none is left it returns false and how long
// until one is.
func (l *Limiter) Allow(name string) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[name]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.sweep(now)
		}
		b = &bucket{tokens: float64(l.limit.Burst), last: now}
		l.buckets[name] = b
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = math.Min(float64(l.limit.Burst), b.tokens+el*l.limit.Rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.limit.Rate * float64(time.Second))
	return false, wait
}

func (l *Limiter) sweep(now time.Time) {
	for name, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.limit.Rate >= float64(l.limit.Burst) {
			delete(l.buckets, name)
		}
	}
}
