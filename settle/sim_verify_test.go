package settle_test

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// The simulator's /verify: in half the worlds that are not plain, the real verify.Verifier, over
// a real ethrpc.Reader, over a node of the simulated chain, answers bursts of merchants calling at
// once (Verify and SettleCheck), whose simulations the Reader runs together in one eth_simulateV1.
// Each answer is held against the chain: isValid true only for a payment that succeeds alone.
//
// A burst draws from a stream of its own and changes nothing on the chain, so a seed's schedule
// is what it was without it. Its callers run on goroutines (grouping is concurrency), in a known
// order: the first caller's request is held at the node until each of the others, started one at
// a time, has joined the group waiting behind it (Reader.Queued). The node's faults cannot change
// an answer (a fixed lag, nothing else), so the order in which the callers' later reads reach it,
// and draw from its stream, changes nothing; and while a burst runs the world waits.

// simVerifying is the verify side of a world.
type simVerifying struct {
	r        *rand.Rand
	on       bool
	lag      uint64 // the node's lag, fixed: every read of a burst answers from one block
	gate     *verifyGate
	verifier *verify.Verifier
	// wallet is a payer with code (a greedy one: its isValidSignature is cheap when verify asks,
	// and burns the gas inside the token), holding tokens; no payment of the engine's is its.
	wallet common.Address
	// hinted: the verifier has estimated a transfer once, so that SettleCheck simulates at a gas
	// limit (a read that goes in groups) rather than by an estimate (which never does).
	hinted bool
	// engineNodes are the nodes of the engine's verifier when it is the real one (engineVerifier).
	engineNodes []*settlesim.Backend
	stats       verifyStats
}

// verifyStats count the bursts, their callers and answers, the groups the node ran, and the
// funding adversaries (an authorization refused for its recipient that would fund the empty
// account whose own payment follows it in the group).
type verifyStats struct {
	bursts, calls, valid, invalid, unavailable, groups, groupedCalls, fundings int
	// engineWorlds: worlds whose engine checked its payments with the real verifier.
	engineWorlds int
}

func (s *verifyStats) add(o verifyStats) {
	s.bursts += o.bursts
	s.calls += o.calls
	s.valid += o.valid
	s.invalid += o.invalid
	s.unavailable += o.unavailable
	s.groups += o.groups
	s.groupedCalls += o.groupedCalls
	s.fundings += o.fundings
	s.engineWorlds += o.engineWorlds
}

func (s verifyStats) String() string {
	return fmt.Sprintf("%d verify bursts of %d calls (%d valid, %d invalid, %d unavailable), %d eth_simulateV1 groups of %d calls, %d funded accounts' own payments refused; %d worlds whose engine used the real verifier",
		s.bursts, s.calls, s.valid, s.invalid, s.unavailable, s.groups, s.groupedCalls, s.fundings, s.engineWorlds)
}

// setUpVerifying builds the verify side; off in a plain world, and in a batched one (its own
// schedule has no place for bursts).
func (w *simWorld) setUpVerifying(plain bool) {
	v := &w.verifying
	v.r = rand.New(rand.NewPCG(w.seed, 0x7e21f))
	v.on = v.r.IntN(2) == 0 && !plain && w.network.Batch.Max == 0
	v.lag = uint64(v.r.IntN(3))
	// Some nodes lack eth_simulateV1: the Reader then runs every simulation alone.
	p := settlesim.Profile{MinLag: int(v.lag), MaxLag: int(v.lag), NoSimulate: v.r.IntN(6) == 0}
	v.gate = &verifyGate{chain: settlesim.NewBackend(w.chain, "verify", p, v.r), queued: make(chan struct{}, 64)}
	reader := &ethrpc.Reader{Chain: v.gate, Timeout: 10 * time.Second, Queued: v.gate.joined}
	var err error
	v.verifier, err = verify.New(verify.Config{Networks: []facilitator.Network{w.network}, Readers: map[string]verify.Reader{w.network.ID: reader}, Now: w.clock.Now})
	if err != nil {
		panic(err)
	}
	if v.on {
		v.wallet = common.BigToAddress(big.NewInt(0xa11e7))
		w.chain.SetGreedy(v.wallet, true)
		w.chain.Mint(v.wallet, big.NewInt(1_000_000))
	}
}

