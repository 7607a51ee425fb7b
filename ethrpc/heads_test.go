package ethrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The heads tests follow a real anvil's newHeads, through a proxy each test breaks as it needs.
var chain *devchain.Chain

func TestMain(m *testing.M) {
	stacktest.MainWith(m, stacktest.Options{}, func(e *stacktest.Env) (int, error) {
		chain = e.Chain
		return m.Run(), nil
	})
}

// TestHeadsShared: every follower of a network's heads hears each new head over one WebSocket,
// and a follower that never returns from its callback holds up none of the others. Once the last
// follower has gone the subscription is closed, and the next follower opens it again.
func TestHeadsShared(t *testing.T) {
	proxy := stacktest.NewProxy(t, strings.TrimPrefix(chain.WSURL, "ws://"))
	h := ethrpc.NewHeads(5*time.Second, nil, proxy.URL())
	a, b := follow(t, h), follow(t, h)
	stuck := make(chan struct{})
	blocked := startFollower(t, h, func(uint64) { <-stuck })
	waitUntil(t, "the subscription", 10*time.Second, h.Subscribed)

	for range 3 {
		n := mine(t)
		a.waitHead(t, n, 5*time.Second)
		b.waitHead(t, n, 5*time.Second)
	}
	if got := proxy.Accepted(); got != 1 {
		t.Fatalf("%d WebSocket connections for three followers, want 1", got)
	}

	a.stop(t, 5*time.Second)
	n := mine(t)
	b.waitHead(t, n, 5*time.Second) // the others still hear heads
	close(stuck)
	blocked.stop(t, 5*time.Second)
	b.stop(t, 5*time.Second)
	if h.Subscribed() {
		t.Fatal("still subscribed with nobody following")
	}

	c := follow(t, h)
	waitUntil(t, "the subscription again", 10*time.Second, h.Subscribed)
	n = mine(t)
	c.waitHead(t, n, 5*time.Second)
	if got := proxy.Accepted(); got != 2 {
		t.Fatalf("%d WebSocket connections after following again, want 2", got)
	}
}

// TestHeadsResubscribe: a subscription that drops, and whose endpoint then refuses connections, is
// tried again until the endpoint is back; the followers are told it restarted (a 0) and hear heads
// again.
func TestHeadsResubscribe(t *testing.T) {
	t.Parallel()
	proxy, h, f := followThroughProxy(t, 5*time.Second)

	proxy.SetMode(stacktest.Refuse)
	waitUntil(t, "the subscription to drop", 5*time.Second, func() bool { return !h.Subscribed() })
	restarts := f.zeros()
	mine(t)

	proxy.SetMode(stacktest.Forward)
	backAt := time.Now()
	waitUntil(t, "the subscription to come back", 15*time.Second, h.Subscribed)
	t.Logf("resubscribed %s after the endpoint came back (%d connections tried)", time.Since(backAt).Round(time.Millisecond), proxy.Accepted())
	waitUntil(t, "the restart to be announced", 5*time.Second, func() bool { return f.zeros() > restarts })
	f.waitHead(t, mine(t), 5*time.Second)
}

// TestHeadsUnresponsive: an endpoint that stops forwarding without closing (a half-open
// connection), or that accepts connections and never answers the handshake, announces nothing,
// and keeps no follower from leaving: Follow returns within a bound of its context's end.
func TestHeadsUnresponsive(t *testing.T) {
	t.Parallel()
	for _, mode := range []stacktest.ProxyMode{stacktest.Freeze, stacktest.Blackhole} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			proxy, h, f := followThroughProxy(t, 2*time.Second)
			bound := 15 * time.Second // a frozen connection's eth_unsubscribe waits out go-ethereum's 10 s
			if mode == stacktest.Blackhole {
				proxy.SetMode(stacktest.Refuse)
				waitUntil(t, "the subscription to drop", 5*time.Second, func() bool { return !h.Subscribed() })
				proxy.SetMode(mode)
				tried := proxy.Accepted()
				// The next attempt (within resubscribeEvery) dials into the black hole.
				waitUntil(t, "a dial into the black hole", 15*time.Second, func() bool { return proxy.Accepted() > tried })
				bound = 3 * time.Second // the dial ends with the context
			} else {
				proxy.SetMode(mode)
			}
			before := f.last()
			n := mine(t)
			time.Sleep(time.Second)
			if got := f.last(); got >= n && before < n {
				t.Fatalf("head %d announced through a %s endpoint", got, mode)
			}
			f.stop(t, bound)
		})
	}
}

