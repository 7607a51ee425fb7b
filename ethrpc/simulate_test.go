package ethrpc_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// slowFirst holds the first request it forwards for a while, so that every caller started with it
// queues behind it, and counts the methods it forwards. With missing set it answers
// eth_simulateV1 as a node without it does.
type slowFirst struct {
	chain   ethrpc.Chain
	first   atomic.Bool
	missing bool // answer eth_simulateV1 as a node without it
	broken  bool // answer eth_simulateV1 as a node that rejects its parameters

	mu      sync.Mutex
	methods map[string]int
}

func (s *slowFirst) CallContext(ctx context.Context, result any, method string, args ...any) error {
	return s.chain.CallContext(ctx, result, method, args...)
}

func (s *slowFirst) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	if s.first.CompareAndSwap(false, true) {
		time.Sleep(300 * time.Millisecond)
	}
	s.mu.Lock()
	for _, el := range b {
		s.methods[el.Method]++
	}
	s.mu.Unlock()
	if !s.missing && !s.broken {
		return s.chain.BatchCallContext(ctx, b)
	}
	var fwd []rpc.BatchElem
	var at []int
	for i, el := range b {
		if el.Method == "eth_simulateV1" {
			b[i].Error = methodNotFound{}
			if s.broken {
				b[i].Error = invalidParams{}
			}
			continue
		}
		fwd, at = append(fwd, el), append(at, i)
	}
	err := s.chain.BatchCallContext(ctx, fwd)
	for j, i := range at {
		b[i] = fwd[j]
	}
	return err
}

func (s *slowFirst) count(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.methods[method]
}

type invalidParams struct{}

func (invalidParams) Error() string  { return "invalid params" }
func (invalidParams) ErrorCode() int { return -32602 }

type methodNotFound struct{}

func (methodNotFound) Error() string {
	return "the method eth_simulateV1 does not exist/is not available"
}
func (methodNotFound) ErrorCode() int { return -32601 }

// simCase is one caller's reads: the payer's code and a transfer's simulation.
type simCase struct {
	name         string
	payer, payee common.Address
	data         []byte
	gasCap       uint64
}

// transfer is an authorization of value from key to payee and its calldata, with a good and a
// bad signature.
func transfer(t *testing.T, key *ecdsa.PrivateKey, payee common.Address, value int64) (good, bad []byte) {
	t.Helper()
	a := devchain.TransferAuthorization{From: crypto.PubkeyToAddress(key.PublicKey), To: payee, Value: big.NewInt(value),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 3600)}
	if _, err := rand.Read(a.Nonce[:]); err != nil {
		t.Fatal(err)
	}
	sig, err := chain.USDC.SignTransferAuthorization(key, a)
	if err != nil {
		t.Fatal(err)
	}
	fa := facilitator.Authorization{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: a.Nonce}
	b := append([]byte(nil), sig...)
	b[10] ^= 0xff
	return eip3009.TransferCalldata(fa, sig), eip3009.TransferCalldata(fa, b)
}

// fundedKey is a fresh key holding usdc of the token's units.
func fundedKey(t *testing.T, usdc int64) *ecdsa.PrivateKey {
	t.Helper()
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if usdc > 0 {
		if err := chain.USDC.Mint(context.Background(), crypto.PubkeyToAddress(key.PublicKey), big.NewInt(usdc)); err != nil {
			t.Fatal(err)
		}
	}
	return key
}

func freshAddress(t *testing.T) common.Address {
	return crypto.PubkeyToAddress(fundedKey(t, 0).PublicKey)
}