// engineVerifier is the engine's verifier: in a third of the worlds that are not plain, the real
// one, over a Reader over nodes of its own with faults of their own (the engine calls it on the
// world's goroutine: its draws are in a known order), from a stream of its own; otherwise
// simVerifier, which reads the chain's head. Never in a batched world, whose callers go on
// concurrently once their batch closes: draws of faults in their goroutines would make a seed's
// run depend on the scheduler.
func (w *simWorld) engineVerifier(plain bool) settle.Verifier {
	r := rand.New(rand.NewPCG(w.seed, 0xe7f1))
	if plain || w.network.Batch.Max > 0 || r.IntN(3) != 0 {
		return &simVerifier{w: w}
	}
	var nodes []*settlesim.Backend
	for i := range 1 + r.IntN(2) {
		nodes = append(nodes, settlesim.NewBackend(w.chain, fmt.Sprintf("everify%d", i), settlesim.RandomProfile(r), r))
	}
	reader := &ethrpc.Reader{Chain: settlesim.NewBalancer(r, nodes...), Timeout: time.Second}
	v, err := verify.New(verify.Config{Networks: []facilitator.Network{w.network}, Readers: map[string]verify.Reader{w.network.ID: reader}, Now: w.clock.Now})
	if err != nil {
		panic(err)
	}
	w.verifying.engineNodes = nodes
	return v
}

// verifyStep is, now and then, a burst of merchants calling verify at once.
func (w *simWorld) verifyStep() error {
	v := &w.verifying
	if !v.on || v.r.IntN(10) != 0 {
		return nil
	}
	return w.verifyBurst()
}

// verifyCounts are the verify side's counts, with the node's groups.
func (w *simWorld) verifyCounts() verifyStats {
	v := &w.verifying
	s := v.stats
	if len(v.engineNodes) > 0 {
		s.engineWorlds = 1
	}
	v.gate.mu.Lock()
	s.groups, s.groupedCalls = v.gate.simulations-v.gate.refused, v.gate.simulated
	v.gate.mu.Unlock()
	return s
}

// verifyCall is one merchant's call in a burst, and its answer.
type verifyCall struct {
	p *facilitator.Payment
	// settling: SettleCheck from the engine's first signer; otherwise Verify.
	settling bool
	// ownOfFunded: the payment of an account holding nothing, behind an authorization that pays
	// it (refused for its recipient): it must be refused (the defect 2).
	ownOfFunded bool

	res    facilitator.VerifyResponse
	gas    uint64
	wallet bool
	err    error
}

func (c *verifyCall) run(ctx context.Context, v *verify.Verifier, signer common.Address) {
	if c.settling {
		c.res, c.gas, c.wallet, c.err = v.SettleCheck(ctx, c.p, signer)
		return
	}
	c.res, c.err = v.Verify(ctx, c.p)
}

