package paymentid_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestConflictResource: an id paid for one resource, sent again with the same signed payment for
// another resource (the same price and payee), is payment_identifier_conflict from /settle and
// /verify (409 over HTTP) naming the resource; nothing is sent; the id still replays for its own
// resource.
func TestConflictResource(t *testing.T) {
	r := newRig(t, rigOptions{})
	url := r.url
	first := newPay(t, env.FundedPayer(t, 1_000_000), 100_000)
	out, err := r.settle(t, first.Body(t))
	if err != nil || !out.Response.Success {
		t.Fatalf("first settle: %+v %v", out.Response, err)
	}
	other := first
	other.Resource = "http://merchant.test/another-route"
	body := other.Body(t)
	sent := r.nonces(t)

	_, err = r.settle(t, body)
	checkConflict(t, "settle", err, []string{"resource"})
	_, err = r.verify(t, body)
	checkConflict(t, "verify", err, []string{"resource"})
	for _, path := range []string{"/settle", "/verify"} {
		if hr := post(t, url+path, body); hr.Status != http.StatusConflict || hr.Header.Get(facilitator.ReplayHeader) != "" {
			t.Fatalf("%s: want 409, got %d %s", path, hr.Status, hr.Body)
		}
	}
	if n := r.nonces(t); n != sent {
		t.Fatalf("signer nonces %v -> %v: the conflicting request sent something", sent, n)
	}

	again, err := r.settle(t, first.Body(t))
	if err != nil || !again.Response.Success || again.Response.Transaction != out.Response.Transaction || replayID(again.Response.Extensions) != first.ID {
		t.Fatalf("same id, same resource: %+v %v; want the success with %s replayed", again.Response, err, out.Response.Transaction)
	}
	if v, err := r.verify(t, first.Body(t)); err != nil || !v.IsValid || replayID(v.Extensions) != first.ID {
		t.Fatalf("verify, same id, same resource: %+v %v; want valid, a replay", v, err)
	}
}

// blindOnce is the id store with its first lookup answering "no such id": a request that looked
// the id up just before a concurrent one bound it.
type blindOnce struct {
	paymentid.Store
	looked atomic.Int64
}

func (b *blindOnce) PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error) {
	if b.looked.Add(1) == 1 {
		return nil, facilitator.ErrNotFound
	}
	return b.Store.PaymentID(ctx, scope, id)
}

// TestConflictResourceRace: a request for another resource under the same id that passed the
// lookup before the first request bound the id follows the first's settlement; even when it is
// the one that claims the success, it is answered the conflict, and the id's own request gets the
// success (a replay). One transfer, and one caller told success.
func TestConflictResourceRace(t *testing.T) {
	first := newPay(t, env.FundedPayer(t, 1_000_000), 100_000) // minted while anvil still mines
	stacktest.ManualMining(t, env.Chain)
	r := newRig(t, rigOptions{deadline: time.Second})
	pending, err := r.settle(t, first.Body(t))
	if err != nil || pending.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("first request on a slow chain: %+v %v; want settlement_pending", pending.Response, err)
	}
	hash := pending.Response.Transaction
	env.Mine(t)

	racer := paymentid.New(paymentid.Config{Store: &blindOnce{Store: r.db}, Settler: r.engine, Verifier: r.verifier, Logger: stacktest.Logger(t)})
	other := first
	other.Resource = "http://merchant.test/another-route"
	out, err := racer.Settle(context.Background(), stacktest.Decode(t, other.Body(t)))
	if err == nil {
		t.Fatalf("another resource under the id: %+v (claimed %v); want payment_identifier_conflict", out.Response, out.Claimed)
	}
	checkConflict(t, "settle", err, []string{"resource"})

	mine, err := r.settle(t, first.Body(t))
	if err != nil || !mine.Response.Success || mine.Response.Transaction != hash || replayID(mine.Response.Extensions) != first.ID {
		t.Fatalf("the id's own retry: %+v %v; want the success with %s, replayed", mine.Response, err, hash)
	}
	if got := env.Balance(t, first.PayTo); got != first.Value {
		t.Fatalf("payee holds %d, want %d once", got, first.Value)
	}
}

