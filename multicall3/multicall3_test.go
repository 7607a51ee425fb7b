package multicall3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

func TestCalldataRoundTrip(t *testing.T) {
	calls := []multicall3.Call{
		{Target: common.Address{1}, AllowFailure: true, CallData: []byte{0xde, 0xad}},
		{Target: common.Address{2}, AllowFailure: false, CallData: nil},
	}
	data := multicall3.Aggregate3Calldata(calls)
	if !bytes.Equal(data[:4], common.FromHex("0x82ad56cb")) { // aggregate3((address,bool,bytes)[])
		t.Fatalf("selector %x", data[:4])
	}
	got, ok := multicall3.DecodeAggregate3Calldata(data)
	if !ok || len(got) != 2 || got[0].Target != calls[0].Target || !got[0].AllowFailure || !bytes.Equal(got[0].CallData, calls[0].CallData) ||
		got[1].Target != calls[1].Target || got[1].AllowFailure || len(got[1].CallData) != 0 {
		t.Fatalf("decoded %+v, %v", got, ok)
	}
	if _, ok := multicall3.DecodeAggregate3Calldata(data[:10]); ok {
		t.Fatal("a truncated call decoded")
	}
	answer := []multicall3.Result{{Success: true, ReturnData: []byte{}}, {Success: false, ReturnData: []byte{0xde, 0xad}}}
	if got, ok := multicall3.DecodeAggregate3(multicall3.Aggregate3Answer(answer)); !ok || len(got) != 2 || !got[0].Success || got[1].Success ||
		!bytes.Equal(got[1].ReturnData, answer[1].ReturnData) {
		t.Fatalf("answer round trip: %+v %v", got, ok)
	}
	if _, ok := multicall3.DecodeAggregate3([]byte{1, 2, 3}); ok {
		t.Fatal("garbage decoded as an answer")
	}
}

// On anvil with Circle's USDC: a batch of authorizations through Multicall3 with allowFailure
// settles the good ones and not the bad one, without reverting; each authorization's own
// AuthorizationUsed+Transfer pair is in the receipt, and only theirs; aggregate3's answer says
// which call failed. The gas per settlement is set beside a lone transferWithAuthorization's.
func TestBatchOnChain(t *testing.T) {
	b := newGasBench(t)
	chain, ctx, payer := b.chain, b.ctx, b.chain.Accounts[1]
	send := func(to common.Address, data []byte) *types.Receipt {
		t.Helper()
		gas := b.estimate(to, data)
		return b.send(to, data, gas+gas/4)
	}
	authorize := func(value int64) (facilitator.Authorization, []byte) { return b.authorize(1, value) }

	// One lone settlement first, for the gas it costs.
	lone, sig := authorize(1000)
	single := send(chain.USDC.Address, eip3009.TransferCalldata(lone, sig))
	if single.Status != 1 {
		t.Fatal("the lone settlement reverted")
	}

	const n = 10
	auths := make([]facilitator.Authorization, n)
	calls := make([]multicall3.Call, n)
	for i := range auths {
		auths[i], sig = authorize(1000)
		if i == 5 {
			// The same payee and value as another: a Transfer log alone cannot tell them apart.
			a := auths[4]
			a.Nonce = auths[i].Nonce
			auths[i] = a
			sig, _ = chain.USDC.SignTransferAuthorization(payer.Key, devchain.TransferAuthorization{From: a.From, To: a.To,
				Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: a.Nonce})
		}
		if i == 3 {
			sig[10] ^= 0xff // a bad signature: this one call fails
		}
		calls[i] = multicall3.Call{Target: chain.USDC.Address, AllowFailure: true, CallData: eip3009.TransferCalldata(auths[i], sig)}
	}
	data := multicall3.Aggregate3Calldata(calls)
	var out []byte
	if err := chain.RPC.CallContext(ctx, (*hexBytes)(&out), "eth_call", map[string]any{"from": b.sender.Address(), "to": multicall3.Address,
		"data": "0x" + common.Bytes2Hex(data)}, "latest"); err != nil {
		t.Fatal(err)
	}
	res, ok := multicall3.DecodeAggregate3(out)
	if !ok || len(res) != n {
		t.Fatalf("aggregate3's answer: %v %x", ok, out)
	}
	for i, r := range res {
		if r.Success != (i != 3) {
			t.Errorf("call %d: success %v", i, r.Success)
		}
	}

	batch := send(multicall3.Address, data)
	if batch.Status != 1 {
		t.Fatal("the batch reverted: one bad authorization must not fail the others")
	}
	want := map[common.Address]int64{}
	for i, a := range auths {
		if i != 3 {
			want[a.To] += 1000
		}
	}
	for i, a := range auths {
		got, err := chain.USDC.BalanceOf(ctx, a.To)
		if err != nil || got.Int64() != want[a.To] {
			t.Errorf("authorization %d's payee holds %v (%v), want %d", i, got, err, want[a.To])
		}
	}
	for i, a := range auths {
		tr, ok := eip3009.UsedBy(batch.Logs, chain.USDC.Address, a.From, a.Nonce)
		if ok != (i != 3) {
			t.Errorf("authorization %d: found in the receipt %v", i, ok)
		}
		if ok && (tr.From != a.From || tr.To != a.To || tr.Value.Cmp(a.Value) != 0) {
			t.Errorf("authorization %d: transfer %+v", i, tr)
		}
	}
	if _, ok := eip3009.UsedBy(batch.Logs, chain.USDC.Address, lone.From, lone.Nonce); ok {
		t.Error("the lone settlement's authorization found in the batch's receipt")
	}
	per := float64(batch.GasUsed) / float64(n-1)
	t.Logf("gas: lone transferWithAuthorization %d; batch of %d (one failing) %d, %.0f per settlement (%.0f%%)",
		single.GasUsed, n, batch.GasUsed, per, 100*per/float64(single.GasUsed))
	if per >= float64(single.GasUsed) {
		t.Errorf("a batched settlement costs %.0f gas, a lone one %d: batching saves nothing", per, single.GasUsed)
	}
}

