package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Start-up is not all-or-nothing on RPC. Each endpoint is checked (its chain id, its genesis)
// within --rpc-timeout; one that does not answer joins its pool as down, and is checked again
// the first time the pool tries it after its back-off. A network none of whose endpoints answer
// does not keep the others from serving: it answers 503 network_unavailable, and /readyz names
// it, until an endpoint answers and its start-up checks pass (awaitNetwork); then it serves,
// without a restart. Only an endpoint that answers for another chain stops the start: that is a
// configuration fault, not an outage.

// genesisOf is the genesis hash a network's endpoints must agree on: the first endpoint that
// answers sets it.
type genesisOf struct {
	mu  sync.Mutex
	h   common.Hash
	set bool
}

// agree sets the genesis when none is, and refuses another one.
func (g *genesisOf) agree(h common.Hash) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.set {
		g.h, g.set = h, true
		return nil
	}
	if h != g.h {
		return fmt.Errorf("it serves another chain than the network's other endpoints (genesis %s, not %s)", h, g.h)
	}
	return nil
}

// known is the genesis, once an endpoint answered it.
func (g *genesisOf) known() (common.Hash, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.h, g.set
}

// checkedEndpoint is one RPC endpoint that serves nothing until it is dialed and has answered
// the network's chain id and genesis (check): at start, or, for one that did not answer then, at
// the first call the pool gives it.
type checkedEndpoint struct {
	name    string
	net     facilitator.Network
	url     string
	genesis *genesisOf
	log     *slog.Logger

	mu     sync.Mutex
	client *rpc.Client
	ok     bool
}

// check dials and checks the endpoint once; after it passed, it is free. A wrong chain is
// ethrpc.ErrUnfit (and chains.ErrWrongChain), so that the pool leaves the endpoint alone.
func (e *checkedEndpoint) check(ctx context.Context) (*rpc.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ok {
		return e.client, nil
	}
	// Not checked yet: most likely still silent. The check takes half of what the caller has
	// left, so that the pool can still ask the next endpoint within the caller's bound (a read
	// bounded by --rpc-timeout would otherwise fail each time the back-off lets this one be tried).
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		defer cancel()
	}
	if e.client == nil {
		c, err := dialRPC(ctx, e.url)
		if err != nil {
			return nil, fmt.Errorf("%s: dialing RPC endpoint %s: %s", e.net.ID, e.name, facilitator.StripURLs(err.Error()))
		}
		e.client = c
	}
	g, err := chains.CheckChain(ctx, e.client, e.net)
	if err == nil {
		err = e.genesis.agree(g)
		if err != nil {
			err = fmt.Errorf("%s: %w%w", e.net.ID, err, quietErr{chains.ErrWrongChain})
		}
	}
	if err != nil {
		err = fmt.Errorf("RPC endpoint %s: %w", e.name, err)
		if errors.Is(err, chains.ErrWrongChain) {
			err = fmt.Errorf("%w%w", err, quietErr{ethrpc.ErrUnfit})
		}
		return nil, err
	}
	if e.log != nil {
		e.log.Info("RPC endpoint answered: serving through it", "network", e.net.ID, "endpoint", e.name)
	}
	e.ok = true
	return e.client, nil
}

func (e *checkedEndpoint) CallContext(ctx context.Context, result any, method string, args ...any) error {
	c, err := e.check(ctx)
	if err != nil {
		return err
	}
	return c.CallContext(ctx, result, method, args...)
}

func (e *checkedEndpoint) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	c, err := e.check(ctx)
	if err != nil {
		return err
	}
	return c.BatchCallContext(ctx, b)
}

func (e *checkedEndpoint) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.client != nil {
		e.client.Close()
	}
}

// quietErr wraps a sentinel without adding its text.
type quietErr struct{ err error }

func (quietErr) Error() string   { return "" }
func (q quietErr) Unwrap() error { return q.err }

// netGate says whether a network serves: it does once its start-up checks passed.
type netGate struct {
	up     atomic.Bool
	mu     sync.Mutex
	reason string
}

func (g *netGate) wait(reason string) {
	g.mu.Lock()
	g.reason = reason
	g.mu.Unlock()
}

func (g *netGate) open() { g.up.Store(true) }

// err is nil once the network serves, else why it does not, as the API answers it.
func (g *netGate) err(network string) error {
	if g == nil || g.up.Load() {
		return nil
	}
	g.mu.Lock()
	reason := g.reason
	g.mu.Unlock()
	return &facilitator.Error{Code: facilitator.EUnavailable, Reason: facilitator.ReasonNetworkUnavailable,
		Message: fmt.Sprintf("network %s is not serving yet: %s; retry", network, reason), RetryAfter: 5 * time.Second}
}

// gatedPool is a network's pool as the components see it: nothing is read from it, or sent
// through it, before the network's start-up checks passed (its ledger bound to its chain, its
// tokens checked). It keeps the pool's Pair, Several and Quorum, which settle's corroborated reads
// look for: a view without them would be taken for a single endpoint, and its quorum for one.
type gatedPool struct {
	*ethrpc.Pool
	gate    *netGate
	network string
}

func (c gatedPool) CallContext(ctx context.Context, result any, method string, args ...any) error {
	if err := c.gate.err(c.network); err != nil {
		return err
	}
	return c.Pool.CallContext(ctx, result, method, args...)
}

func (c gatedPool) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	if err := c.gate.err(c.network); err != nil {
		return err
	}
	return c.Pool.BatchCallContext(ctx, b)
}

// Pair and Several name no endpoint while the network is closed.
func (c gatedPool) Pair() (a, b ethrpc.Chain, ok bool) {
	if c.gate.err(c.network) != nil {
		return nil, nil, false
	}
	return c.Pool.Pair()
}

func (c gatedPool) Several(n int, except ...string) ([]ethrpc.Chain, bool) {
	if c.gate.err(c.network) != nil {
		return nil, false
	}
	return c.Pool.Several(n, except...)
}

// gatedAPI refuses /verify and /settle for a network that is not serving yet, with its reason,
// before anything is read or written for the payment.
type gatedAPI struct {
	svc   apiService
	gates map[string]*netGate // by network id and v1 name
}

// apiService is what the API calls to verify and settle (paymentid.Service).
type apiService interface {
	Verify(ctx context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error)
	Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error)
	ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error
	ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error
}

func (g gatedAPI) Verify(ctx context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error) {
	if err := g.gates[p.Requirements.Network].err(p.Requirements.Network); err != nil {
		return facilitator.VerifyResponse{}, err
	}
	return g.svc.Verify(ctx, p)
}

func (g gatedAPI) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	if err := g.gates[p.Requirements.Network].err(p.Requirements.Network); err != nil {
		return facilitator.SettleOutcome{}, err
	}
	return g.svc.Settle(ctx, p)
}

func (g gatedAPI) ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	return g.svc.ReleaseDelivery(ctx, out)
}

func (g gatedAPI) ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	return g.svc.ConfirmDelivery(ctx, out)
}