// simCases are transfers, each from a payer and to a payee of its own, that succeed, fail for
// their signature, run out of gas, and the same transfer twice (which must both succeed: neither
// may see the other's use of the nonce).
func simCases(t *testing.T) []simCase {
	t.Helper()
	one := func(name string, key *ecdsa.PrivateKey, value int64, gasCap uint64, bad bool) simCase {
		payee := freshAddress(t)
		good, badData := transfer(t, key, payee, value)
		c := simCase{name: name, payer: crypto.PubkeyToAddress(key.PublicKey), payee: payee, data: good, gasCap: gasCap}
		if bad {
			c.data = badData
		}
		return c
	}
	var cases []simCase
	for i := 0; i < 12; i++ {
		cases = append(cases, one("valid", fundedKey(t, 10_000), int64(1000+i), 200_000, false),
			one("bad signature", fundedKey(t, 0), 1000, 0, true))
	}
	twice := one("same transfer", fundedKey(t, 10_000), 7, 0, false)
	cases = append(cases, twice, twice)
	cases = append(cases, one("out of gas", fundedKey(t, 10_000), 8, 40_000, false))
	return cases
}

// reads are c's reads as verify makes them: the simulation names the payer's state as what its
// outcome rests on, both the payer's and the payee's as what it changes, and at a gas limit the
// payee's as what decides its gas.
func (c simCase) reads(simulate bool) (code, sim *ethrpc.Read) {
	code = &ethrpc.Read{Code: true, To: c.payer}
	sim = &ethrpc.Read{To: chain.USDC.Address, Data: c.data, GasCap: c.gasCap, Simulate: simulate,
		Depends: []common.Address{c.payer}, Changes: []common.Address{c.payer, c.payee}}
	if c.gasCap > 0 {
		sim.From = chain.Accounts[0].Address
		sim.GasDepends, sim.GasSurcharge = []common.Address{c.payee}, eip3009.PayeeSetGas
	}
	return code, sim
}

// TestSimulationsTogether: simulations of callers that arrive while one is in flight go as one
// eth_simulateV1, and each answers what it answers alone: success with its return data, a revert
// for a bad signature or too little gas, and the same transfer twice succeeds twice.
func TestSimulationsTogether(t *testing.T) {
	for _, missing := range []bool{false, true} {
		name := "eth_simulateV1"
		if missing {
			name = "node without eth_simulateV1"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cases := simCases(t)
			alone := &ethrpc.Reader{Chain: chain.RPC, Timeout: 5 * time.Second}
			want := make([]*ethrpc.Read, len(cases))
			for i, c := range cases {
				code, sim := c.reads(false)
				if err := alone.Read(ctx, code, sim); err != nil {
					t.Fatalf("%s alone: %v", c.name, err)
				}
				want[i] = sim
			}
			node := &slowFirst{chain: chain.RPC, missing: missing, methods: map[string]int{}}
			together := &ethrpc.Reader{Chain: node, Timeout: 5 * time.Second}
			got := make([]*ethrpc.Read, len(cases))
			errs := make([]error, len(cases))
			behindFirst(cases, func(i int, c simCase) {
				code, sim := c.reads(true)
				errs[i] = together.Read(ctx, code, sim)
				if len(code.Out) != 0 {
					errs[i] = errNonEmptyCode
				}
				got[i] = sim
			})
			for i, c := range cases {
				if errs[i] != nil {
					t.Fatalf("%s: %v", c.name, errs[i])
				}
				g, w := got[i], want[i]
				if g.Reverted != w.Reverted || string(g.Out) != string(w.Out) || (g.RevertReason == "") != (w.RevertReason == "") {
					t.Errorf("%s: together reverted=%v out=%x reason=%q; alone reverted=%v out=%x reason=%q",
						c.name, g.Reverted, g.Out, g.RevertReason, w.Reverted, w.Out, w.RevertReason)
				}
			}
			if !want[0].Reverted && want[1].Reverted && want[len(want)-1].Reverted {
				// the cases are what they say alone
			} else {
				t.Fatalf("alone: valid reverted=%v, bad signature reverted=%v, out of gas reverted=%v", want[0].Reverted, want[1].Reverted, want[len(want)-1].Reverted)
			}
			sims, calls := node.count("eth_simulateV1"), node.count("eth_call")
			t.Logf("%d callers: %d eth_simulateV1, %d eth_call, %d requests' eth_blockNumber", len(cases), sims, calls, node.count("eth_blockNumber"))
			if missing {
				if sims != 1 {
					t.Fatalf("eth_simulateV1 asked %d times of a node without it, want once", sims)
				}
				if calls != len(cases) {
					t.Fatalf("%d eth_call for %d simulations, want each alone", calls, len(cases))
				}
				return
			}
			if sims != 1 {
				t.Fatalf("%d eth_simulateV1 for one group", sims)
			}
			// Alone: the first caller, the 12 bad signatures, the second of the same transfer (its
			// payer's state is the first's: it runs alone in the group's request), and the one out
			// of gas.
			if wantCalls := 1 + 12 + 1 + 1; calls != wantCalls {
				t.Fatalf("%d eth_call, want %d (the first caller, and each failure and repeat again alone)", calls, wantCalls)
			}
		})
	}
}

