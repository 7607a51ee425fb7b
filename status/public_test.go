package status_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// TestPublicView: the public view of a settled payment is the full view's chain-visible fields
// (settled by us, the transaction, payer, payee, amount), found; of a payment whose transaction
// never left us (a signed row: someone asked us to settle it, nothing was sent), it is exactly the
// answer for a nonce nobody ever used: unused, from the chain, not found, no transaction, no
// payee, no amount; and by that row's transaction hash, not found, as for a hash not ours.
func TestPublicView(t *testing.T) {
	ctx := context.Background()
	svc := env.Status(env.DB, 2)

	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 31_000)
	p.ID = stacktest.RandomID(t)
	tx := env.NewEngine(t, stacktest.EngineOptions{}).MustSettle(t, p.Body(t)).Response.Transaction
	full, _, err := svc.Authorization(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	pub, found, err := svc.Public(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("public view of a settled payment: found %v, err %v", found, err)
	}
	if pub.View != facilitator.ViewPublic || pub.State != facilitator.StatusSettled || pub.SettledBy != "facilitator" ||
		pub.Transaction != tx || pub.To != p.PayTo.Hex() || pub.Value != "31000" || pub.Authorizer != p.From().Hex() {
		t.Fatalf("public view: %+v, want settled by us with %s", pub, tx)
	}
	full.Head, full.Confirmations = pub.Head, pub.Confirmations // read a moment apart
	if want := facilitator.PublicReceipt(full); !reflect.DeepEqual(want, pub) {
		t.Fatalf("public view %+v, want the full view's public fields %+v", pub, want)
	}
	byTx, err := svc.PublicSettlement(ctx, common.HexToHash(tx))
	if err != nil || byTx.Transaction != tx || byTx.State != facilitator.StatusSettled {
		t.Fatalf("public view by transaction: %+v %v", byTx, err)
	}

	// A row whose transaction never left us, beside a nonce nobody used.
	key, hash := insertRow(t, nil)
	if st, _, err := svc.Authorization(ctx, key); err != nil || st.State != facilitator.StatusPending || st.Transaction != hash.Hex() {
		t.Fatalf("the full view of the signed row: %+v %v, want pending with %s", st, err, hash)
	}
	unsent, found, err := svc.Public(ctx, key)
	if err != nil || found {
		t.Fatalf("public view of an unsent row: found %v, err %v; want not found", found, err)
	}
	unusedKey := env.NewPay(t, env.FundedPayer(t, 1), 1).Key()
	unused, found, err := svc.Public(ctx, unusedKey)
	if err != nil || found {
		t.Fatalf("public view of an unused nonce: found %v, err %v", found, err)
	}
	// The same answer but for the key's own fields and the head read.
	unsent.Asset, unsent.Authorizer, unsent.Nonce, unsent.Head, unsent.Finality = unused.Asset, unused.Authorizer, unused.Nonce, unused.Head, unused.Finality
	if !reflect.DeepEqual(unsent, unused) || unused.State != facilitator.StatusUnused || unused.Basis != "chain" {
		t.Fatalf("public view of an unsent row %+v, want what an unused nonce answers %+v", unsent, unused)
	}
	if _, err := svc.PublicSettlement(ctx, hash); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("public view by the unsent transaction: %v, want not found", err)
	}
	if _, err := svc.Settlement(ctx, hash); err != nil {
		t.Fatalf("full view by the unsent transaction: %v, want its answer", err)
	}
}

// TestPublicLedgerRule: the public view reads our ledger row once its transaction left us (a
// broadcast recorded, or the row's state says it was sent or mined), never before.
func TestPublicLedgerRule(t *testing.T) {
	for _, c := range []struct {
		state facilitator.State
		sent  bool
		want  bool
	}{
		{facilitator.StateSigned, false, false},
		{facilitator.StateSigned, true, true},
		{facilitator.StateBroadcast, false, true},
		{facilitator.StateMined, false, true},
		{facilitator.StateFinal, false, true},
		{facilitator.StateReverted, false, true},
		// Expired, canceled and settled elsewhere say nothing of whether ours was ever sent.
		{facilitator.StateExpired, false, false},
		{facilitator.StateExpired, true, true},
		{facilitator.StateCanceled, false, false},
		{facilitator.StateCanceled, true, true},
		{facilitator.StateSettledElsewhere, false, false},
		{facilitator.StateSettledElsewhere, true, true},
	} {
		if got := status.PublicLedger(c.state, c.sent); got != c.want {
			t.Errorf("publicLedger(%s, sent %v) = %v, want %v", c.state, c.sent, got, c.want)
		}
	}
}

// TestPublicViewSentNotSettled: once our transaction left us, the public view carries our own
// state of it: pending (broadcast, not mined) with its hash, and failed (mined and reverted) with
// our reason; each the full view's public fields.
func TestPublicViewSentNotSettled(t *testing.T) {
	ctx := context.Background()
	svc := env.Status(env.DB, 2)
	same := func(name string, key facilitator.AuthorizationKey, state string) facilitator.Receipt {
		t.Helper()
		full, _, err := svc.Authorization(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		pub, found, err := svc.Public(ctx, key)
		if err != nil || !found || pub.State != state {
			t.Fatalf("%s: public view %+v, found %v, err %v; want %s", name, pub, found, err, state)
		}
		full.Head, full.Confirmations, full.Finality = pub.Head, pub.Confirmations, pub.Finality
		if want := facilitator.PublicReceipt(full); !reflect.DeepEqual(want, pub) {
			t.Fatalf("%s: public view %+v, want the full view's public fields %+v", name, pub, want)
		}
		return pub
	}

	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 42_000)
	env.ManualMining(t)
	hash := env.NewEngine(t, stacktest.EngineOptions{Deadline: pendingDeadline}).SettlePending(t, p.Body(t))
	if pub := same("pending", p.Key(), facilitator.StatusPending); pub.Transaction != hash.Hex() || pub.Value != "42000" {
		t.Fatalf("pending: %+v, want %s", pub, hash)
	}
	env.SetAutomine(t, true)

	failed, reverted := revertedSettlement(t)
	if pub := same("failed", failed.Key(), facilitator.StatusFailed); pub.Transaction != reverted.Hex() || pub.Reason != facilitator.ReasonTransactionFailed {
		t.Fatalf("failed: %+v, want %s with our reason", pub, reverted)
	}
}
