package ethrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
	"golang.org/x/time/rate"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A network's several RPC providers, as one Chain. One provider's outage, rate limit or lagging
// backend must not become ours: a read goes to a healthy endpoint and, when it fails in a way
// another endpoint may not (the transport, a timeout, a rate limit), to the next; a send goes to
// every healthy endpoint, so a transaction reaches the chain while one provider is down. A read
// that decides an outcome (mined, final, or a terminal failure) is made on Quorum endpoints
// (Several) by its caller, who compares what they say: endpoints are never trusted to agree.

// Endpoint is one provider of a Pool.
type Endpoint struct {
	// Name identifies the endpoint in logs, metrics and /readyz ("rpc0", "rpc1"…): never its
	// URL, which often carries an API key.
	Name  string
	Chain Chain
	// Rate bounds the requests per second sent to it (a batch counts as one; 0: no bound), with
	// bursts of Burst (at least 1).
	Rate  float64
	Burst int
	// Down, when set, is why the endpoint failed before the pool was made (serve's start-up
	// checks): it starts left alone, as after a failure, so that the first reads do not wait on
	// an endpoint already known not to answer.
	Down error
}

// PoolObserver hears the pool's endpoint changes (metrics); it must not block.
type PoolObserver interface {
	// EndpointDown: the endpoint failed (transport, timeout, rate limit) and is left alone for a
	// while; EndpointUp: it answered again.
	EndpointDown(endpoint string)
	EndpointUp(endpoint string)
}

// Pool is a Chain over several endpoints of one network.
type Pool struct {
	endpoints []*endpoint
	obs       PoolObserver
	now       func() time.Time

	// quorum is how many endpoints must agree on a read that decides an outcome (SetQuorum).
	quorum int
	// serial: a broadcast reaches its endpoints one after the other (SetSerial).
	serial bool

	mu sync.Mutex
	// rnd draws the endpoint each pick starts at. At random, not in turn: a caller that makes the
	// same number of calls every round (a watcher with a few settlements stuck on a quorum) would
	// otherwise be handed the same endpoints every round, and a quorum that holds a liar would
	// never form (SetSeed: the simulator's, which must replay).
	rnd *rand.Rand
}

type endpoint struct {
	Endpoint
	limit *rate.Limiter // nil: no bound

	mu        sync.Mutex
	downUntil time.Time // zero: healthy
	failures  int       // consecutive
	head      uint64    // the highest eth_blockNumber it answered
	lastErr   string
}

// NewPool makes a pool of endpoints (at least one). obs may be nil; now nil is time.Now.
func NewPool(endpoints []Endpoint, obs PoolObserver, now func() time.Time) (*Pool, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("ethrpc: a pool needs at least one endpoint")
	}
	if now == nil {
		now = time.Now
	}
	p := &Pool{obs: obs, now: now, quorum: DefaultQuorum(len(endpoints)), rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	for _, e := range endpoints {
		ep := &endpoint{Endpoint: e}
		if e.Rate > 0 {
			ep.limit = rate.NewLimiter(rate.Limit(e.Rate), max(e.Burst, 1))
		}
		p.endpoints = append(p.endpoints, ep)
		if e.Down != nil {
			p.down(ep, e.Down)
		}
	}
	return p, nil
}

// SetSerial makes a broadcast reach the pool's endpoints one after the other, in the order it
// picks them, instead of at once (and asks callers that fan out over its endpoints to do the
// same: Serial). Only the simulator calls it: its endpoints share one simulated
// chain, and a seed must not replay differently with the goroutine that reaches the chain first.
// Call it before the pool is used.
func (p *Pool) SetSerial() { p.serial = true }

// SetSeed makes the pool's picks of endpoints replay from seed (the simulator). Call it before
// the pool is used.
func (p *Pool) SetSeed(seed uint64) { p.rnd = rand.New(rand.NewPCG(seed, seed)) }

// Serial reports whether SetSerial was called: a caller that reads several endpoints at once
// (settle's quorum reads) reads them one after the other too.
func (p *Pool) Serial() bool { return p.serial }

// EndpointHealth is one endpoint as the pool sees it, for /readyz and metrics.
type EndpointHealth struct {
	Name string
	// Healthy: its last call answered. A failure makes it false until the endpoint answers again,
	// not only for its back-off (after which the pool tries it again): a provider that is down
	// reads down the whole time, and an alert on it does not reset each time a back-off ends.
	Healthy bool
	// Head is the highest block number it answered (0 before the first eth_blockNumber).
	Head uint64
	// LastError is why it was last left alone, with any URL removed.
	LastError string
}