func (w *simWorld) verifyBurst() error {
	v := &w.verifying
	signer := crypto.PubkeyToAddress(w.signers[0].PublicKey)
	head := w.chain.Head().Number
	if !v.hinted {
		// Learn the gas hint alone first (SettleCheck's estimate never goes in a group).
		c := &verifyCall{p: w.verifyPayment(w.payers[v.r.IntN(len(w.payers))], 1+v.r.IntN(1000)), settling: true}
		c.run(w.ctx, v.verifier, signer)
		if err := w.holdVerify(c, head); err != nil {
			return err
		}
		v.hinted = c.err == nil && c.res.IsValid && !c.wallet
	}
	v.stats.bursts++
	// The first caller, held at the node: any payment (each is simulated in its first read).
	calls := []*verifyCall{{p: w.verifyPayment(w.payers[v.r.IntN(len(w.payers))], 1+v.r.IntN(1000))}}
	for n := 1 + v.r.IntN(5); len(calls) < 1+n; {
		switch x := v.r.IntN(8); {
		case x == 0 && len(w.payments) > 0:
			calls = append(calls, &verifyCall{p: w.payments[v.r.IntN(len(w.payments))].p}) // a payment the engine knows
		case x == 1:
			// A payer who drained its balance (or one asked for more than it holds).
			k := w.poorestPayer()
			bal := w.chain.TokenBalance(crypto.PubkeyToAddress(k.PublicKey))
			calls = append(calls, &verifyCall{p: w.verifyPayment(k, int(bal.Int64())+1+v.r.IntN(100))})
		case x == 2:
			// Expired, or expiring within verify's margin of 6 s.
			p := w.verifyPayment(w.payers[v.r.IntN(len(w.payers))], 1+v.r.IntN(1000))
			k := w.payerKey(p.Authorization.From)
			p.Authorization.ValidBefore = big.NewInt(w.clock.Now().Unix() - 3 + int64(v.r.IntN(10)))
			p.Signature = w.signAuthorization(k, p.Authorization)
			calls = append(calls, &verifyCall{p: p})
		case x == 3:
			// Signed by another key.
			p := w.verifyPayment(w.payers[v.r.IntN(len(w.payers))], 1+v.r.IntN(1000))
			p.Signature = w.signAuthorization(w.signers[0], p.Authorization)
			calls = append(calls, &verifyCall{p: p})
		case x == 4:
			// A contract wallet's payment: cheap to check, and it burns the gas inside the token.
			p := w.verifyPayment(w.payers[0], 1+v.r.IntN(1000))
			p.Authorization.From, p.Payer = v.wallet, v.wallet.Hex()
			calls = append(calls, &verifyCall{p: p})
		case x == 5:
			// The funding adversary: an authorization from a funded payer to an empty account X,
			// with requirements that pay someone else (refused for its recipient), then X's own
			// payment, which only the first's transfer could fund.
			k := w.richestPayer()
			x := w.verifyKey()
			value := 1 + v.r.IntN(1000)
			funding := w.verifyPayment(k, value)
			funding.Authorization.To = crypto.PubkeyToAddress(x.PublicKey)
			funding.Signature = w.signAuthorization(k, funding.Authorization)
			own := w.verifyPayment(x, 1+v.r.IntN(value))
			calls = append(calls, &verifyCall{p: funding}, &verifyCall{p: own, ownOfFunded: true})
		default:
			calls = append(calls, &verifyCall{p: w.verifyPayment(w.payers[v.r.IntN(len(w.payers))], 1+v.r.IntN(1000))})
		}
	}
	for _, c := range calls {
		c.settling = v.hinted && v.r.IntN(2) == 0
	}
	if err := w.runBurst(calls, signer); err != nil {
		return err
	}
	for _, c := range calls {
		if err := w.holdVerify(c, head); err != nil {
			return err
		}
	}
	return nil
}

// runBurst runs calls on goroutines of their own, the first held at the node until the others
// have joined the group behind it, one after the other; it returns once every call has.
func (w *simWorld) runBurst(calls []*verifyCall, signer common.Address) error {
	v := &w.verifying
	g := v.gate
	var wg sync.WaitGroup
	defer wg.Wait()
	if g.gaveUp() {
		// The Reader no longer groups (the node has no eth_simulateV1): one after the other.
		for _, c := range calls {
			c.run(w.ctx, v.verifier, signer)
		}
		return nil
	}
	entered, release := g.arm()
	releasing := sync.OnceFunc(func() { close(release) })
	defer releasing()
	wait := func(ch <-chan struct{}, what string) error {
		select {
		case <-ch:
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("verify burst: %s never happened", what)
		}
	}
	// The callers' own requests carry a mark; a group's, made by the Reader, do not.
	ctx := context.WithValue(w.ctx, burstCaller{}, true)
	wg.Go(func() { calls[0].run(ctx, v.verifier, signer) })
	if err := wait(entered, "the first caller's request"); err != nil {
		return err
	}
	if !g.heldOwn() {
		// The last burst's group had not yet freed the Reader's slot: the first caller queued
		// behind it, and its group (of one) is the request held. Its queuing is not the second's.
		if err := wait(g.queued, "the first caller queuing behind the last burst's group"); err != nil {
			return err
		}
	}
	for i, c := range calls[1:] {
		wg.Go(func() { c.run(ctx, v.verifier, signer) })
		if err := wait(g.queued, fmt.Sprintf("caller %d queuing its simulation", i+1)); err != nil {
			return err
		}
	}
	releasing()
	return nil
}

