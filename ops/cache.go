package ops

import (
	"context"
	"time"
)

// cache holds one value computed by read for ttl, and single-flights its refresh: however many
// requests ask at once, read runs once per period, and the others wait for its answer (or for
// their own context to end, then taking the last value, possibly stale).
type cache[T any] struct {
	ttl  time.Duration
	now  func() time.Time
	read func(context.Context) T
	sem  chan struct{} // held while reading or looking; one slot

	at  time.Time
	val T
	ok  bool
}

func newCache[T any](ttl time.Duration, now func() time.Time, read func(context.Context) T) cache[T] {
	return cache[T]{ttl: ttl, now: now, read: read, sem: make(chan struct{}, 1)}
}

func (c *cache[T]) get(ctx context.Context) T {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		var zero T
		return zero
	}
	defer func() { <-c.sem }()
	if c.ok && c.now().Sub(c.at) < c.ttl {
		return c.val
	}
	c.val, c.at, c.ok = c.read(ctx), c.now(), true
	return c.val
}
