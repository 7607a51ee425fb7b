package notify

import (
	"net/url"
	"strings"
	"time"
)

// A circuit breaker per endpoint: after threshold failures in a row (no answer, or a 5xx or 429)
// the endpoint is open for a cool-down, during which its deliveries are not attempted (they wait,
// and their attempts are not spent); then one probe is let through. A success closes it; a failed
// probe opens it again for twice as long, up to a cap. So a dead endpoint holds a delivery slot
// for one probe per cool-down instead of one per due delivery.
//
// The state is this dispatcher's, in memory: each replica learns an endpoint is dead on its own
// (threshold attempts), which costs little next to sharing it through the ledger.

// breakerOutcome is what an attempt says about its endpoint.
type breakerOutcome int

const (
	// endpointUp: the endpoint answered (any status but a 5xx or 429).
	endpointUp breakerOutcome = iota
	// endpointDown: no answer in time, a refused connection, a 5xx or a 429.
	endpointDown
	// endpointUnknown: the attempt ended before reaching the endpoint (the ledger or the node
	// failed); it says nothing about the endpoint.
	endpointUnknown
)

// breaker is one endpoint's state. Closed: failures < threshold. Open: failures >= threshold and
// now < until. Half-open: past until, one probe at a time.
type breaker struct {
	failures int       // in a row
	opens    int       // cool-downs in a row, for their growth
	until    time.Time // end of the cool-down
	probing  bool      // the half-open probe is in flight
}

// breakers are the endpoints' breakers. Not safe for concurrent use: the Dispatcher holds a lock.
type breakers struct {
	threshold int
	cooldown  time.Duration // the first cool-down; each failed probe doubles it
	maxCool   time.Duration
	// probeFor bounds a probe: while one is in flight the endpoint's deliveries are deferred
	// this long (its answer comes by then).
	probeFor time.Duration
	m        map[string]*breaker
}

func newBreakers(threshold int, cooldown, maxCool, probeFor time.Duration) *breakers {
	return &breakers{threshold: threshold, cooldown: cooldown, maxCool: max(maxCool, cooldown), probeFor: probeFor,
		m: map[string]*breaker{}}
}

// blocked reports whether an attempt at the endpoint would be refused now: open, or half-open
// with its probe in flight. It changes nothing.
func (bs *breakers) blocked(endpoint string, now time.Time) bool {
	b := bs.m[endpoint]
	return b != nil && b.failures >= bs.threshold && (now.Before(b.until) || b.probing)
}

// known reports whether the endpoint has a breaker that is not plainly closed.
func (bs *breakers) known(endpoint string) bool {
	b := bs.m[endpoint]
	return b != nil && b.failures >= bs.threshold
}

// allow decides an attempt at the endpoint now: yes (closed, or the half-open probe, which it
// marks in flight), or not before retryAt.
func (bs *breakers) allow(endpoint string, now time.Time) (ok bool, retryAt time.Time) {
	b := bs.m[endpoint]
	switch {
	case b == nil || b.failures < bs.threshold:
		return true, time.Time{}
	case now.Before(b.until):
		return false, b.until
	case b.probing:
		return false, now.Add(bs.probeFor)
	}
	b.probing = true
	return true, time.Time{}
}

// result records how an allowed attempt at the endpoint ended.
func (bs *breakers) result(endpoint string, now time.Time, o breakerOutcome) {
	b := bs.m[endpoint]
	switch o {
	case endpointUp:
		// Closed, and forgotten: the map holds only endpoints that are failing.
		delete(bs.m, endpoint)
	case endpointUnknown:
		if b != nil {
			b.probing = false // the probe did not happen: the next attempt is one
		}
	case endpointDown:
		if b == nil {
			b = &breaker{}
			bs.m[endpoint] = b
		}
		switch {
		case b.failures < bs.threshold:
			if b.failures++; b.failures == bs.threshold {
				b.opens, b.until = 1, now.Add(bs.cooldown)
			}
		case b.probing:
			b.probing = false
			b.opens++
			b.until = now.Add(bs.cool(b.opens))
		default:
			// An attempt started before the endpoint opened, failing while it is open: it is
			// open already.
		}
	}
}

// cool is the opens-th cool-down in a row: cooldown, 2·cooldown, 4·cooldown, … up to maxCool.
func (bs *breakers) cool(opens int) time.Duration {
	return backoff(bs.cooldown, bs.maxCool, opens)
}

// endpointOf is the breaker an attempt at a webhook answers to: its owner's, for the URL's host
// and port. Per owner, so that one merchant's failing webhooks at a shared receiving service
// (many merchants' webhooks go to the same platforms) never hold back another merchant's
// deliveries there; per host, so that one owner's hundred webhooks at one dead server learn it
// together.
func endpointOf(owner, rawURL string) string {
	host := rawURL
	if u, err := url.Parse(rawURL); err == nil {
		host = u.Scheme + "://" + strings.ToLower(u.Host)
	}
	return owner + " " + host
}
