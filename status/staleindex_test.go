package status_test

import (
	"context"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// An index whose indexer has not yet stepped past a reorg still holds the branch it replaced:
// its word that a use is in a block is no proof that the block is still the chain's, however deep
// its number (found by the simulator with the real indexer, seed 120: "final" for our transfer,
// reorganised away, the stale index agreeing with the stale mined row).
func TestStatusStaleIndexNotFinal(t *testing.T) {
	ctx := context.Background()
	const depth = 3
	ours := env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	theirs := env.NewPay(t, env.FundedPayer(t, 1_000_000), 200_000)
	out := env.SettleAndStop(t, ours.Body(t)) // nothing watches the row from here on
	elsewhere := theirs.SubmitElsewhere(t)
	first := min(env.Receipt(t, common.HexToHash(out.Response.Transaction)).BlockNumber.Uint64(),
		env.Receipt(t, elsewhere).BlockNumber.Uint64())

	ix := env.StartIndexer(t)
	env.WaitIndexed(t, env.Head(t))
	if err := ix.Stop(); err != nil { // down, or not yet stepped: the index keeps what it has
		t.Fatal(err)
	}
	for _, p := range []stacktest.Pay{ours, theirs} {
		if env.Use(t, p.Key()) == nil {
			t.Fatalf("the index has no use of %x before the reorg", p.Nonce[:4])
		}
	}
	env.Reorg(t, env.Head(t)-first+1) // both blocks, and any after them, replaced by empty ones
	for range depth {
		env.Mine(t)
	}
	if r := env.Row(t, ours.Key()); r.State != facilitator.StateMined {
		t.Fatalf("ledger: %+v, want the stale mined row", r)
	}
	svc := env.Status(env.DB, depth)
	for name, p := range map[string]stacktest.Pay{"ours (the ledger and the index agreeing)": ours, "theirs (from the index)": theirs} {
		st, _, err := svc.Authorization(ctx, p.Key())
		if err != nil {
			t.Fatal(err)
		}
		if st.Final {
			t.Errorf("%s: status of a transfer reorganised away, the index not past the reorg: %+v, want not final", name, st)
		}
	}
}
