package settlesim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"reflect"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/rpc"
)

// Profile is a backend's fault profile: how it lags, loses and refuses. The zero value is a
// node that is always at the head and never fails.
type Profile struct {
	// MinLag and MaxLag bound how many blocks behind the head the node is for a request, drawn
	// per request. The node never goes back (unless the chain does): once it has seen a block it
	// answers at least from it, and a node that has not caught up with a reorganisation answers
	// from the branch it was on.
	MinLag, MaxLag int
	// NullReceipt is the chance that the node answers null for a receipt of a transaction it has
	// in a block (it has not indexed it yet).
	NullReceipt float64
	// Fail is the chance that a request fails before the node sees it (connection reset, 502,
	// 503); RateLimit that it is answered HTTP 429. Nothing is applied.
	Fail, RateLimit float64
	// ElemFail is the chance that one call (a batch element, or a lone call) fails on its own:
	// rate limited (-32005), an internal error (-32603), "transaction indexing is in progress"
	// for a receipt, none applied; or its answer is missing from the batch, applied.
	ElemFail float64
	// Drop is the chance that the node applies the whole request (a send reaches the pool) and
	// the answer is lost: the caller sees a timeout. DropDelay is how long that took, by the
	// clock.
	Drop      float64
	DropDelay time.Duration
	// NoBlockReceipts makes the node refuse eth_getBlockReceipts (method not found), as some
	// providers do.
	NoBlockReceipts bool
	// ClampLogs answers eth_getLogs over a range past the node's head with the blocks it has, as
	// some providers do, instead of geth's "block range extends beyond current head block".
	ClampLogs bool
	// NoSimulate makes the node refuse eth_simulateV1 (method not found), as nodes without it do.
	// Never drawn by RandomProfile.
	NoSimulate bool

	// The lies of a provider that is wrong on purpose or by a bug (never drawn by RandomProfile:
	// a world sets them on one of several providers). InventReceipt: the chance that a receipt of
	// a transaction the node knows unmined is answered as mined in its head block, succeeding
	// with the logs its call would emit. HeadAhead: the chance that eth_blockNumber answers a
	// head 50 blocks ahead of the node's. FinalizedBack: the chance that the finalized tag is
	// answered a few blocks below where it is (a finalized block that went backwards).
	InventReceipt, HeadAhead, FinalizedBack float64
}

// Lying is a profile of a provider that lies in every way it can, some of the time.
func Lying(r *rand.Rand) Profile {
	return Profile{InventReceipt: 0.2 + 0.6*r.Float64(), HeadAhead: 0.3 * r.Float64(), FinalizedBack: 0.5 * r.Float64()}
}

// RandomProfile draws a profile: each fault is off half the time, and mild when on.
func RandomProfile(r *rand.Rand) Profile {
	chance := func(max float64) float64 {
		if r.IntN(2) == 0 {
			return 0
		}
		return r.Float64() * max
	}
	p := Profile{MaxLag: r.IntN(4)}
	p.MinLag = r.IntN(p.MaxLag + 1)
	if r.IntN(2) == 0 {
		p.MinLag = 0
	}
	p.NullReceipt = chance(0.3)
	p.Fail = chance(0.1)
	p.RateLimit = chance(0.1)
	p.ElemFail = chance(0.1)
	p.Drop = chance(0.05)
	p.DropDelay = time.Duration(r.IntN(5)) * time.Second
	p.NoBlockReceipts = r.IntN(5) == 0
	p.ClampLogs = r.IntN(3) == 0
	return p
}

// Backend is one JSON-RPC node's view of the chain, with its own faults. It implements
// ethrpc.Chain (go-ethereum's *rpc.Client method set): results are written as the real client
// writes them, by a JSON round trip of the answer into result, and errors are what the real
// client returns (an rpc.Error for a node's error object; a *url.Error or rpc.HTTPError for
// transport failures).
type Backend struct {
	mu    sync.Mutex
	chain *Chain
	name  string
	url   string
	p     Profile
	r     *rand.Rand
	seen  *block // the newest head this node has answered from
	trace *Trace
	lies  int
}

// Lies is how many lies the backend has told (Profile's InventReceipt, HeadAhead, FinalizedBack).
func (b *Backend) Lies() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lies
}

// NewBackend returns a node called name on c with profile p; its draws come from a generator
// forked from r.
func NewBackend(c *Chain, name string, p Profile, r *rand.Rand) *Backend {
	return &Backend{chain: c, name: name, url: "http://" + name + ".settlesim", p: p, r: Fork(r)}
}

