package notify

import (
	"testing"
	"time"
)

// TestBreaker walks one endpoint's breaker through its states on a clock of its own: closed
// until the threshold of failures in a row, open for the cool-down, one probe at a time once it
// ends, open twice as long after a failed probe (up to the cap), closed by a success.
func TestBreaker(t *testing.T) {
	const ep = "key_1 https://dead.example"
	t0 := time.Unix(1_700_000_000, 0)
	bs := newBreakers(3, 10*time.Second, 35*time.Second, 7*time.Second)
	allowed := func(at time.Time) bool {
		t.Helper()
		ok, _ := bs.allow(ep, at)
		return ok
	}
	// Two failures, a success: the count starts again.
	bs.result(ep, t0, endpointDown)
	bs.result(ep, t0, endpointDown)
	bs.result(ep, t0, endpointUp)
	bs.result(ep, t0, endpointDown)
	bs.result(ep, t0, endpointDown)
	if !allowed(t0) || bs.blocked(ep, t0) {
		t.Fatal("closed after two failures in a row (a success between): an attempt refused")
	}
	// The third in a row opens it for the cool-down.
	bs.result(ep, t0, endpointDown)
	if ok, at := bs.allow(ep, t0.Add(time.Second)); ok || !at.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("open: allow = %v until %s, want refused until t0+10s", ok, at)
	}
	if !bs.blocked(ep, t0.Add(9*time.Second)) {
		t.Fatal("open: not blocked during the cool-down")
	}
	// An attempt begun before it opened, failing now, does not lengthen the cool-down.
	bs.result(ep, t0.Add(5*time.Second), endpointDown)
	// Past the cool-down: one probe, and no second while it is in flight.
	t1 := t0.Add(10 * time.Second)
	if bs.blocked(ep, t1) || !allowed(t1) {
		t.Fatal("half-open: the probe refused")
	}
	if ok, at := bs.allow(ep, t1); ok || !at.Equal(t1.Add(7*time.Second)) || !bs.blocked(ep, t1) {
		t.Fatalf("half-open with the probe in flight: allow = %v until %s, want refused for the probe's bound", ok, at)
	}
	// The probe fails: open for twice the cool-down.
	bs.result(ep, t1.Add(2*time.Second), endpointDown)
	t2 := t1.Add(2 * time.Second)
	if ok, at := bs.allow(ep, t2); ok || !at.Equal(t2.Add(20*time.Second)) {
		t.Fatalf("after a failed probe: allow = %v until %s, want refused until +20s", ok, at)
	}
	// A probe that never reached the endpoint (the ledger failed) says nothing: the next
	// attempt is the probe.
	t3 := t2.Add(20 * time.Second)
	if !allowed(t3) {
		t.Fatal("the second probe refused")
	}
	bs.result(ep, t3, endpointUnknown)
	if !allowed(t3) {
		t.Fatal("after a probe that did not happen, the next attempt refused")
	}
	// Failed again: 40 s, capped at 35 s.
	bs.result(ep, t3, endpointDown)
	if ok, at := bs.allow(ep, t3); ok || !at.Equal(t3.Add(35*time.Second)) {
		t.Fatalf("third cool-down: allow = %v until %s, want refused until the 35 s cap", ok, at)
	}
	// The probe succeeds: closed, and forgotten.
	t4 := t3.Add(35 * time.Second)
	if !allowed(t4) {
		t.Fatal("the third probe refused")
	}
	bs.result(ep, t4, endpointUp)
	if bs.known(ep) || bs.blocked(ep, t4) || !allowed(t4) || !allowed(t4) || len(bs.m) != 0 {
		t.Fatalf("closed by a success: known %v, %d breakers kept", bs.known(ep), len(bs.m))
	}
	// Another endpoint was never touched by any of this.
	if ok, _ := bs.allow("key_2 https://dead.example", t0.Add(time.Second)); !ok {
		t.Fatal("another owner's endpoint at the same host refused")
	}
}

// TestAttemptEndpointOutcome: what an attempt says about its endpoint.
func TestAttemptEndpointOutcome(t *testing.T) {
	for _, c := range []struct {
		status int
		err    error
		want   breakerOutcome
	}{
		{204, nil, endpointUp}, {400, nil, endpointUp}, {410, nil, endpointUp}, {302, nil, endpointUp},
		{500, nil, endpointDown}, {503, nil, endpointDown}, {429, nil, endpointDown},
		{0, errNoStatus, endpointUnknown}, {0, errTest, endpointDown},
	} {
		if got := outcome(c.status, c.err); got != c.want {
			t.Errorf("outcome(%d, %v) = %v, want %v", c.status, c.err, got, c.want)
		}
	}
}

type testError string

func (e testError) Error() string { return string(e) }

const errTest = testError("dial tcp: connection refused")

// TestEndpointOf: one owner's webhooks at one scheme, host and port share a breaker; another
// owner's at the same host, or another port, do not.
func TestEndpointOf(t *testing.T) {
	a := endpointOf("k1", "https://Hooks.example/a?token=1")
	if b := endpointOf("k1", "https://hooks.example/b"); a != b {
		t.Errorf("one owner's paths at one host: %q and %q", a, b)
	}
	for _, other := range []string{endpointOf("k2", "https://hooks.example/a"), endpointOf("k1", "https://hooks.example:8443/a"),
		endpointOf("k1", "http://hooks.example/a"), endpointOf("", "https://hooks.example/a")} {
		if other == a {
			t.Errorf("%q shares the breaker of %q", other, a)
		}
	}
}
