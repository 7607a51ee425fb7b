package indexer_test

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/indexer"
)

// TestHeadsFallBackToPolling follows heads over a WebSocket that goes through a proxy the test
// controls: when the proxy drops its connections and refuses new ones, the indexer keeps indexing
// by polling; when the proxy is back, the subscription is too.
func TestHeadsFallBackToPolling(t *testing.T) {
	proxy := newProxy(t, strings.TrimPrefix(chain.WSURL, "ws://"))
	network := bindNetwork(t)
	cfg := config(network)
	cfg.StartBlock = head(t) + 1
	cfg.WSURL = proxy.url()
	cfg.PollInterval = 100 * time.Millisecond
	sender := gasAccount(t)
	r := start(t, cfg)

	r.waitFor(t, "the subscription", 10*time.Second, func(s indexer.Status) bool { return s.Subscribed })
	p := payOnce(t, chain.Accounts[6], sender, 1)
	r.waitCursor(t, p.block, 5*time.Second)

	proxy.setMode(refuse)
	droppedAt := time.Now()
	r.waitFor(t, "the subscription to drop", 5*time.Second, func(s indexer.Status) bool { return !s.Subscribed })
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

	proxy.setMode(forward)
	backAt := time.Now()
	r.waitFor(t, "the subscription to come back", 15*time.Second, func(s indexer.Status) bool { return s.Subscribed })
	t.Logf("resubscribed %s after the proxy came back (%s after the drop; %d connections tried in all)",
		time.Since(backAt).Round(time.Millisecond), time.Since(droppedAt).Round(time.Millisecond), proxy.accepted())
	p = payOnce(t, chain.Accounts[6], sender, 3)
	r.waitCursor(t, p.block, 5*time.Second)
	c := compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, p.block)
	if c.used != 5 {
		t.Errorf("indexed %+v, want 5 authorizations", c)
	}
}

// TestHeadsUnresponsiveWebSocket: a WebSocket endpoint that stops answering without closing its
// connections (a half-open TCP connection, an overloaded provider), or that accepts connections
// and never answers the handshake, must not stop the indexer from following the chain: polling
// has to go on meanwhile.
func TestHeadsUnresponsiveWebSocket(t *testing.T) {
	for _, mode := range []proxyMode{freeze, blackhole} {
		t.Run(mode.String(), func(t *testing.T) {
			proxy := newProxy(t, strings.TrimPrefix(chain.WSURL, "ws://"))
			network := bindNetwork(t)
			cfg := config(network)
			cfg.StartBlock = head(t) + 1
			cfg.WSURL = proxy.url()
			cfg.PollInterval = 100 * time.Millisecond
			sender := gasAccount(t)
			r := start(t, cfg)
			r.waitFor(t, "the subscription", 10*time.Second, func(s indexer.Status) bool { return s.Subscribed })
			if mode == blackhole {
				// Drop the subscription so that the indexer dials again, into the black hole.
				proxy.setMode(refuse)
				r.waitFor(t, "the subscription to drop", 5*time.Second, func(s indexer.Status) bool { return !s.Subscribed })
			}
			proxy.setMode(mode)
			// Long enough for a resubscription attempt (every 10 s) into the black hole.
			deadline := time.Now().Add(5 * time.Second)
			if mode == blackhole {
				deadline = time.Now().Add(14 * time.Second)
			}
			for time.Now().Before(deadline) {
				p := payOnce(t, chain.Accounts[7], sender, 1)
				begin := time.Now()
				r.waitCursor(t, p.block, 3*time.Second)
				t.Logf("block %d indexed after %s; status %+v", p.block, time.Since(begin).Round(time.Millisecond), r.ix.Status())
				time.Sleep(time.Second)
			}
		})
	}
}

type proxyMode int

const (
	forward   proxyMode = iota
	refuse              // close every connection and every new one at once
	freeze              // keep connections open, forward nothing (a half-open connection)
	blackhole           // close existing connections; accept new ones and never answer
)

func (m proxyMode) String() string {
	return [...]string{"forward", "refuse", "freeze", "blackhole"}[m]
}

// proxy is a TCP proxy on loopback to a WebSocket endpoint, with switchable failure modes.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  proxyMode
	conns map[net.Conn]bool
	count int
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.setMode(refuse)
	})
	return p
}

func (p *proxy) url() string { return "ws://" + p.ln.Addr().String() }

func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

func (p *proxy) setMode(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if m == refuse || m == blackhole {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.count++
		switch p.mode {
		case refuse:
			c.Close()
		case blackhole, freeze:
			p.conns[c] = true
			go func() { _, _ = io.Copy(io.Discard, c) }()
		default:
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				break
			}
			p.conns[c], p.conns[up] = true, true
			go p.pipe(c, up)
			go p.pipe(up, c)
		}
		p.mu.Unlock()
	}
}

// pipe copies src to dst while the proxy forwards, and discards what arrives while it is frozen.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.mode == freeze
			p.mu.Unlock()
			if !frozen {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
