package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// An index whose indexer has not yet stepped past a reorg (down meanwhile) still holds the branch
// it replaced: its word that our transaction is in a block the chain's finalized tag covers is no
// proof that the block is still the chain's, and the job must not mark the row final on it (found
// by the simulator with the real indexer, seed 237 of a world whose indexer's provider split
// batches). By depth alone the index counts from its own head, which a reorg inside the rule
// cannot make final.
func TestReconcileStaleIndexNotFinal(t *testing.T) {
	const depth = 3
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	out := env.SettleAndStop(t, p.Body(t)) // nothing watches the row from here on
	rc := env.Receipt(t, common.HexToHash(out.Response.Transaction))

	ix := env.StartIndexer(t)
	env.WaitIndexed(t, env.Head(t))
	if err := ix.Stop(); err != nil { // down, or not yet stepped: the index keeps what it has
		t.Fatal(err)
	}
	if u := env.Use(t, p.Key()); u == nil || u.BlockHash != rc.BlockHash {
		t.Fatalf("the index's use before the reorg: %+v, want block %s", u, rc.BlockHash)
	}
	env.Reorg(t, env.Head(t)-rc.BlockNumber.Uint64()+1) // our block, and any after it, replaced by empty ones
	for range 65 {                                      // anvil's finalized block is 64 below its head: past the replaced block
		env.Mine(t)
	}
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined || r.BlockHash != rc.BlockHash {
		t.Fatalf("ledger: %+v, want the stale mined row", r)
	}
	j := reconcile.New(reconcile.Config{
		Store:      env.DB,
		Networks:   []reconcile.Network{{Network: network(facilitator.Finality{Tag: facilitator.TagFinalized, Depth: depth}), Chain: env.Chain.RPC}},
		StaleAfter: time.Minute, Now: later, Logger: stacktest.Logger(t),
	})
	// Twice: one tag answer alone decides nothing (facilitator.FinalityFloor).
	runSettlements(t, j)
	runSettlements(t, j)
	if r := env.Row(t, p.Key()); r.State == facilitator.StateFinal {
		t.Fatalf("ledger: %+v, final with its transfer reorganised away", r)
	}
}

// An index not yet past a reorg that moved our transaction to another block still has the use in
// the block the reorg replaced. The engine followed the reorg (the row is mined in the new block):
// the job must not move the row back to the replaced block on the index's word, nor resolve an
// open row mined there. Moving it back (a stale index's resolution, then the engine's finality
// judgement of its own block marking the row final) answered a payment's status final in a block
// without its transfer: simulator seed 4359.
func TestReconcileStaleIndexKeepsTheNewBlock(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	out := env.SettleAndStop(t, p.Body(t))
	hash := common.HexToHash(out.Response.Transaction)
	first := env.Receipt(t, hash)
	ix := env.StartIndexer(t)
	env.Mine(t)
	env.WaitIndexed(t, env.Head(t))
	if err := ix.Stop(); err != nil {
		t.Fatal(err)
	}
	var ours types.Transaction
	if err := ours.UnmarshalBinary(rawTx(t, hash)); err != nil {
		t.Fatal(err)
	}
	b := first.BlockNumber.Uint64()
	env.Reorg(t, env.Head(t)-b+1, stacktest.BranchTx{Tx: &ours, Block: 1}) // ours moves to block b+1
	moved := env.Receipt(t, hash)
	if u := env.Use(t, p.Key()); u == nil || u.BlockHash != first.BlockHash || moved.BlockHash == first.BlockHash {
		t.Fatalf("the index's use %+v, the chain's receipt in %d %s: want the stale index at %d %s", u, moved.BlockNumber, moved.BlockHash, b, first.BlockHash)
	}
	j := reconcile.New(reconcile.Config{
		Store:      env.DB,
		Networks:   []reconcile.Network{{Network: network(facilitator.Finality{Depth: 3}), Chain: env.Chain.RPC}},
		StaleAfter: time.Minute, Now: later, Logger: stacktest.Logger(t),
	})

	// The engine followed the reorg: the row is mined in the new block.
	id := env.Row(t, p.Key()).ID
	if err := env.DB.Reopen(ctx, facilitator.MinedIn{ID: id, BlockHash: first.BlockHash}, "reorganised"); err != nil {
		t.Fatal(err)
	}
	now := facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: hash, BlockNumber: moved.BlockNumber.Uint64(), BlockHash: moved.BlockHash}
	if _, _, err := env.DB.Resolve(ctx, []facilitator.Resolution{now}); err != nil {
		t.Fatal(err)
	}
	runSettlements(t, j)
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined || r.BlockHash != moved.BlockHash {
		t.Fatalf("ledger after the job: %+v, want mined in the new block %d %s, not the replaced %d", r, moved.BlockNumber, moved.BlockHash, b)
	}

	// The row open again (the engine saw the reorg, not yet where ours went): the chain's receipt
	// decides, not the stale index.
	if err := env.DB.Reopen(ctx, facilitator.MinedIn{ID: id, BlockHash: moved.BlockHash}, "reorganised"); err != nil {
		t.Fatal(err)
	}
	runSettlements(t, j)
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined || r.BlockHash != moved.BlockHash {
		t.Fatalf("ledger after the job on the open row: %+v, want mined in the new block %d %s, not the replaced %d", r, moved.BlockNumber, moved.BlockHash, b)
	}
}