// Health lists the endpoints in configured order.
func (p *Pool) Health() []EndpointHealth {
	out := make([]EndpointHealth, len(p.endpoints))
	for i, e := range p.endpoints {
		e.mu.Lock()
		out[i] = EndpointHealth{Name: e.Name, Healthy: e.failures == 0, Head: e.head, LastError: e.lastErr}
		e.mu.Unlock()
	}
	return out
}

// order is the endpoints to try: the healthy ones from a start drawn at random (so that load
// spreads, and no caller's rhythm meets the same endpoints every time), then those left alone,
// soonest back first (when every endpoint failed lately, trying beats refusing).
func (p *Pool) order() []*endpoint {
	p.mu.Lock()
	start := p.rnd.IntN(len(p.endpoints))
	p.mu.Unlock()
	now := p.now()
	var healthy, down []*endpoint
	for i := range p.endpoints {
		e := p.endpoints[(start+i)%len(p.endpoints)]
		if e.healthy(now) {
			healthy = append(healthy, e)
		} else {
			down = append(down, e)
		}
	}
	slices.SortStableFunc(down, func(a, b *endpoint) int { return a.until().Compare(b.until()) })
	return append(healthy, down...)
}

// Pair returns two different healthy endpoints, for a read that must be corroborated; ok is false
// when fewer than two are healthy (the caller then relies on reads made at different times).
func (p *Pool) Pair() (a, b Chain, ok bool) {
	now := p.now()
	var picked []*endpoint
	for _, e := range p.order() {
		if e.healthy(now) {
			picked = append(picked, e)
		}
		if len(picked) == 2 {
			return p.one(picked[0]), p.one(picked[1]), true
		}
	}
	return nil, nil, false
}

// DefaultQuorum is the quorum of a pool of n endpoints: two where there are two or more (one
// provider inventing an answer decides nothing alone), one where the operator trusts one provider.
func DefaultQuorum(n int) int { return min(n, 2) }

// SetQuorum sets how many endpoints must agree (1 up to the pool's endpoints); call it before the
// pool is used.
func (p *Pool) SetQuorum(q int) error {
	if q < 1 || q > len(p.endpoints) {
		return fmt.Errorf("ethrpc: quorum %d with %d endpoint(s): want 1 to %d", q, len(p.endpoints), len(p.endpoints))
	}
	p.quorum = q
	return nil
}

// Quorum is how many endpoints must agree on a read that decides an outcome.
func (p *Pool) Quorum() int { return p.quorum }

// Several returns n different healthy endpoints other than those named in except, for a read that
// a quorum must agree on; ok is false when fewer than n are healthy.
func (p *Pool) Several(n int, except ...string) ([]Chain, bool) {
	now := p.now()
	var picked []Chain
	for _, e := range p.order() {
		if len(picked) == n {
			break
		}
		if e.healthy(now) && !slices.Contains(except, e.Name) {
			picked = append(picked, p.one(e))
		}
	}
	return picked, len(picked) == n && n > 0
}

// Answered records which endpoints of a Pool answered the calls made with a context
// (WithAnswered): a read that one endpoint answered is confirmed on others, not on it again.
type Answered struct {
	mu    sync.Mutex
	names []string
}

type answeredKey struct{}

// Each runs f(0), …, f(n-1) and returns when all have: each on a goroutine of its own, or, when
// serial, one after the other (a caller fanning out over a serial pool's endpoints: SetSerial).
func Each(serial bool, n int, f func(k int)) {
	if serial {
		for k := range n {
			f(k)
		}
		return
	}
	var wg sync.WaitGroup
	for k := range n {
		wg.Add(1)
		go func() { defer wg.Done(); f(k) }()
	}
	wg.Wait()
}

// WithAnswered is ctx recording into the returned Answered each endpoint that answers a call made
// with it (an answer: a result or a JSON-RPC error, not a failure).
func WithAnswered(ctx context.Context) (context.Context, *Answered) {
	a := &Answered{}
	return context.WithValue(ctx, answeredKey{}, a), a
}

// Names are the endpoints that answered, in the order they first did.
func (a *Answered) Names() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.names)
}

func (a *Answered) add(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !slices.Contains(a.names, name) {
		a.names = append(a.names, name)
	}
}

func answered(ctx context.Context, e *endpoint) {
	if a, ok := ctx.Value(answeredKey{}).(*Answered); ok {
		a.add(e.Name)
	}
}

// Endpoints is how many endpoints the pool has, healthy or not.
func (p *Pool) Endpoints() int { return len(p.endpoints) }

