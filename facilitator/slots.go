package facilitator

import (
	"sync"
	"time"
)

// Refusals of a long-lived connection (an event stream, a console live page). Ours, additive.
const (
	// ReasonTooManyStreams: every one of the facilitator's stream slots is taken (HTTP 503 with
	// Retry-After).
	ReasonTooManyStreams = "too_many_streams"
	// ReasonTooManyStreamsForKey: the API key holds its whole share of the stream slots (HTTP 429
	// with Retry-After): it must close one of its own first, while other keys still get theirs.
	ReasonTooManyStreamsForKey = "too_many_streams_for_key"
)

// streamRetryAfter is the advice on a refused stream: open ones end when their clients leave, or
// at the end of their lifetime, so seconds, not minutes.
const streamRetryAfter = 5 * time.Second

// Slots bounds long-lived connections (streams) that one process holds open: at most Total in
// all, and at most PerKey of them for one owner (an API key's id; "" in open mode, which is one
// owner), so that a key that fills its share leaves room for the others.
type Slots struct {
	total, perKey int

	mu    sync.Mutex
	open  int
	byKey map[string]int
}

// NewSlots returns room for total streams, perKey of them for one owner.
func NewSlots(total, perKey int) *Slots {
	return &Slots{total: total, perKey: perKey, byKey: map[string]int{}}
}

// Take takes one slot for owner, or refuses: ReasonTooManyStreamsForKey when owner holds its
// share (whatever the total), else ReasonTooManyStreams when every slot is taken. Give it back
// with Give.
func (s *Slots) Take(owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey[owner] >= s.perKey {
		return &Error{Code: ELimited, Reason: ReasonTooManyStreamsForKey, RetryAfter: streamRetryAfter,
			Message: "this API key has too many open streams: close one, or retry later"}
	}
	if s.open >= s.total {
		return &Error{Code: EUnavailable, Reason: ReasonTooManyStreams, RetryAfter: streamRetryAfter,
			Message: "too many open streams, retry later"}
	}
	s.open++
	s.byKey[owner]++
	return nil
}

// Give returns a slot Take gave owner.
func (s *Slots) Give(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if s.byKey[owner]--; s.byKey[owner] <= 0 {
		delete(s.byKey, owner)
	}
}

// Open reports how many slots are taken.
func (s *Slots) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}