// TestLegacyBinding: an id bound before ids covered the resource (to the settlement's fingerprint,
// with no resource in its summary), whose settlement was still in flight at the upgrade, is
// answered to its honest retry; such an id stays bound to the payment alone, and another payment
// under it is still a conflict.
func TestLegacyBinding(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000_000) // minted while anvil still mines
	p := newPay(t, payer, 100_000)
	stacktest.ManualMining(t, env.Chain)
	r := newRig(t, rigOptions{deadline: time.Second})
	pending, err := r.settle(t, p.Body(t))
	if err != nil || pending.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("first request on a slow chain: %+v %v; want settlement_pending", pending.Response, err)
	}
	// What the binding looked like before the upgrade.
	tag, err := env.Pool.Exec(ctx, `UPDATE payment_ids p SET fingerprint = s.fingerprint, summary = p.summary - 'resource'
		FROM settlements s WHERE s.id = p.settlement_id AND p.scope = '' AND p.id = $1`, p.ID)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("rewriting the binding: %v (%d rows)", err, tag.RowsAffected())
	}
	if rec := r.record(t, p.ID); rec.Fingerprint != stacktest.Decode(t, p.Body(t)).Fingerprint() {
		t.Fatal("the binding was not rewritten")
	}
	env.Mine(t)

	out, err := r.settle(t, p.Body(t))
	if err != nil || !out.Response.Success || out.Response.Transaction != pending.Response.Transaction {
		t.Fatalf("the honest retry after the upgrade: %+v %v; want the success with %s", out.Response, err, pending.Response.Transaction)
	}
	elsewhere := p
	elsewhere.Resource = "http://merchant.test/another-route"
	if out, err := r.settle(t, elsewhere.Body(t)); err != nil || !out.Response.Success || replayID(out.Response.Extensions) != p.ID {
		t.Fatalf("another resource under a legacy id: %+v %v; want a replay (the old binding never covered it)", out.Response, err)
	}
	another := newPay(t, payer, 100_000)
	another.ID = p.ID
	if _, err := r.settle(t, another.Body(t)); facilitator.ErrorReason(err, "") != facilitator.ReasonPaymentIdentifierConflict {
		t.Fatalf("another payment under a legacy id: %v; want payment_identifier_conflict", err)
	}
	if _, err := r.db.SettlementByKey(ctx, another.Key()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("the conflicting authorization has a ledger row: %v", err)
	}
}

// blindThenDown is the id store with its first lookup answering "no such id" and every later one
// failing: the id was bound by a concurrent request, and its record cannot be read back.
type blindThenDown struct {
	paymentid.Store
	looked atomic.Int64
}

func (b *blindThenDown) PaymentID(context.Context, string, string) (*facilitator.PaymentIDRecord, error) {
	if b.looked.Add(1) == 1 {
		return nil, facilitator.ErrNotFound
	}
	return nil, errors.New("connection refused")
}

// TestConflictUnreadable: a payment whose id was bound to another since its lookup is the
// conflict, counted, and nothing is sent, even when the binding cannot be read back to say what
// differs.
func TestConflictUnreadable(t *testing.T) {
	r := newRig(t, rigOptions{})
	ctx := context.Background()
	a := newPay(t, env.FundedPayer(t, 1_000_000), 100_000)
	if out, err := r.settle(t, a.Body(t)); err != nil || !out.Response.Success {
		t.Fatalf("the id's first payment: %+v %v", out.Response, err)
	}
	b := newPay(t, env.FundedPayer(t, 1_000_000), 200_000)
	b.ID = a.ID
	before := r.nonces(t)
	racer := paymentid.New(paymentid.Config{Store: &blindThenDown{Store: r.db}, Settler: r.engine, Verifier: r.verifier, Logger: stacktest.Logger(t)})
	_, err := racer.Settle(ctx, stacktest.Decode(t, b.Body(t)))
	if facilitator.ErrorCode(err) != facilitator.EConflict || facilitator.ErrorReason(err, "") != facilitator.ReasonPaymentIdentifierConflict ||
		!errors.Is(err, facilitator.ErrPaymentIDTaken) {
		t.Fatalf("another payment under a bound id: %v; want a payment_identifier_conflict from the ledger insert", err)
	}
	if conflicts, _ := racer.Counts(); conflicts != 1 {
		t.Fatalf("%d conflicts counted, want 1", conflicts)
	}
	if n := r.nonces(t); n != before {
		t.Fatalf("signer nonces %v -> %v: the conflicting payment was sent", before, n)
	}
	if _, err := r.db.SettlementByKey(ctx, b.Key()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("the conflicting authorization has a ledger row: %v", err)
	}
}

// TestRacerLeavesStoredSuccess: the id's own request settles and its success is stored; a request
// for the same payment and another resource, which looked the id up before it was bound, is
// answered the conflict and stores nothing under the id: the first request's retry after a lost
// answer still replays its success (a stored answer is written only by the request bound to it).
func TestRacerLeavesStoredSuccess(t *testing.T) {
	first := newPay(t, env.FundedPayer(t, 1_000_000), 100_000)
	r := newRig(t, rigOptions{})
	won, err := r.settle(t, first.Body(t))
	if err != nil || !won.Response.Success {
		t.Fatalf("the id's own request: %+v %v; want success", won.Response, err)
	}
	hash := won.Response.Transaction

	racer := paymentid.New(paymentid.Config{Store: &blindOnce{Store: r.db}, Settler: r.engine, Verifier: r.verifier, Logger: stacktest.Logger(t)})
	other := first
	other.Resource = "http://merchant.test/another-route"
	out, err := racer.Settle(context.Background(), stacktest.Decode(t, other.Body(t)))
	if err == nil {
		t.Fatalf("another resource under the id: %+v; want payment_identifier_conflict", out.Response)
	}
	checkConflict(t, "settle", err, []string{"resource"})

	again, err := r.settle(t, first.Body(t))
	if err != nil || !again.Response.Success || again.Response.Transaction != hash || replayID(again.Response.Extensions) != first.ID {
		t.Fatalf("the id's own retry after the racer: %+v %v; want the success with %s, replayed", again.Response, err, hash)
	}
	if got := env.Balance(t, first.PayTo); got != first.Value {
		t.Fatalf("payee holds %d, want %d once", got, first.Value)
	}
}