// holdVerify holds one answer against the chain: valid only if the payment meets its
// requirements and its transfer succeeds alone at a block the node could have read (any block
// the chain has made, canonical or reorganised away, numbered at least head − the node's lag,
// head being the chain's when the burst began: nothing moves it while a burst runs), by
// eth_call for Verify, and within the gas the settlement would be signed with for SettleCheck.
func (w *simWorld) holdVerify(c *verifyCall, head uint64) error {
	v := &w.verifying
	v.stats.calls++
	fmt.Fprintf(&w.log, "sim: verify (settling %v) of %x from %s: valid %v %s gas %d wallet %v err %v\n", c.settling, c.p.Authorization.Nonce[:4],
		c.p.Authorization.From, c.res.IsValid, c.res.InvalidReason, c.gas, c.wallet, c.err)
	switch {
	case c.err != nil:
		v.stats.unavailable++
		return nil
	case !c.res.IsValid:
		v.stats.invalid++
		if c.ownOfFunded {
			v.stats.fundings++
		}
		return nil
	}
	v.stats.valid++
	p, a := c.p, c.p.Authorization
	wrong := func(why string) error {
		mode := "Verify"
		if c.settling {
			mode = fmt.Sprintf("SettleCheck (gas %d)", c.gas)
		}
		return fmt.Errorf("verify: %s answered valid for authorization %x of %s paying %s to %s (requirements %s to %s), head %d, node lag %d: %s",
			mode, a.Nonce[:4], a.From, a.Value, a.To, p.Requirements.Amount, p.Requirements.PayTo, head, v.lag, why)
	}
	if c.ownOfFunded {
		return wrong("its payer holds nothing: only the transfer before it in the group could fund it")
	}
	if a.To != p.Requirements.PayTo || a.Value.Cmp(p.Requirements.Amount) != 0 || a.ValidBefore.Int64() < w.clock.Now().Unix()+6 {
		return wrong("it does not meet its requirements and verify's window")
	}
	from, gas := common.Address{}, uint64(0)
	if c.settling {
		from, gas = crypto.PubkeyToAddress(w.signers[0].PublicKey), eip3009.GasLimit(c.gas)
	}
	data := eip3009.TransferCalldata(a, eip3009.SettlementSignature(p.Signature))
	for _, b := range w.chain.BlocksFrom(head - min(head, v.lag)) {
		if w.chain.CallSucceeds(b.Hash, from, w.chain.Token(), data, gas) {
			return nil
		}
	}
	return wrong("its transfer fails alone at every block the node could have read")
}

// verifyPayment is a payment of value from key to one of the merchants, signed, valid for a few
// minutes: the verify side's own (the engine never settles it), drawn from its stream.
func (w *simWorld) verifyPayment(key *ecdsa.PrivateKey, value int) *facilitator.Payment {
	r := w.verifying.r
	from := crypto.PubkeyToAddress(key.PublicKey)
	var nonce [32]byte
	for i := range nonce {
		nonce[i] = byte(r.UintN(256))
	}
	payTo := common.BigToAddress(big.NewInt(int64(0x1000 + r.IntN(4))))
	amount := big.NewInt(int64(value))
	a := facilitator.Authorization{From: from, To: payTo, Value: amount, ValidAfter: big.NewInt(0),
		ValidBefore: big.NewInt(w.clock.Now().Unix() + int64(60+r.IntN(540))), Nonce: nonce}
	return &facilitator.Payment{X402Version: 2, Scheme: "exact", Network: w.network.ID,
		Requirements: facilitator.Requirements{Scheme: "exact", Network: w.network.ID, Amount: amount, Asset: w.chain.Token(), PayTo: payTo,
			MaxTimeoutSeconds: 60, Name: "USDC", Version: "2"},
		Authorization: a, Signature: w.signAuthorization(key, a), Payer: from.Hex()}
}

