package reconcile_test

import (
	"context"
	"strings"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestReconcileIndexDoesNotCover: a mined settlement whose block the index does not hold (the
// index's cursor moved past it without indexing it, as an index started above the block or with
// a gap does) is not "gone": the chain still has its block. The job leaves it mined and, once
// the block is final, records it final, instead of reopening it on every run (each reopen a
// false "payment left the chain", and never final).
func TestReconcileIndexDoesNotCover(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 77_000)
	e := env.NewEngine(t, stacktest.EngineOptions{Depth: 10, Deadline: pendingDeadline * 20})
	out := e.MustSucceed(t, p.Body(t))
	e.Stop(ctx) // the engine no longer watches it
	row := env.Row(t, p.Key())
	if row.State != facilitator.StateMined {
		t.Fatalf("ledger row %s, want mined", row.State)
	}
	env.Mine(t)
	env.Mine(t)

	// The index moves past the settlement's block without its logs.
	network := env.Network().ID
	_, release, err := env.DB.Lead(ctx, network)
	if err != nil {
		t.Fatal(err)
	}
	old, hadCursor, err := env.DB.Cursor(ctx, network)
	if err != nil {
		t.Fatal(err)
	}
	head := env.BlockAt(t, "latest")
	top := facilitator.Block{Number: uint64(head.Number), Hash: head.Hash}
	if err := env.DB.Commit(ctx, network, facilitator.IndexBatch{Cursor: top}); err != nil {
		t.Fatal(err)
	}
	release()
	t.Cleanup(func() {
		// Back to where the index was, for the package's later tests (nothing was indexed above it).
		if !hadCursor {
			return
		}
		_, release, err := env.DB.Lead(ctx, network)
		if err != nil {
			t.Error(err)
			return
		}
		defer release()
		if err := env.DB.Commit(ctx, network, facilitator.IndexBatch{RollbackTo: &old, Cursor: old}); err != nil {
			t.Error(err)
		}
	})
	if env.Use(t, p.Key()) != nil {
		t.Fatal("the index holds the use")
	}

	j := jobs(t, 2, later)
	for range 3 { // every run: never reopened
		ch := runSettlements(t, j)
		if ch.Reopened != 0 {
			t.Fatalf("changes %+v: a settlement whose block the chain still holds was reopened", ch)
		}
	}
	row = env.Row(t, p.Key())
	if row.State != facilitator.StateFinal || row.TxHash.Hex() != out.Response.Transaction {
		t.Fatalf("ledger row %s %s, want final with %s", row.State, row.TxHash, out.Response.Transaction)
	}
	want := []string{"signed", "broadcast", "mined", "final"}
	if got := stacktest.States(env.Events(t, row.ID)); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("settlement events %v, want %v", got, want)
	}
}