// TestHeadsWithoutURL: without a WebSocket URL (an HTTP-only node) nothing is announced, and
// Follow returns when its context ends.
func TestHeadsWithoutURL(t *testing.T) {
	h := ethrpc.NewHeads(0, nil)
	f := follow(t, h)
	mine(t)
	time.Sleep(200 * time.Millisecond)
	f.stop(t, time.Second)
	if f.calls() != 0 || h.Subscribed() {
		t.Fatalf("%d announcements, subscribed %v, without a URL", f.calls(), h.Subscribed())
	}
}

// follower records what Follow hands it.
type follower struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	heads []uint64
}

// followThroughProxy follows heads over a WebSocket through a proxy the test controls (timeout
// bounds the dial and the subscribe call); it returns once the follower has heard a head.
func followThroughProxy(t *testing.T, timeout time.Duration) (*stacktest.Proxy, *ethrpc.Heads, *follower) {
	t.Helper()
	proxy := stacktest.NewProxy(t, strings.TrimPrefix(chain.WSURL, "ws://"))
	h := ethrpc.NewHeads(timeout, nil, proxy.URL())
	f := follow(t, h)
	waitUntil(t, "the subscription", 10*time.Second, h.Subscribed)
	f.waitHead(t, mine(t), 5*time.Second)
	return proxy, h, f
}

func follow(t *testing.T, h *ethrpc.Heads) *follower {
	f := &follower{}
	return f.start(t, h, func(head uint64) {
		f.mu.Lock()
		f.heads = append(f.heads, head)
		f.mu.Unlock()
	})
}

func startFollower(t *testing.T, h *ethrpc.Heads, fn func(uint64)) *follower {
	return (&follower{}).start(t, h, fn)
}

func (f *follower) start(t *testing.T, h *ethrpc.Heads, fn func(uint64)) *follower {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done = cancel, make(chan struct{})
	go func() {
		defer close(f.done)
		h.Follow(ctx, fn)
	}()
	t.Cleanup(func() { f.stop(t, 15*time.Second) })
	return f
}

// stop ends the follower's context and waits, at most within, for Follow to return.
func (f *follower) stop(t *testing.T, within time.Duration) {
	t.Helper()
	f.cancel()
	select {
	case <-f.done:
	case <-time.After(within):
		t.Fatalf("Follow did not return within %s of its context's end", within)
	}
}

func (f *follower) last() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var m uint64
	for _, h := range f.heads {
		m = max(m, h)
	}
	return m
}

func (f *follower) zeros() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range f.heads {
		if h == 0 {
			n++
		}
	}
	return n
}

func (f *follower) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.heads)
}

// waitHead waits until the follower has heard of head n or a later one.
func (f *follower) waitHead(t *testing.T, n uint64, within time.Duration) {
	t.Helper()
	waitUntil(t, "the head", within, func() bool { return f.last() >= n })
}

// mine mines a block and returns its number.
func mine(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := chain.Mine(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := chain.Client.BlockNumber(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func waitUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHeadsFallsBackToTheNextURL: with the first WebSocket URL dead, the subscription is taken on
// the second.
func TestHeadsFallsBackToTheNextURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := ethrpc.NewHeads(2*time.Second, nil, "ws://127.0.0.1:1", chain.WSURL)
	got := make(chan uint64, 16)
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	go h.Follow(fctx, func(n uint64) {
		select {
		case got <- n:
		default:
		}
	})
	for !h.Subscribed() {
		if ctx.Err() != nil {
			t.Fatal("never subscribed through the second URL")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