// verifyKey is a fresh key, drawn from the verify side's stream: an account holding nothing.
func (w *simWorld) verifyKey() *ecdsa.PrivateKey {
	b := make([]byte, 32)
	for i := range b {
		b[i] = byte(w.verifying.r.UintN(256))
	}
	b[0] |= 1
	k, err := crypto.ToECDSA(b)
	if err != nil {
		panic(err)
	}
	return k
}

func (w *simWorld) payerKey(a common.Address) *ecdsa.PrivateKey {
	for _, k := range w.payers {
		if crypto.PubkeyToAddress(k.PublicKey) == a {
			return k
		}
	}
	panic("not a payer: " + a.Hex())
}

func (w *simWorld) poorestPayer() *ecdsa.PrivateKey {
	best := w.payers[0]
	for _, k := range w.payers[1:] {
		if w.chain.TokenBalance(crypto.PubkeyToAddress(k.PublicKey)).Cmp(w.chain.TokenBalance(crypto.PubkeyToAddress(best.PublicKey))) < 0 {
			best = k
		}
	}
	return best
}

func (w *simWorld) richestPayer() *ecdsa.PrivateKey {
	best := w.payers[0]
	for _, k := range w.payers[1:] {
		if w.chain.TokenBalance(crypto.PubkeyToAddress(k.PublicKey)).Cmp(w.chain.TokenBalance(crypto.PubkeyToAddress(best.PublicKey))) > 0 {
			best = k
		}
	}
	return best
}

// verifyGate is the verify node's chain as the Reader sees it: it holds the request it is armed
// for until released, hears the Reader's callers queue, and counts the eth_simulateV1 requests.
type verifyGate struct {
	chain ethrpc.Chain
	mu    sync.Mutex
	// hold the next request (armed by arm); entered is closed when it arrives, release lets it go.
	hold             bool
	entered, release chan struct{}
	// own: the held request was a caller's own (marked burstCaller), not a group's.
	own    bool
	queued chan struct{}
	// simulations and simulated count the eth_simulateV1 requests and the calls they carried;
	// refused those the node answered with an error (the Reader then gives up grouping).
	simulations, simulated, refused int
}

func (g *verifyGate) joined() {
	select {
	case g.queued <- struct{}{}:
	default:
	}
}

func (g *verifyGate) arm() (entered, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.drain()
	g.hold, g.entered, g.release = true, make(chan struct{}), make(chan struct{})
	return g.entered, g.release
}

func (g *verifyGate) drain() {
	for len(g.queued) > 0 {
		<-g.queued
	}
}

// burstCaller marks the context of a burst's callers.
type burstCaller struct{}

func (g *verifyGate) heldOwn() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.own
}

// gaveUp says whether the node refused eth_simulateV1: the Reader remembers it and groups no more.
func (g *verifyGate) gaveUp() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused > 0
}

func (g *verifyGate) CallContext(ctx context.Context, result any, method string, args ...any) error {
	return g.chain.CallContext(ctx, result, method, args...)
}

func (g *verifyGate) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	g.mu.Lock()
	hold, entered, release := g.hold, g.entered, g.release
	g.hold = false
	g.mu.Unlock()
	if hold {
		g.mu.Lock()
		g.own = ctx.Value(burstCaller{}) != nil
		g.mu.Unlock()
		close(entered)
		<-release
	}
	err := g.chain.BatchCallContext(ctx, b)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, el := range b {
		if el.Method != "eth_simulateV1" || err != nil {
			continue
		}
		g.simulations++
		if el.Error != nil {
			g.refused++
			continue
		}
		var payload struct {
			BlockStateCalls []struct{ Calls []json.RawMessage } `json:"blockStateCalls"`
		}
		if raw, err := json.Marshal(el.Args[0]); err == nil && json.Unmarshal(raw, &payload) == nil {
			for _, b := range payload.BlockStateCalls {
				g.simulated += len(b.Calls)
			}
		}
	}
	return err
}
