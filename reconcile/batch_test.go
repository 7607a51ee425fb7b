package reconcile_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestReconcileBatchMemberFailed (issue 22, defect 1): a payer with funds for one payment pays
// the same payee the same amount twice; both go out in one batch, whose transaction succeeds
// while the second member's call reverts inside it. The process dies before it records either.
// The Settlements job must read the batch's receipt for each member's own call: the first is
// mined, the second is NOT (the receipt's status and the first member's Transfer, which has the
// same payer, payee and value, prove nothing for it). It was recorded as mined, and a retry was
// told success for a payment that was never made.
func TestReconcileBatchMemberFailed(t *testing.T) {
	ctx := context.Background()
	env.StartIndexer(t)
	payer := env.FundedPayer(t, 250_000)
	first := env.NewPay(t, payer, 250_000)
	second := env.NewPay(t, payer, 250_000)
	second.PayTo = first.PayTo
	bodies := [][]byte{first.Body(t), second.Body(t)}

	env.ManualMining(t)
	n := env.Network()
	n.Batch = facilitator.BatchPolicy{Max: 2, Wait: 2 * time.Second}
	e := env.NewEngine(t, stacktest.EngineOptions{Deadline: pendingDeadline, Network: &n})
	hashes := make([]common.Hash, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Add(1)
		go func() { defer wg.Done(); hashes[i] = e.SettlePending(t, b) }()
	}
	wg.Wait()
	if hashes[0] != hashes[1] {
		t.Fatalf("the two settlements went out as %s and %s, want one batch", hashes[0], hashes[1])
	}
	e.Stop(ctx) // the process dies with both in flight

	env.Mine(t)
	rc := env.Receipt(t, hashes[0])
	if rc == nil || rc.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("the batch's receipt: %+v, want status 1", rc)
	}
	env.WaitIndexed(t, rc.BlockNumber.Uint64())
	// The batch's order is the engine's: the member whose authorization it used is "paid".
	paid, failed := first, second
	if env.Use(t, first.Key()) == nil {
		paid, failed = second, first
	}
	if env.Use(t, paid.Key()) == nil || env.Use(t, failed.Key()) != nil {
		t.Fatalf("the batch used %v and %v; the scenario needs exactly one member's call to revert",
			env.Use(t, first.Key()), env.Use(t, second.Key()))
	}

	j := jobs(t, 64, later) // deep finality: a failure is not final for a long while
	runSettlements(t, j)
	if r := env.Row(t, paid.Key()); r.State != facilitator.StateMined || r.TxHash != hashes[0] || r.ErrorReason != "" {
		t.Fatalf("the paid member after the job: %+v, want mined by the batch", r)
	}
	r := env.Row(t, failed.Key())
	if r.State.Succeeded() {
		t.Fatalf("the member whose call reverted inside the batch, was recorded %s (%s)", r.State, r.ErrorReason)
	}
	// Once the chain is past any doubt it is the member's own failure, named as the batch's.
	for range 3 {
		env.Mine(t)
	}
	env.WaitIndexed(t, env.Head(t))
	runSettlements(t, jobs(t, 2, later))
	r = env.Row(t, failed.Key())
	if r.State != facilitator.StateReverted || r.ErrorReason != facilitator.ReasonBatchCallFailed {
		t.Fatalf("the failed member at depth 2: %+v, want reverted with %s", r, facilitator.ReasonBatchCallFailed)
	}
	st, _, err := env.Status(env.DB, 2).Authorization(ctx, failed.Key())
	if err != nil || st.State != facilitator.StatusFailed {
		t.Fatalf("the failed member's status: %+v %v, want failed", st, err)
	}
	if got := env.Balance(t, first.PayTo); got != 250_000 {
		t.Fatalf("payee holds %d, want exactly 250000 (paid once)", got)
	}
}
