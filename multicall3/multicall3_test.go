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
	chain := stacktest.NewChain(t, devchain.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sender := ethrpc.NewSigner(chain.ChainID, chain.Accounts[0].Key)
	payer := chain.Accounts[1]
	nonceOf := func() uint64 {
		n, err := chain.Client.PendingNonceAt(ctx, sender.Address())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	send := func(to common.Address, data []byte) *types.Receipt {
		t.Helper()
		gas, err := chain.Client.EstimateGas(ctx, ethereumCall(sender.Address(), to, data))
		if err != nil {
			t.Fatal(err)
		}
		tx, err := sender.Sign(nonceOf(), &to, data, gas+gas/4, big.NewInt(1e9), big.NewInt(100e9))
		if err != nil {
			t.Fatal(err)
		}
		if err := chain.Client.SendTransaction(ctx, tx); err != nil {
			t.Fatal(err)
		}
		for {
			r, err := chain.Client.TransactionReceipt(ctx, tx.Hash())
			if err == nil {
				return r
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	authorize := func(value int64) (facilitator.Authorization, []byte) {
		t.Helper()
		// A fresh payee each time, as a busy facilitator's are: its balance slot is written from
		// zero, the costliest case.
		a := devchain.TransferAuthorization{From: payer.Address, Value: big.NewInt(value),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 600)}
		if _, err := rand.Read(a.Nonce[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := rand.Read(a.To[:]); err != nil {
			t.Fatal(err)
		}
		sig, err := chain.USDC.SignTransferAuthorization(payer.Key, a)
		if err != nil {
			t.Fatal(err)
		}
		return facilitator.Authorization{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore, Nonce: a.Nonce}, sig
	}

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
	if err := chain.RPC.CallContext(ctx, (*hexBytes)(&out), "eth_call", map[string]any{"from": sender.Address(), "to": multicall3.Address,
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
