package reconcile_test

import (
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

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
