package stacktest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// SimGroups builds groups of simulations in a known order: Reader's node holds one request
// (the one in flight) while a test starts callers one by one, each once the one before it has
// joined the group waiting behind it (Reader.Queued), and then answers them all.
type SimGroups struct {
	Reader *ethrpc.Reader

	chain   ethrpc.Chain
	mu      sync.Mutex
	hold    bool          // hold the next request
	entered chan struct{} // the held request arrived
	release chan struct{} // let the held request through
	queued  chan struct{}
}

// NewSimGroups returns a SimGroups whose Reader reads through chain.
func NewSimGroups(chain ethrpc.Chain) *SimGroups {
	g := &SimGroups{chain: chain, queued: make(chan struct{}, 64)}
	g.Reader = &ethrpc.Reader{Chain: g, Timeout: 10 * time.Second, Queued: func() {
		select {
		case g.queued <- struct{}{}:
		default: // callers queuing outside Group: nobody waits for them
		}
	}}
	return g
}

// Group runs first, which must make a simulated read (a /verify or /settle of a payment the
// verifier simulates) and is held at the node; then each of rest, in order, each once the one
// before it has queued its simulation; then lets the node answer, and waits for all to return.
// rest then went as one group behind first, in the order given.
func (g *SimGroups) Group(t testing.TB, first func(), rest ...func()) {
	t.Helper()
	for len(g.queued) > 0 {
		<-g.queued // from callers before this group
	}
	g.mu.Lock()
	g.hold, g.entered, g.release = true, make(chan struct{}), make(chan struct{})
	entered, release := g.entered, g.release
	g.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	wg.Go(first)
	wait := func(c <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatalf("SimGroups: %s never happened", what)
		}
	}
	wait(entered, "the first caller's request")
	for i, f := range rest {
		wg.Go(f)
		wait(g.queued, fmt.Sprintf("caller %d queuing its simulation", i+1))
	}
	released = true
	close(release)
}

// CallContext implements ethrpc.Chain.
func (g *SimGroups) CallContext(ctx context.Context, result any, method string, args ...any) error {
	return g.chain.CallContext(ctx, result, method, args...)
}

// BatchCallContext implements ethrpc.Chain, holding the request Group asks it to.
func (g *SimGroups) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	g.mu.Lock()
	hold, entered, release := g.hold, g.entered, g.release
	g.hold = false
	g.mu.Unlock()
	if hold {
		close(entered)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.chain.BatchCallContext(ctx, b)
}