// Name is the backend's name.
func (b *Backend) Name() string { return b.name }

// SetTrace makes the backend record every request and answer in t.
func (b *Backend) SetTrace(t *Trace) {
	b.mu.Lock()
	b.trace = t
	b.mu.Unlock()
}

// SetProfile changes the backend's faults (Profile{} for a reliable node, at the end of a run).
func (b *Backend) SetProfile(p Profile) {
	b.mu.Lock()
	b.p = p
	b.mu.Unlock()
}

// Profile is the backend's current profile.
func (b *Backend) Profile() Profile {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.p
}

// request is one call of a request, its params as they went over the wire.
type request struct {
	method string
	params []json.RawMessage
}

// answer is what the node answered to one call: a JSON result, or an error (an *RPCError, or
// rpc.ErrMissingBatchResponse).
type answer struct {
	result json.RawMessage
	err    error
}

// CallContext implements ethrpc.Chain.
func (b *Backend) CallContext(ctx context.Context, result any, method string, args ...any) error {
	if result != nil && reflect.TypeOf(result).Kind() != reflect.Pointer {
		return fmt.Errorf("call result parameter must be pointer or nil interface: %v", result)
	}
	req, err := newRequest(method, args)
	if err != nil {
		return err
	}
	answers, err := b.do(ctx, []request{req}, false)
	if err != nil {
		return err
	}
	a := answers[0]
	switch {
	case a.err != nil:
		return a.err
	case result == nil:
		return nil
	default:
		return json.Unmarshal(a.result, result)
	}
}

// BatchCallContext implements ethrpc.Chain.
func (b *Backend) BatchCallContext(ctx context.Context, elems []rpc.BatchElem) error {
	if len(elems) == 0 {
		return rpcErr(-32600, "empty batch")
	}
	reqs := make([]request, len(elems))
	for i, el := range elems {
		req, err := newRequest(el.Method, el.Args)
		if err != nil {
			return err
		}
		reqs[i] = req
	}
	answers, err := b.do(ctx, reqs, true)
	if err != nil {
		return err
	}
	for i, a := range answers {
		if a.err != nil {
			elems[i].Error = a.err
			continue
		}
		elems[i].Error = json.Unmarshal(a.result, elems[i].Result)
	}
	return nil
}

// newRequest marshals args as the real client does before sending them: what cannot be
// marshalled fails here, and handlers see exactly the JSON a node would.
func newRequest(method string, args []any) (request, error) {
	req := request{method: method, params: make([]json.RawMessage, len(args))}
	for i, a := range args {
		raw, err := json.Marshal(a)
		if err != nil {
			return request{}, err
		}
		req.params[i] = raw
	}
	return req, nil
}