type hexBytes []byte

func (h *hexBytes) UnmarshalJSON(b []byte) error {
	*h = common.FromHex(string(bytes.Trim(b, `"`)))
	return nil
}

func ethereumCall(from, to common.Address, data []byte) ethereum.CallMsg {
	return ethereum.CallMsg{From: from, To: &to, Data: data}
}

// gasBench sends transactions from one key on a chain of its own and signs authorizations.
type gasBench struct {
	t      testing.TB
	ctx    context.Context
	chain  *devchain.Chain
	sender *ethrpc.Signer
	nonce  uint64
}

func newGasBench(t testing.TB) *gasBench {
	chain := stacktest.NewChain(t, devchain.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &gasBench{t: t, ctx: ctx, chain: chain, sender: ethrpc.NewSigner(chain.ChainID, chain.Accounts[0].Key)}
}

// estimate is eth_estimateGas of a call from the sender, as the engine's verify step asks it.
func (b *gasBench) estimate(to common.Address, data []byte) uint64 {
	b.t.Helper()
	gas, err := b.chain.Client.EstimateGas(b.ctx, ethereumCall(b.sender.Address(), to, data))
	if err != nil {
		b.t.Fatal(err)
	}
	return gas
}

// send signs data to to with the gas limit given, sends it and waits for its receipt.
func (b *gasBench) send(to common.Address, data []byte, gas uint64) *types.Receipt {
	b.t.Helper()
	tx, err := b.sender.Sign(b.nonce, &to, data, gas, big.NewInt(1e9), big.NewInt(100e9))
	if err != nil {
		b.t.Fatal(err)
	}
	b.nonce++
	if err := b.chain.Client.SendTransaction(b.ctx, tx); err != nil {
		b.t.Fatal(err)
	}
	for {
		r, err := b.chain.Client.TransactionReceipt(b.ctx, tx.Hash())
		if err == nil {
			return r
		}
		select {
		case <-b.ctx.Done():
			b.t.Fatal(b.ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// authorize signs an authorization of payer #p to a fresh payee (its balance slot written from
// zero, the costliest transfer) and returns it with its signature.
func (b *gasBench) authorize(p int, value int64) (facilitator.Authorization, []byte) {
	b.t.Helper()
	payer := b.chain.Accounts[p]
	a := devchain.TransferAuthorization{From: payer.Address, Value: big.NewInt(value),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 600)}
	if _, err := rand.Read(a.Nonce[:]); err != nil {
		b.t.Fatal(err)
	}
	if _, err := rand.Read(a.To[:]); err != nil {
		b.t.Fatal(err)
	}
	sig, err := b.chain.USDC.SignTransferAuthorization(payer.Key, a)
	if err != nil {
		b.t.Fatal(err)
	}
	return facilitator.Authorization{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: a.Nonce}, sig
}

// TestBatchGas: a batch signed with NeededGas of its calls' lone estimates, with no margin at
// all, never runs out: every call of every batch (one to a hundred calls, one payer or nine, each
// to a fresh payee) is paid, at one call and at a hundred. Without CallGas the limit is short and
// the batch of one "succeeds" with its only call failed, silently: that is why it is there. The
// logged figures are the measurement behind CallGas.
func TestBatchGas(t *testing.T) {
	b := newGasBench(t)
	batch := func(n, payers int) ([]facilitator.Authorization, []byte, []uint64) {
		calls := make([]multicall3.Call, n)
		auths := make([]facilitator.Authorization, n)
		estimates := make([]uint64, n)
		for i := range calls {
			a, sig := b.authorize(1+i%payers, 1000)
			data := eip3009.TransferCalldata(a, sig)
			auths[i], estimates[i] = a, b.estimate(b.chain.USDC.Address, data)
			calls[i] = multicall3.Call{Target: b.chain.USDC.Address, AllowFailure: true, CallData: data}
		}
		return auths, multicall3.Aggregate3Calldata(calls), estimates
	}
	paid := func(r *types.Receipt, auths []facilitator.Authorization) int {
		k := 0
		for _, a := range auths {
			if _, ok := eip3009.UsedBy(r.Logs, b.chain.USDC.Address, a.From, a.Nonce); ok {
				k++
			}
		}
		return k
	}
	for _, n := range []int{1, 2, 10, 50, facilitator.MaxBatch} {
		for _, payers := range []int{1, 9} {
			auths, data, estimates := batch(n, payers)
			limit := multicall3.NeededGas(estimates)
			r := b.send(multicall3.Address, data, limit)
			if r.Status != 1 || paid(r, auths) != n {
				t.Fatalf("batch of %d (%d payers) at NeededGas %d: status %d, %d of %d calls paid, used %d", n, payers, limit, r.Status, paid(r, auths), n, r.GasUsed)
			}
			var sum uint64
			for _, e := range estimates {
				sum += e
			}
			t.Logf("batch of %3d, %d payer(s): lone estimates %d (%d each), NeededGas %d, used %d (%d per call, %.0f%% of a lone estimate); per call beyond estimate-21000: %+.0f",
				n, payers, sum, sum/uint64(n), limit, r.GasUsed, r.GasUsed/uint64(n), 100*float64(r.GasUsed)/float64(sum),
				(float64(r.GasUsed)-multicall3.IntrinsicGas-float64(sum-uint64(n)*multicall3.IntrinsicGas))/float64(n))
		}
	}
	// Without CallGas: the batch of one is short, and its call fails inside a batch that succeeds.
	auths, data, estimates := batch(1, 1)
	r := b.send(multicall3.Address, data, multicall3.NeededGas(estimates)-multicall3.CallGas)
	if paid(r, auths) != 0 {
		t.Fatalf("a batch of one without CallGas paid its call (used %d): CallGas is not needed, or the measurement changed", r.GasUsed)
	}
}

// TestCallEstimate: CallEstimate inverts NeededGas for calls alike: a batch of n calls each
// estimated at CallEstimate(NeededGas(those), n) needs what they did, to within n.
func TestCallEstimate(t *testing.T) {
	for _, e := range []uint64{21_000, 60_000, 96_537, 120_000, 1_000_000} {
		for _, n := range []int{1, 2, 4, 100} {
			es := make([]uint64, n)
			for i := range es {
				es[i] = e
			}
			need := multicall3.NeededGas(es)
			got := multicall3.CallEstimate(need, n)
			if got > e || e-got > uint64(n) {
				t.Fatalf("CallEstimate(%d, %d) = %d, want %d (within %d below)", need, n, got, e, n)
			}
		}
	}
	if got := multicall3.CallEstimate(100, 1); got != 0 {
		t.Fatalf("a need below one intrinsic cost: %d", got)
	}
}
