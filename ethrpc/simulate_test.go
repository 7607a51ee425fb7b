package ethrpc_test

import (
	"context"
	"crypto/rand"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
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
	name   string
	data   []byte
	gasCap uint64
}

// simCases are transfers that succeed, fail for their signature, run out of gas, and the same
// transfer twice (which must both succeed: neither may see the other's use of the nonce).
func simCases(t *testing.T) []simCase {
	t.Helper()
	payer, payee := chain.Accounts[5], chain.Accounts[6]
	authorization := func(value int64) ([]byte, []byte) {
		a := devchain.TransferAuthorization{From: payer.Address, To: payee.Address, Value: big.NewInt(value),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 3600)}
		if _, err := rand.Read(a.Nonce[:]); err != nil {
			t.Fatal(err)
		}
		sig, err := chain.USDC.SignTransferAuthorization(payer.Key, a)
		if err != nil {
			t.Fatal(err)
		}
		fa := facilitator.Authorization{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: a.Nonce}
		bad := append([]byte(nil), sig...)
		bad[10] ^= 0xff
		return eip3009.TransferCalldata(fa, sig), eip3009.TransferCalldata(fa, bad)
	}
	var cases []simCase
	for i := 0; i < 12; i++ {
		good, bad := authorization(int64(1000 + i))
		cases = append(cases, simCase{"valid", good, 200_000}, simCase{"bad signature", bad, 0})
	}
	twice, _ := authorization(7)
	cases = append(cases, simCase{"same transfer", twice, 0}, simCase{"same transfer", twice, 0})
	tight, _ := authorization(8)
	cases = append(cases, simCase{"out of gas", tight, 40_000})
	return cases
}

func (c simCase) reads(simulate bool) (code, sim *ethrpc.Read) {
	code = &ethrpc.Read{Code: true, To: chain.Accounts[5].Address}
	sim = &ethrpc.Read{To: chain.USDC.Address, Data: c.data, GasCap: c.gasCap, Simulate: simulate}
	if c.gasCap > 0 {
		sim.From = chain.Accounts[0].Address
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
			// Alone: the first caller, the 12 bad signatures, the second of the same transfer, and
			// the one out of gas.
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