// do runs one request (a lone call or a batch) against a single view of the chain.
func (b *Backend) do(ctx context.Context, reqs []request, batch bool) ([]answer, error) {
	if err := ctx.Err(); err != nil {
		return nil, &url.Error{Op: "Post", URL: b.url, Err: err}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.p
	dropped := false
	switch u := b.r.Float64(); {
	case u < p.Fail:
		var err error
		switch b.r.IntN(3) {
		case 0:
			err = errReset(b.url)
		case 1:
			err = errHTTP(502)
		default:
			err = errHTTP(503)
		}
		b.record(reqs, nil, err)
		return nil, err
	case u < p.Fail+p.RateLimit:
		err := errHTTP(429)
		b.record(reqs, nil, err)
		return nil, err
	case u < p.Fail+p.RateLimit+p.Drop:
		dropped = true
	}

	c := b.chain
	c.mu.Lock()
	v := b.viewLocked()
	answers := make([]answer, len(reqs))
	for i, req := range reqs {
		answers[i] = b.call(v, req, batch)
	}
	c.mu.Unlock()

	if dropped {
		if p.DropDelay > 0 {
			c.clock.Advance(p.DropDelay)
		}
		err := errTimeout(b.url)
		b.record(reqs, answers, err)
		return nil, err
	}
	b.record(reqs, answers, nil)
	return answers, nil
}

// call answers one call, its own faults drawn first. Caller holds b.mu and the chain's mu.
func (b *Backend) call(v nodeView, req request, batch bool) answer {
	if b.r.Float64() < b.p.ElemFail {
		switch b.r.IntN(4) {
		case 0:
			return answer{err: rpcErr(codeLimit, "limit exceeded")}
		case 1:
			return answer{err: rpcErr(codeInternal, "internal error")}
		case 2:
			if req.method == "eth_getTransactionReceipt" {
				return answer{err: rpcErr(codeDefault, "transaction indexing is in progress")}
			}
			return answer{err: rpcErr(codeLimit, "request rate exceeded")}
		default:
			// Applied, and its answer missing from the batch; a lone call's missing answer is a
			// timeout to the client.
			b.dispatch(v, req)
			if batch {
				return answer{err: rpc.ErrMissingBatchResponse}
			}
			return answer{err: errTimeout(b.url)}
		}
	}
	res, e := b.dispatch(v, req)
	if e != nil {
		return answer{err: e}
	}
	raw, err := json.Marshal(res)
	if err != nil {
		return answer{err: rpcErr(codeInternal, err.Error())}
	}
	return answer{result: raw}
}

// viewLocked picks the head this request is answered from: head−k for a lag k drawn from the
// profile, never older than what the node answered from before, and, after a reorganisation,
// possibly still on the old branch (the newest head the chain had at that height). Caller
// holds both locks.
func (b *Backend) viewLocked() nodeView {
	c := b.chain
	head := c.head()
	k := b.p.MinLag
	if b.p.MaxLag > b.p.MinLag {
		k += b.r.IntN(b.p.MaxLag - b.p.MinLag + 1)
	}
	target := uint64(0)
	if head.number > uint64(k) {
		target = head.number - uint64(k)
	}
	if b.seen != nil && b.seen.number > target {
		target = min(b.seen.number, head.number)
	}
	v := head
	for i := len(c.tips) - 1; i >= 0; i-- {
		if c.tips[i].number <= target {
			v = c.tips[i]
			break
		}
	}
	if b.seen != nil && v.seq < b.seen.seq && b.seen.number <= head.number {
		v = b.seen
	}
	b.seen = v
	return nodeView{c: c, head: v}
}

func (b *Backend) record(reqs []request, answers []answer, err error) {
	if b.trace == nil {
		return
	}
	for i, req := range reqs {
		line := fmt.Sprintf("%s %s %s", b.name, req.method, joinRaw(req.params))
		if answers != nil {
			if a := answers[i]; a.err != nil {
				line += " !" + a.err.Error()
			} else {
				line += " = " + string(a.result)
			}
		}
		b.trace.Record("%s", line)
	}
	if err != nil {
		b.trace.Record("%s request error: %v", b.name, err)
	}
}

func joinRaw(params []json.RawMessage) string {
	out := "["
	for i, p := range params {
		if i > 0 {
			out += ","
		}
		out += string(p)
	}
	return out + "]"
}

// Balancer is a load-balanced endpoint: each request goes to one of its backends, drawn at
// random, so consecutive reads may come from nodes that disagree. It implements ethrpc.Chain.
type Balancer struct {
	mu       sync.Mutex
	r        *rand.Rand
	backends []*Backend
	split    bool
}

// NewBalancer spreads requests over backends; its draws come from a generator forked from r.
func NewBalancer(r *rand.Rand, backends ...*Backend) *Balancer {
	if len(backends) == 0 {
		panic("settlesim: a balancer needs a backend")
	}
	return &Balancer{r: Fork(r), backends: backends}
}

func (lb *Balancer) pick() *Backend {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.backends[lb.r.IntN(len(lb.backends))]
}

// SplitBatches makes the balancer send each element of a batch to a backend of its own, as
// some providers' balancers do: then even one batch's answers may come from nodes that
// disagree (a block one has, a state read from another that lags).
func (lb *Balancer) SplitBatches(on bool) {
	lb.mu.Lock()
	lb.split = on
	lb.mu.Unlock()
}

// Backends are the balancer's backends.
func (lb *Balancer) Backends() []*Backend { return append([]*Backend(nil), lb.backends...) }

// CallContext implements ethrpc.Chain.
func (lb *Balancer) CallContext(ctx context.Context, result any, method string, args ...any) error {
	return lb.pick().CallContext(ctx, result, method, args...)
}

// BatchCallContext implements ethrpc.Chain.
func (lb *Balancer) BatchCallContext(ctx context.Context, elems []rpc.BatchElem) error {
	lb.mu.Lock()
	split := lb.split
	lb.mu.Unlock()
	if !split || len(elems) < 2 {
		return lb.pick().BatchCallContext(ctx, elems)
	}
	// The balancer answers the batch itself: an upstream's transport failure becomes that
	// element's error.
	for i := range elems {
		if err := lb.pick().BatchCallContext(ctx, elems[i:i+1]); err != nil {
			elems[i].Error = err
		}
	}
	return nil
}
