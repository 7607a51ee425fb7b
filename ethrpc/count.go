package ethrpc

import (
	"context"
	"sort"
	"sync"

	"github.com/ethereum/go-ethereum/rpc"
)

// What a settlement costs the node is counted by who asks: each component (the engine, verify,
// the indexer, status, the reconcile jobs) reads the network through its own Counted view of the
// one Pool, so a count says which component made which calls, and a cut can be shown to cut.

// CallObserver hears each JSON-RPC method call a component made (a batch element counts as one
// call of its method); it must not block.
type CallObserver interface {
	RPCCall(network, component, method string)
}

// Counted is chain seen by one component: every call it makes is told to obs. It keeps the
// chain's Pair, Several, Quorum and Endpoints (the corroborated reads of settle/corroborate.go), counting the
// reads made on either endpoint of a pair as the component's too.
func Counted(chain Chain, network, component string, obs CallObserver) Chain {
	if obs == nil {
		return chain
	}
	c := counted{chain: chain, network: network, component: component, obs: obs}
	if p, ok := chain.(pairer); ok {
		return countedPool{counted: c, p: p}
	}
	return c
}

// pairer is a chain that can name two healthy endpoints, or a quorum of them (Pool).
type pairer interface {
	Pair() (a, b Chain, ok bool)
	Endpoints() int
	Quorum() int
	Several(n int, except ...string) ([]Chain, bool)
}

type counted struct {
	chain              Chain
	network, component string
	obs                CallObserver
}

func (c counted) CallContext(ctx context.Context, result any, method string, args ...any) error {
	c.obs.RPCCall(c.network, c.component, method)
	return c.chain.CallContext(ctx, result, method, args...)
}

func (c counted) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	for _, el := range b {
		c.obs.RPCCall(c.network, c.component, el.Method)
	}
	return c.chain.BatchCallContext(ctx, b)
}

type countedPool struct {
	counted
	p pairer
}

func (c countedPool) Pair() (a, b Chain, ok bool) {
	a, b, ok = c.p.Pair()
	if !ok {
		return a, b, ok
	}
	return c.with(a), c.with(b), true
}

func (c countedPool) Endpoints() int { return c.p.Endpoints() }

func (c countedPool) Quorum() int { return c.p.Quorum() }

func (c countedPool) Several(n int, except ...string) ([]Chain, bool) {
	chains, ok := c.p.Several(n, except...)
	for i := range chains {
		chains[i] = c.with(chains[i])
	}
	return chains, ok
}

func (c countedPool) with(chain Chain) Chain {
	return counted{chain: chain, network: c.network, component: c.component, obs: c.obs}
}

// CallCounts is a CallObserver that keeps the counts, for tests and for the bench's report.
type CallCounts struct {
	mu sync.Mutex
	n  map[CallKey]uint64
}

// CallKey names one count.
type CallKey struct{ Network, Component, Method string }

// RPCCall counts one call.
func (c *CallCounts) RPCCall(network, component, method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[CallKey]uint64{}
	}
	c.n[CallKey{network, component, method}]++
}

// Snapshot returns the counts so far.
func (c *CallCounts) Snapshot() map[CallKey]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[CallKey]uint64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// Sorted lists counts by component then method, for printing.
func Sorted(counts map[CallKey]uint64) []CallKey {
	keys := make([]CallKey, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.Network != b.Network {
			return a.Network < b.Network
		}
		if a.Component != b.Component {
			return a.Component < b.Component
		}
		return a.Method < b.Method
	})
	return keys
}
