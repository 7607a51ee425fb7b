package settlesim

import (
	"context"
	"errors"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestReorgPolicies: a transfer of ours mined at the head, then the head reorganised away under
// each policy; what the chain says afterwards, through a node and to the oracle.
func TestReorgPolicies(t *testing.T) {
	tests := []struct {
		policy ReorgPolicy
		check  func(t *testing.T, w *world, tx *types.Transaction, a facilitator.Authorization, old Block, branch []Block)
	}{
		{ReorgToPool, func(t *testing.T, w *world, tx *types.Transaction, a facilitator.Authorization, old Block, branch []Block) {
			if len(branch) != 1 || len(branch[0].Txs) != 0 || branch[0].Number != old.Number || branch[0].Hash == old.Hash {
				t.Fatalf("branch %+v", branch)
			}
			if r := receipt(t, w.node, tx.Hash()); r != nil {
				t.Fatalf("receipt after the reorganisation: %+v", r)
			}
			if info, _ := w.chain.Tx(tx.Hash()); !info.Pooled || info.Mined {
				t.Fatalf("info %+v, want back in the pool", info)
			}
			if _, used := w.chain.AuthorizationUse(a.From, a.Nonce); used || w.chain.TokenBalance(w.payTo).Sign() != 0 {
				t.Fatal("the transfer survived the reorganisation")
			}
			again := w.chain.Mine()
			if r := receipt(t, w.node, tx.Hash()); r == nil || r.Status != 1 || r.BlockHash != again.Hash {
				t.Fatalf("receipt after mining again: %+v", r)
			}
		}},
		{ReorgDrop, func(t *testing.T, w *world, tx *types.Transaction, a facilitator.Authorization, old Block, branch []Block) {
			if info, _ := w.chain.Tx(tx.Hash()); info.Pooled || info.Mined || info.Fate != "dropped by a reorganisation" {
				t.Fatalf("info %+v", info)
			}
			if b := w.chain.Mine(); len(b.Txs) != 0 {
				t.Fatal("a dropped transaction was mined")
			}
			// Only a rebroadcast brings it back, and the pool takes it (its nonce is free again).
			w.mustSend(tx)
			w.chain.Mine()
			if r := receipt(t, w.node, tx.Hash()); r == nil || r.Status != 1 {
				t.Fatalf("receipt after the rebroadcast: %+v", r)
			}
		}},
		{ReorgReinclude, func(t *testing.T, w *world, tx *types.Transaction, a facilitator.Authorization, old Block, branch []Block) {
			r := receipt(t, w.node, tx.Hash())
			if r == nil || r.Status != 1 || r.BlockNumber.Uint64() != old.Number+1 || r.BlockHash != branch[1].Hash {
				t.Fatalf("receipt %+v, want success in the later block %s", r, branch[1].Hash)
			}
			if u, _ := w.chain.AuthorizationUse(a.From, a.Nonce); u.TxHash != tx.Hash() || u.BlockHash != branch[1].Hash {
				t.Fatalf("use %+v", u)
			}
		}},
		{ReorgConflictTransfer, func(t *testing.T, w *world, tx *types.Transaction, a facilitator.Authorization, old Block, branch []Block) {
			last := branch[len(branch)-1]
			if len(last.Txs) != 2 || last.Txs[1] != tx.Hash() {
				t.Fatalf("last block %+v, want the third party's transfer, then ours", last)
			}
			r := receipt(t, w.node, tx.Hash())
			if r == nil || r.Status != 0 || len(r.Logs) != 0 {
				t.Fatalf("ours %+v, want reverted", r)
			}
			u, ok := w.chain.AuthorizationUse(a.From, a.Nonce)
			if !ok || u.Kind != UseTransfer || u.Sender != w.chain.ThirdParty() || u.TxHash != last.Txs[0] {
				t.Fatalf("use %+v, want the third party's", u)
			}
			if w.chain.TokenBalance(w.payTo).Int64() != 5 {
				t.Fatalf("paid %s, want once", w.chain.TokenBalance(w.payTo))
			}
			if info, _ := w.chain.Tx(last.Txs[0]); info.Source != SourceThirdParty || info.Call == nil || info.Call.Kind != UseTransfer {
				t.Fatalf("conflict %+v", info)
			}
		}},
		{ReorgConflictCancel, func(t *testing.T, w *world, tx *types.Transaction, a facilitator.Authorization, old Block, branch []Block) {
			if r := receipt(t, w.node, tx.Hash()); r == nil || r.Status != 0 || len(r.Logs) != 0 {
				t.Fatalf("ours %+v, want reverted", r)
			}
			if u, ok := w.chain.AuthorizationUse(a.From, a.Nonce); !ok || u.Kind != UseCancel {
				t.Fatalf("use %+v, want a cancel", u)
			}
			var logs []types.Log
			filter := map[string]any{"fromBlock": "0x0", "toBlock": "latest", "address": w.chain.Token(),
				"topics": []any{nil, common.BytesToHash(a.From[:])}}
			if err := w.node.CallContext(context.Background(), &logs, "eth_getLogs", filter); err != nil {
				t.Fatal(err)
			}
			if len(logs) != 1 || logs[0].Topics[0] != eip3009.AuthorizationCanceledTopic {
				t.Fatalf("logs %+v, want only the cancel: no Transfer", logs)
			}
			if w.chain.TokenBalance(w.payTo).Sign() != 0 {
				t.Fatal("tokens moved")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			w := newWorld(t, ChainConfig{})
			w.chain.Mine()
			a := w.auth(1, 5)
			tx := w.sign(0, calldata(a), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
			w.mustSend(tx)
			w.clock.Advance(12e9)
			old := w.chain.Mine()
			w.clock.Advance(12e9)
			branch, err := w.chain.Reorg(1, tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.chain.Reorged(); len(got) != 1 || got[0].Hash != old.Hash {
				t.Fatalf("reorganised blocks %+v", got)
			}
			var h *types.Header
			if err := w.node.CallContext(context.Background(), &h, "eth_getBlockByHash", old.Hash, false); err != nil || h == nil {
				t.Fatalf("the old block by hash: %v %v (nodes keep side blocks)", h, err)
			}
			tt.check(t, w, tx, a, old, branch)
		})
	}
}

// TestReorgDepth: a reorganisation never removes a finalized block, and can replace several
// blocks with a shorter branch.
func TestReorgDepth(t *testing.T) {
	w := newWorld(t, ChainConfig{FinalizedDepth: 3})
	for range 5 {
		w.chain.Mine()
	}
	if _, err := w.chain.Reorg(4, ReorgToPool); !errors.Is(err, ErrReorgTooDeep) {
		t.Fatalf("below finalized: %v", err)
	}
	branch, err := w.chain.ReorgWith(ReorgSpec{Depth: 3, Length: 1})
	if err != nil || len(branch) != 1 || w.chain.Head().Number != 3 || w.chain.Head().Hash != branch[0].Hash {
		t.Fatalf("shorter branch %+v %v, head %+v", branch, err, w.chain.Head())
	}
}

// TestReorgKeepsFunding: a balance set by Fund at a block the reorganisation removes is kept on
// the new branch, as on anvil.
func TestReorgKeepsFunding(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	w.chain.Mine()
	other := common.HexToAddress("0x1234")
	w.chain.Fund(other, big.NewInt(77))
	w.chain.Mine()
	if _, err := w.chain.Reorg(2, ReorgToPool); err != nil {
		t.Fatal(err)
	}
	if b := w.chain.Balance(other); b.Int64() != 77 {
		t.Fatalf("balance %s after the reorganisation, want 77", b)
	}
}

// TestReorgTargets: a conflict policy conflicts only with the transfers it is told to.
func TestReorgTargets(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	mine, spared := w.auth(1, 5), w.auth(2, 6)
	tx1 := w.sign(0, calldata(mine), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	tx2 := w.sign(1, calldata(spared), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	w.mustSend(tx1)
	w.mustSend(tx2)
	w.chain.Mine()
	if _, err := w.chain.ReorgWith(ReorgSpec{Depth: 1, Policy: ReorgConflictTransfer, Targets: []common.Hash{tx1.Hash()}}); err != nil {
		t.Fatal(err)
	}
	if r := receipt(t, w.node, tx1.Hash()); r == nil || r.Status != 0 {
		t.Fatalf("targeted %+v, want reverted", r)
	}
	if r := receipt(t, w.node, tx2.Hash()); r == nil || r.Status != 1 {
		t.Fatalf("spared %+v, want mined", r)
	}
}
