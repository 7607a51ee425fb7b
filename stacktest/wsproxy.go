package stacktest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// ProxyMode is how the proxy treats its connections.
type ProxyMode int

// The proxy's modes.
const (
	Forward   ProxyMode = iota
	Refuse              // close every connection and every new one at once
	Freeze              // keep connections open, forward nothing (a half-open connection)
	Blackhole           // close existing connections; accept new ones and never answer
)

func (m ProxyMode) String() string {
	return [...]string{"forward", "refuse", "freeze", "blackhole"}[m]
}

// Proxy is a TCP proxy on loopback to a node's WebSocket endpoint, with switchable failure modes,
// for the tests of what follows heads over it.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  ProxyMode
	conns map[net.Conn]bool
	count int
}

// NewProxy proxies to target (host:port) until the test ends, forwarding to begin with.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.SetMode(Refuse)
	})
	return p
}

// URL is the proxy's ws:// URL.
func (p *Proxy) URL() string { return "ws://" + p.ln.Addr().String() }

// Accepted is how many connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

// SetMode switches the proxy to m; Refuse and Blackhole also close the open connections.
func (p *Proxy) SetMode(m ProxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if m == Refuse || m == Blackhole {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.count++
		switch p.mode {
		case Refuse:
			c.Close()
		case Blackhole, Freeze:
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
func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.mode == Freeze
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