// behindFirst runs read for every case at once, but for the first, which starts 50 ms ahead (the
// node holds its request): the others queue behind it as one group.
func behindFirst(cases []simCase, read func(i int, c simCase)) {
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i > 0 {
				time.Sleep(50 * time.Millisecond)
			}
			read(i, c)
		}()
	}
	wg.Wait()
}

var errNonEmptyCode = errorString("the payer's code read in the group is not empty")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestSimulationCallerGivesUp: a caller whose context ends while it waits for its group returns
// at once with that error; the group still answers the others.
func TestSimulationCallerGivesUp(t *testing.T) {
	node := &slowFirst{chain: chain.RPC, methods: map[string]int{}}
	r := &ethrpc.Reader{Chain: node, Timeout: 5 * time.Second}
	cases := simCases(t)
	first := make(chan error, 1)
	go func() {
		_, sim := cases[0].reads(true)
		first <- r.Read(context.Background(), sim)
	}()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, sim := cases[2].reads(true)
	if err := r.Read(ctx, sim); err != context.DeadlineExceeded {
		t.Fatalf("a caller that gave up: %v, want its deadline", err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	_, again := cases[2].reads(true)
	if err := r.Read(context.Background(), again); err != nil || again.Reverted {
		t.Fatalf("the next read: err=%v reverted=%v", err, again.Reverted)
	}
}

// TestSimulationsNodeRejectsThem: a node that answers every eth_simulateV1 with an error (here,
// invalid params) is asked three groups in a row and then no more; every answer is the one the
// simulation gives alone.
func TestSimulationsNodeRejectsThem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := &slowFirst{chain: chain.RPC, broken: true, methods: map[string]int{}}
	r := &ethrpc.Reader{Chain: node, Timeout: 5 * time.Second}
	for round := 0; round < 5; round++ {
		node.first.Store(false)
		behindFirst(simCases(t)[:6], func(_ int, c simCase) {
			_, sim := c.reads(true)
			if err := r.Read(ctx, sim); err != nil {
				t.Errorf("round %d, %s: %v", round, c.name, err)
			} else if sim.Reverted != (c.name != "valid") {
				t.Errorf("round %d, %s: reverted=%v", round, c.name, sim.Reverted)
			}
		})
	}
	if n := node.count("eth_simulateV1"); n != 3 {
		t.Fatalf("eth_simulateV1 asked %d times of a node that rejects it, want 3", n)
	}
}

// TestSimulationsApart: in one group, no caller's simulated transfer may decide another's. A
// funded payer's transfer to an empty account X does not fund X's own payment after it; a payer's
// two payments, each of all it holds, both succeed as each does alone; a transfer at a tight gas
// limit to an empty account does not fit it because another's transfer to that account ran
// first. Every answer is the one the simulation gives alone.
func TestSimulationsApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sender := chain.Accounts[0].Address
	mk := func(name string, key *ecdsa.PrivateKey, payee common.Address, value int64, gasCap uint64) simCase {
		good, _ := transfer(t, key, payee, value)
		return simCase{name: name, payer: crypto.PubkeyToAddress(key.PublicKey), payee: payee, data: good, gasCap: gasCap}
	}
	x := fundedKey(t, 0)
	xAddr := crypto.PubkeyToAddress(x.PublicKey)
	twice := fundedKey(t, 1000)
	z := freshAddress(t)

	// The gas limit between a transfer's cost to an account holding USDC and to an empty one.
	estimate := func(data []byte) uint64 {
		est := &ethrpc.Read{Estimate: true, From: sender, To: chain.USDC.Address, Data: data}
		if err := (&ethrpc.Reader{Chain: chain.RPC, Timeout: 5 * time.Second}).Read(ctx, est); err != nil || est.Reverted {
			t.Fatalf("estimate: %v reverted=%v", err, est.Reverted)
		}
		return est.Gas
	}
	tight := mk("to an empty account at a tight gas limit, after another's transfer to it", fundedKey(t, 10_000), z, 1000, 0)
	toEmpty := estimate(tight.data)
	held, _ := transfer(t, fundedKey(t, 10_000), chain.Accounts[6].Address, 1000)
	toHeld := estimate(held)
	if toEmpty < toHeld+10_000 {
		t.Fatalf("a transfer to an empty account costs %d gas, to one holding USDC %d: the case is not what it says", toEmpty, toHeld)
	}
	tight.gasCap = (toEmpty + toHeld) / 2
	t.Logf("transfer gas: %d to an empty account, %d to one holding USDC; the tight limit %d", toEmpty, toHeld, tight.gasCap)

	first := mk("first, in flight", fundedKey(t, 10_000), freshAddress(t), 1000, 0)
	cases := []simCase{
		mk("funded payer to empty X (refused by verify for its recipient)", fundedKey(t, 1000), xAddr, 1000, 0),
		mk("X's own payment", x, freshAddress(t), 1000, 0),
		mk("all a payer holds, once", twice, freshAddress(t), 1000, 0),
		mk("all a payer holds, again", twice, freshAddress(t), 1000, 0),
		mk("to the empty account at a gas limit", fundedKey(t, 10_000), z, 1000, 200_000),
		tight,
		mk("to the empty account at a gas limit with room, after another's transfer to it", fundedKey(t, 10_000), z, 1000, 200_000),
		mk("unrelated", fundedKey(t, 10_000), freshAddress(t), 1000, 0),
		mk("unrelated", fundedKey(t, 10_000), freshAddress(t), 1000, 0),
	}
	wantReverted := []bool{false, true, false, false, false, true, false, false, false}

	alone := &ethrpc.Reader{Chain: chain.RPC, Timeout: 5 * time.Second}
	for i, c := range cases {
		_, sim := c.reads(false)
		if err := alone.Read(ctx, sim); err != nil {
			t.Fatalf("%s alone: %v", c.name, err)
		}
		if sim.Reverted != wantReverted[i] {
			t.Fatalf("%s alone: reverted=%v (%s), want %v: the case is not what it says", c.name, sim.Reverted, sim.RevertReason, wantReverted[i])
		}
	}

	node := &slowFirst{chain: chain.RPC, methods: map[string]int{}}
	node.first.Store(true) // no delay: the group is built by SimGroups
	groups := stacktest.NewSimGroups(node)
	got := make([]*ethrpc.Read, len(cases))
	errs := make([]error, len(cases))
	var rest []func()
	for i, c := range cases {
		rest = append(rest, func() {
			_, got[i] = c.reads(true)
			errs[i] = groups.Reader.Read(ctx, got[i])
		})
	}
	groups.Group(t, func() {
		_, sim := first.reads(true)
		if err := groups.Reader.Read(ctx, sim); err != nil || sim.Reverted {
			t.Errorf("first: %v reverted=%v", err, sim.Reverted)
		}
	}, rest...)
	for i, c := range cases {
		if errs[i] != nil {
			t.Fatalf("%s: %v", c.name, errs[i])
		}
		if got[i].Reverted != wantReverted[i] {
			t.Errorf("%s, in the group: reverted=%v, alone %v", c.name, got[i].Reverted, wantReverted[i])
		}
	}
	if n := node.count("eth_simulateV1"); n != 1 {
		t.Fatalf("%d eth_simulateV1, want the one group's", n)
	}
	// The payments to the empty account at a gas limit went in the group, the second at a
	// lower limit (and then, the tight one, again alone): the gas they need did not keep them out.
	for _, i := range []int{4, 5, 6} {
		if !got[i].Grouped && !got[i].Reverted {
			t.Errorf("%s: answered alone", cases[i].name)
		}
	}
}
