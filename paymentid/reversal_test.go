package paymentid_test

import (
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestReplayFollowsReversal: a success stored under a payment id, then a reorganisation takes
// the transfer away and the payer's cancel lands in its place. A replay of the id's request is
// answered as the settlement stands now, with the live answer's rule (the cancel), never the
// stored success: the merchant would serve an order nobody paid for, for the answer's window.
func TestReplayFollowsReversal(t *testing.T) {
	payer := env.FundedPayer(t, 1_000_000) // minted while anvil still mines
	p := newPay(t, payer, 10_000)
	body := p.Body(t)
	stacktest.ManualMining(t, env.Chain)
	const depth = 4
	r := newRig(t, rigOptions{deadline: time.Second, depth: depth})
	if out, err := r.settle(t, body); err != nil || out.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("first request, mining off: %+v %v; want settlement_pending", out.Response, err)
	}
	env.Mine(t)
	var won facilitator.SettleOutcome
	for limit := time.Now().Add(10 * time.Second); ; {
		out, err := r.settle(t, body)
		if err == nil && out.Response.Success {
			won = out
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("the id's retry after the block: %+v %v; want success", out.Response, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if again, err := r.settle(t, body); err != nil || !again.Response.Success || replayID(again.Response.Extensions) != p.ID {
		t.Fatalf("a replay before the reorganisation: %+v %v; want the stored success", again.Response, err)
	}

	// The block holding our transfer and the next are replaced by a branch with the payer's
	// cancel; ours is gone from the chain and the pool.
	env.Mine(t)
	env.Reorg(t, 2, stacktest.BranchTx{Tx: env.CancelTx(t, payer, p.Nonce), Block: 0})
	for range depth + 1 {
		env.Mine(t)
	}
	var row *facilitator.Settlement
	for limit := time.Now().Add(30 * time.Second); ; {
		if row = env.Row(t, p.Key()); !row.State.Open() && row.State != facilitator.StateMined && row.State != facilitator.StateFinal {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("ledger row %s %s after the reorganisation; want canceled", row.State, row.TxHash)
		}
		env.Mine(t)
		time.Sleep(100 * time.Millisecond)
	}
	if row.State != facilitator.StateCanceled {
		t.Fatalf("ledger row %s; want canceled", row.State)
	}

	out, err := r.settle(t, body)
	if err != nil {
		t.Fatal(err)
	}
	if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonNonceAlreadyUsed || replayID(out.Response.Extensions) != p.ID {
		t.Fatalf("a replay after the reversal: %+v; want nonce_already_used (canceled), replayed (the stored success named %s)",
			out.Response, won.Response.Transaction)
	}
	if v, err := r.verify(t, body); err != nil || v.IsValid {
		t.Fatalf("verify's replay after the reversal: %+v %v; want invalid", v, err)
	}
	if got := env.Balance(t, p.PayTo); got != 0 {
		t.Fatalf("payee holds %d, want nothing", got)
	}
}