// one is a Chain of a single endpoint that still keeps the pool's health and rate accounting.
func (p *Pool) one(e *endpoint) Chain { return single{p: p, e: e} }

type single struct {
	p *Pool
	e *endpoint
}

func (s single) CallContext(ctx context.Context, result any, method string, args ...any) error {
	return s.p.attempt(ctx, s.e, func(ctx context.Context) error { return s.e.Chain.CallContext(ctx, result, method, args...) }, method, result)
}

func (s single) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	return s.p.attemptBatch(ctx, s.e, b)
}

// CallContext makes the call on a healthy endpoint, and on the next when one fails in a way
// another may not.
func (p *Pool) CallContext(ctx context.Context, result any, method string, args ...any) error {
	if method == "eth_sendRawTransaction" {
		b := []rpc.BatchElem{{Method: method, Args: args, Result: result}}
		if err := p.BatchCallContext(ctx, b); err != nil {
			return err
		}
		return b[0].Error
	}
	var err error
	for _, e := range p.order() {
		err = single{p, e}.CallContext(ctx, result, method, args...)
		if !retryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// BatchCallContext makes the batch on a healthy endpoint (the next one when it fails there), or,
// when it carries transactions to send, on every endpoint: an element then succeeds when it
// succeeded anywhere.
func (p *Pool) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	if sends(b) {
		return p.broadcast(ctx, b)
	}
	var err error
	for _, e := range p.order() {
		for i := range b {
			b[i].Error = nil
		}
		err = p.attemptBatch(ctx, e, b)
		if !retryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// broadcast sends the batch (transactions only) to every endpoint that is healthy (every
// endpoint, when none is), at once, each into its own copy of the results; each element takes a
// success from any endpoint, else the first endpoint's answer.
func (p *Pool) broadcast(ctx context.Context, b []rpc.BatchElem) error {
	for _, el := range b {
		if el.Method != "eth_sendRawTransaction" {
			return fmt.Errorf("ethrpc: a batch that sends transactions carries a %s: send them alone", el.Method)
		}
	}
	now := p.now()
	var targets []*endpoint
	for _, e := range p.order() {
		if e.healthy(now) {
			targets = append(targets, e)
		}
	}
	if len(targets) == 0 {
		targets = p.order()
	}
	copies := make([][]rpc.BatchElem, len(targets))
	errs := make([]error, len(targets))
	for i := range targets {
		c := make([]rpc.BatchElem, len(b))
		for j, el := range b {
			c[j] = rpc.BatchElem{Method: el.Method, Args: el.Args, Result: new(common.Hash)}
		}
		copies[i] = c
	}
	Each(p.serial, len(targets), func(i int) { errs[i] = p.attemptBatch(ctx, targets[i], copies[i]) })
	answered := -1 // the first endpoint that answered the batch at all
	for i := range targets {
		if errs[i] == nil {
			answered = i
			break
		}
	}
	if answered < 0 {
		return errs[0]
	}
	for j := range b {
		b[j].Error = copies[answered][j].Error
		for i := range targets {
			if errs[i] == nil && copies[i][j].Error == nil {
				b[j].Error = nil
				setResult(b[j].Result, copies[i][j].Result)
				break
			}
		}
	}
	return nil
}

// setResult copies a send's answer (a transaction hash) into the caller's result, whatever type
// it decodes into.
func setResult(dst, src any) {
	if dst == nil {
		return
	}
	if raw, err := json.Marshal(src); err == nil {
		_ = json.Unmarshal(raw, dst) // a hash decodes into what it was asked for as from the node
	}
}

func sends(b []rpc.BatchElem) bool {
	for _, el := range b {
		if el.Method == "eth_sendRawTransaction" {
			return true
		}
	}
	return false
}

// attempt makes one call on e, within its rate, and keeps its health.
func (p *Pool) attempt(ctx context.Context, e *endpoint, call func(context.Context) error, method string, result any) error {
	if e.limit != nil {
		if err := e.limit.Wait(ctx); err != nil {
			return fmt.Errorf("ethrpc: %s: waiting for its rate limit: %w", e.Name, err)
		}
	}
	err := call(ctx)
	if err != nil && !retryable(err) {
		// An answer (a revert, "nonce too low"): the endpoint is fine.
		p.up(e)
		answered(ctx, e)
		return err
	}
	if err != nil {
		p.down(e, err)
		return fmt.Errorf("ethrpc: %s: %w", e.Name, redact(err))
	}
	p.up(e)
	answered(ctx, e)
	if method == "eth_blockNumber" {
		e.saw(result)
	}
	return nil
}

// attemptBatch makes a batch on e; a rate limit answered in any element counts as the batch's.
func (p *Pool) attemptBatch(ctx context.Context, e *endpoint, b []rpc.BatchElem) error {
	err := p.attempt(ctx, e, func(ctx context.Context) error {
		if err := e.Chain.BatchCallContext(ctx, b); err != nil {
			return err
		}
		for _, el := range b {
			if el.Error != nil && limited(el.Error) {
				return el.Error
			}
		}
		return nil
	}, "", nil)
	if err != nil {
		return err
	}
	for _, el := range b {
		if el.Method == "eth_blockNumber" && el.Error == nil {
			e.saw(el.Result)
		}
	}
	return nil
}

func (p *Pool) down(e *endpoint, err error) {
	e.mu.Lock()
	e.failures++
	wait := backoff(err, e.failures)
	e.downUntil = p.now().Add(wait)
	e.lastErr = redact(err).Error()
	e.mu.Unlock()
	if p.obs != nil {
		p.obs.EndpointDown(e.Name)
	}
}

func (p *Pool) up(e *endpoint) {
	e.mu.Lock()
	was := e.failures > 0
	e.failures, e.downUntil = 0, time.Time{}
	e.mu.Unlock()
	if was && p.obs != nil {
		p.obs.EndpointUp(e.Name)
	}
}

func (e *endpoint) healthy(now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !now.Before(e.downUntil)
}

func (e *endpoint) until() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.downUntil
}

func (e *endpoint) saw(result any) {
	var n uint64
	switch r := result.(type) {
	case *hexutil.Uint64:
		n = uint64(*r)
	case *hexutil.Big:
		if r != nil && (*r).ToInt().IsUint64() {
			n = (*r).ToInt().Uint64()
		}
	default:
		return
	}
	e.mu.Lock()
	e.head = max(e.head, n)
	e.mu.Unlock()
}

// backoff is how long an endpoint is left alone after its failures-th failure in a row: what a
// rate limit asked for, when it said, else 1 s doubling to 30 s.
func backoff(err error, failures int) time.Duration {
	if d, ok := askedWait(err); ok {
		return min(max(d, 100*time.Millisecond), time.Minute)
	}
	return time.Duration(min(math.Pow(2, float64(failures-1)), 30)) * time.Second
}

// askedWait reads the wait a rate limit's error data names ({"backoff_seconds": n}, as some
// providers send with -32005).
func askedWait(err error) (time.Duration, bool) {
	var de rpc.DataError
	if !errors.As(err, &de) {
		return 0, false
	}
	if m, ok := de.ErrorData().(map[string]any); ok {
		for _, k := range []string{"backoff_seconds", "retry_after", "retryAfter"} {
			if v, ok := m[k].(float64); ok && v > 0 {
				return time.Duration(v * float64(time.Second)), true
			}
		}
	}
	return 0, false
}

// ErrUnfit marks the failure of an endpoint that answered but must not serve: it serves another
// chain than its pool's. The pool treats it as a failure (the endpoint is left alone, and another
// asked), never as an answer.
var ErrUnfit = errors.New("ethrpc: the endpoint must not serve this network")

// retryable reports whether another endpoint may answer where this one failed: the transport
// failed, the call timed out, or the provider limited us. A JSON-RPC error is an answer, and the
// same on any honest node.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnfit) {
		return true
	}
	if limited(err) {
		return true
	}
	var rerr rpc.Error
	if errors.As(err, &rerr) {
		return false
	}
	var herr rpc.HTTPError
	if errors.As(err, &herr) {
		return true // 5xx, 429, 401 from a provider: another may serve us
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rpc.ErrClientQuit) ||
		strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "EOF")
}

// limited reports a provider's rate limit: HTTP 429, or JSON-RPC -32005 ("limit exceeded").
func limited(err error) bool {
	var herr rpc.HTTPError
	if errors.As(err, &herr) && herr.StatusCode == 429 {
		return true
	}
	var rerr rpc.Error
	if errors.As(err, &rerr) && rerr.ErrorCode() == -32005 {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "rate limit") || strings.Contains(msg, "too many requests")
}

// redact keeps a URL out of an error: go-ethereum's transport errors quote the request URL,
// whose path or query often holds the provider's API key.
func redact(err error) error {
	msg := facilitator.StripURLs(err.Error())
	if msg == err.Error() {
		return err
	}
	return redacted{msg: msg, err: err}
}

type redacted struct {
	msg string
	err error
}

func (r redacted) Error() string { return r.msg }
func (r redacted) Unwrap() error { return r.err }
