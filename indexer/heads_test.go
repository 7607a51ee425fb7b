package indexer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// startProxiedHeads starts an indexer, from the next block, on a network of its own, whose heads
// come over a WebSocket through a proxy the test controls, polling every 100 ms besides; it
// returns once the indexer has subscribed, with a sender of gas for the test's payments.
func startProxiedHeads(t *testing.T) (*stacktest.Proxy, indexer.Config, *running, *devchain.Account) {
	t.Helper()
	proxy := stacktest.NewProxy(t, strings.TrimPrefix(chain.WSURL, "ws://"))
	cfg := freshConfig(t)
	cfg.Heads = ethrpc.NewHeads(0, nil, proxy.URL())
	cfg.PollInterval = 100 * time.Millisecond
	sender := gasAccount(t)
	r := start(t, cfg)
	r.waitFor(t, "the subscription", 10*time.Second, func(s indexer.Health) bool { return s.Subscribed })
	return proxy, cfg, r, sender
}

// TestHeadsFallBackToPolling follows heads over a WebSocket that goes through a proxy the test
// controls: when the proxy drops its connections and refuses new ones, the indexer keeps indexing
// by polling; when the proxy is back, the subscription is too.
func TestHeadsFallBackToPolling(t *testing.T) {
	proxy, cfg, r, sender := startProxiedHeads(t)
	p := payOnce(t, chain.Accounts[6], sender, 1)
	r.waitCursor(t, p.block, 5*time.Second)

	proxy.SetMode(stacktest.Refuse)
	droppedAt := time.Now()
	r.waitFor(t, "the subscription to drop", 5*time.Second, func(s indexer.Health) bool { return !s.Subscribed })
	t.Logf("subscription dropped after %s", time.Since(droppedAt).Round(time.Millisecond))
	for range 3 {
		p := payOnce(t, chain.Accounts[6], sender, 2)
		begin := time.Now()
		st := r.waitCursor(t, p.block, 5*time.Second)
		if st.Subscribed {
			t.Fatalf("subscribed through a proxy that refuses connections: %+v", st)
		}
		t.Logf("block %d indexed by polling after %s", p.block, time.Since(begin).Round(time.Millisecond))
	}

	proxy.SetMode(stacktest.Forward)
	backAt := time.Now()
	r.waitFor(t, "the subscription to come back", 15*time.Second, func(s indexer.Health) bool { return s.Subscribed })
	t.Logf("resubscribed %s after the proxy came back (%s after the drop; %d connections tried in all)",
		time.Since(backAt).Round(time.Millisecond), time.Since(droppedAt).Round(time.Millisecond), proxy.Accepted())
	p = payOnce(t, chain.Accounts[6], sender, 3)
	r.waitCursor(t, p.block, 5*time.Second)
	c := compareWithChain(t, cfg.Network, cfg.Tokens, cfg.StartBlock, p.block)
	if c.used != 5 {
		t.Errorf("indexed %+v, want 5 authorizations", c)
	}
}

// TestHeadsUnresponsiveWebSocket: a WebSocket endpoint that stops answering without closing its
// connections (a half-open TCP connection, an overloaded provider), or that accepts connections
// and never answers the handshake, must not stop the indexer from following the chain: polling
// has to go on meanwhile.
func TestHeadsUnresponsiveWebSocket(t *testing.T) {
	for _, mode := range []stacktest.ProxyMode{stacktest.Freeze, stacktest.Blackhole} {
		t.Run(mode.String(), func(t *testing.T) {
			proxy, _, r, sender := startProxiedHeads(t)
			if mode == stacktest.Blackhole {
				// Drop the subscription so that the indexer dials again, into the black hole.
				proxy.SetMode(stacktest.Refuse)
				r.waitFor(t, "the subscription to drop", 5*time.Second, func(s indexer.Health) bool { return !s.Subscribed })
			}
			proxy.SetMode(mode)
			// Long enough for a resubscription attempt (every 10 s) into the black hole.
			deadline := time.Now().Add(5 * time.Second)
			if mode == stacktest.Blackhole {
				deadline = time.Now().Add(14 * time.Second)
			}
			for time.Now().Before(deadline) {
				p := payOnce(t, chain.Accounts[7], sender, 1)
				begin := time.Now()
				r.waitCursor(t, p.block, 3*time.Second)
				t.Logf("block %d indexed after %s; status %+v", p.block, time.Since(begin).Round(time.Millisecond), r.ix.Health())
				time.Sleep(time.Second)
			}
		})
	}
}
