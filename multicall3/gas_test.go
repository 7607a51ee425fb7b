package multicall3_test

import (
	"context"
	"crypto/rand"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// gasBench sends transactions from one key on a chain of its own and signs authorizations.
type gasBench struct {
	t      *testing.T
	ctx    context.Context
	chain  *devchain.Chain
	sender *ethrpc.Signer
	nonce  uint64
}

func newGasBench(t *testing.T) *gasBench {
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
// zero, the costliest transfer) and returns it with its calldata.
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
	auth := facilitator.Authorization{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: a.Nonce}
	return auth, eip3009.TransferCalldata(auth, sig)
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
			a, data := b.authorize(1+i%payers, 1000)
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
