package settlesim

import (
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// TestAggregate3: the simulated chain runs Multicall3's aggregate3 as the contract does: the calls
// in order, each seeing the ones before it; with allowFailure a call that reverts (here: the same
// authorization a second time) fails alone and the batch's other transfers happen, each with its
// AuthorizationUsed+Transfer pair, their uses recorded under the batch's transaction and its
// sender; without allowFailure one failing call reverts the whole batch and nothing moves.
func TestAggregate3(t *testing.T) {
	w := newWorld(t, ChainConfig{ChainID: 1337})
	batch := func(nonce uint64, allowFailure bool, auths ...int) *types.Transaction {
		t.Helper()
		calls := make([]multicall3.Call, len(auths))
		for i, n := range auths {
			calls[i] = multicall3.Call{Target: w.chain.Token(), AllowFailure: allowFailure, CallData: calldata(w.auth(byte(n), int64(100*n)))}
		}
		to := multicall3.Address
		tx, err := types.SignNewTx(w.signer, types.LatestSignerForChainID(big.NewInt(1337)), &types.DynamicFeeTx{ChainID: big.NewInt(1337),
			Nonce: nonce, GasTipCap: gwei, GasFeeCap: new(big.Int).Mul(big.NewInt(100), gwei), Gas: 1_000_000, To: &to,
			Data: multicall3.Aggregate3Calldata(calls)})
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}

	tx := batch(0, true, 1, 1, 2)
	w.mustSend(tx)
	w.chain.Mine()
	r := receipt(t, w.node, tx.Hash())
	if r == nil || r.Status != 1 || len(r.Logs) != 4 {
		t.Fatalf("the batch's receipt %+v, want success with two AuthorizationUsed+Transfer pairs", r)
	}
	for _, n := range []int{1, 2} {
		a := w.auth(byte(n), int64(100*n))
		if tr, ok := eip3009.UsedBy(r.Logs, w.chain.Token(), a.From, a.Nonce); !ok || tr.Value.Int64() != int64(100*n) {
			t.Fatalf("authorization %d in the batch's receipt: %+v %v", n, tr, ok)
		}
		if u, ok := w.chain.AuthorizationUse(a.From, a.Nonce); !ok || u.TxHash != tx.Hash() || u.Sender != w.addr || u.Kind != UseTransfer {
			t.Fatalf("authorization %d's use %+v %v, want by the batch, sent by us", n, u, ok)
		}
		if txs := w.chain.AuthorizationTxs(a.From, a.Nonce); len(txs) != 1 || txs[0].Hash != tx.Hash() || len(txs[0].Batch) != 3 {
			t.Fatalf("authorization %d's transactions %+v, want the batch", n, txs)
		}
	}
	if got := w.chain.TokenBalance(w.payTo).Int64(); got != 300 {
		t.Fatalf("payee holds %d, want 300: the repeated authorization paid once", got)
	}

	strict := batch(1, false, 3, 1)
	w.mustSend(strict)
	w.chain.Mine()
	if r := receipt(t, w.node, strict.Hash()); r == nil || r.Status != 0 || len(r.Logs) != 0 {
		t.Fatalf("a batch whose call may not fail, with a failing call: %+v, want reverted", r)
	}
	a3 := w.auth(3, 300)
	if _, ok := w.chain.AuthorizationUse(a3.From, a3.Nonce); ok || w.chain.TokenBalance(w.payTo).Int64() != 300 {
		t.Fatal("the reverted batch moved something")
	}
}
