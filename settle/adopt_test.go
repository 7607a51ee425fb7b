package settle_test

import (
	"context"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestSettleAdoptsLostSettlement: the ledger loses a settlement's commits (a failover to an
// asynchronous standby, a restore) after its transaction mined. A restarted engine asked for the
// same payment again finds the authorization used by a transaction of its own key, adopts it
// and answers success with that transaction's hash: no terminal "nonce already used", nothing
// sent again, the payee paid once, and the key's next nonce follows the chain's.
func TestSettleAdoptsLostSettlement(t *testing.T) {
	first := env.NewEngine(t, stacktest.EngineOptions{})
	payer := env.FundedPayer(t, 2_000_000)
	p := env.NewPay(t, payer, 400_000)
	body := p.Body(t)
	out := first.MustSucceed(t, body)
	if err := first.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	env.LoseSettlements(t, out.SettlementID)
	if _, err := first.DB.SettlementByKey(context.Background(), p.Key()); err == nil {
		t.Fatal("the row is still there")
	}

	again := env.NewEngine(t, stacktest.EngineOptions{Signers: first.Signers})
	retry := again.MustSettle(t, body)
	if !retry.Response.Success || retry.Response.Transaction != out.Response.Transaction || !retry.Claimed {
		t.Fatalf("retry after the loss: %+v, want success with %s", retry.Response, out.Response.Transaction)
	}
	row := env.Row(t, p.Key())
	if !row.Adopted || !row.State.Succeeded() || row.TxHash.Hex() != out.Response.Transaction || !row.Delivered {
		t.Fatalf("adopted row %+v", row)
	}
	if rep := again.MustSettle(t, body); rep.Response.Success || rep.Response.ErrorReason != facilitator.ReasonAlreadySettled ||
		rep.Response.Transaction != out.Response.Transaction {
		t.Fatalf("a second retry: %+v", rep.Response)
	}
	if got := env.Balance(t, p.PayTo); got != 400_000 {
		t.Fatalf("payee holds %d, want 400000", got)
	}
	signer := crypto.PubkeyToAddress(first.Signer().PublicKey)
	if n := nonceOf(t, signer, "latest"); n != 1 {
		t.Fatalf("signer sent %d transactions, want 1", n)
	}
	// The key's next settlement takes the next nonce: no gap, no reuse.
	next := env.NewPay(t, payer, 100_000)
	if o := again.MustSucceed(t, next.Body(t)); env.Row(t, next.Key()).TxNonce != 1 {
		t.Fatalf("next settlement %+v at nonce %d, want 1", o.Response, env.Row(t, next.Key()).TxNonce)
	}
}

// TestSettleForeignUseStillFails: an authorization used by a transaction of a key that is not
// ours is still answered nonce_already_used, and nothing is adopted.
func TestSettleForeignUseStillFails(t *testing.T) {
	foreign := env.NewEngine(t, stacktest.EngineOptions{})
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 300_000)
	body := p.Body(t)
	out := foreign.MustSucceed(t, body)
	if err := foreign.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	env.LoseSettlements(t, out.SettlementID) // as if another facilitator had settled it

	ours := env.NewEngine(t, stacktest.EngineOptions{})
	res := ours.MustSettle(t, body)
	if res.Response.Success || res.Response.ErrorReason != facilitator.ReasonNonceAlreadyUsed {
		t.Fatalf("a foreign key's use: %+v, want nonce_already_used", res.Response)
	}
	if _, err := ours.DB.SettlementByKey(context.Background(), p.Key()); err == nil {
		t.Fatal("a foreign key's transaction was adopted")
	}
}
