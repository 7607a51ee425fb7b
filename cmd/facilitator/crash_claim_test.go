package main

import (
	"context"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// TestCrashAfterClaim: the real binary is killed with SIGKILL after the waiting caller's success
// was claimed (written with the mined outcome) and before its answer was written. Nobody was told
// success, so the claim must not count (invariant 4): after a restart the merchant's retries of
// the same payload wait for the undecided claim and are told settlement_pending while the dead
// claim's lease runs (never already_settled), the next one after it gets success: true with the
// transaction, and only then is the success answered, once.
func TestCrashAfterClaim(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	h := newCrashHarness(ctx, t)
	// Long enough that the restarted process's first retries fall inside the dead claim's lease
	// on a loaded machine; the retries wait on the ledger, not on this number. A retry waits for
	// the undecided claim within the settle timeout, then is told pending: a short one makes
	// several retries fall inside the lease.
	h.env["FACILITATOR_CLAIM_LEASE"] = "20s"
	h.env["FACILITATOR_SETTLE_TIMEOUT"] = "3s"
	pay := h.newPayment(ctx, t, 34_567)
	payerBefore, payeeBefore := h.balance(ctx, t, pay.payer.Address), h.balance(ctx, t, pay.payee)
	nonceBefore := h.nonce(ctx, t, false)

	// 1. The process dies between the claim and the answer.
	first := h.start(ctx, t, "crashing process", string(settle.FaultAfterClaim))
	if res, status, err := first.settle(pay.body); err == nil {
		t.Fatalf("the process set to die after the claim answered %d %+v", status, res)
	}
	first.waitKilled(t, 15*time.Second)

	// 2. What it left: the transfer mined, and its success claimed, unconfirmed, under a lease.
	row, err := h.db.SettlementByKey(ctx, pay.key)
	if err != nil {
		t.Fatalf("no ledger row after the crash: %v", err)
	}
	if !row.State.Succeeded() || !row.Delivered || row.TxHash == (common.Hash{}) {
		t.Fatalf("ledger row after the crash: %+v; want mined with the dead caller's claim recorded", row)
	}
	conn, err := pgx.Connect(ctx, h.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	leased := func() bool {
		t.Helper()
		var live bool
		if err := conn.QueryRow(ctx, `SELECT COALESCE(success_lease_until > now(), false) FROM settlements WHERE id = $1`, row.ID).Scan(&live); err != nil {
			t.Fatal(err)
		}
		return live
	}
	var unconfirmed bool
	if err := conn.QueryRow(ctx, `SELECT success_lease_until IS NOT NULL FROM settlements WHERE id = $1`, row.ID).Scan(&unconfirmed); err != nil || !unconfirmed {
		t.Fatalf("the dead caller's claim is confirmed (%v, %v): nobody was told success", unconfirmed, err)
	}

	// 3. The merchant retries through a restarted process until it is told the outcome.
	second := h.start(ctx, t, "restarted process", "")
	var final facilitator.SettleResponse
	inLease, attempts := 0, 0
	for deadline := time.Now().Add(60 * time.Second); ; {
		attempts++
		before := leased()
		res, status, err := second.settle(pay.body)
		if err != nil {
			t.Fatalf("retry %d: %v", attempts, err)
		}
		after := leased()
		if status == http.StatusOK && res.Success {
			final = res
			break
		}
		if status != http.StatusOK || res.ErrorReason != facilitator.ReasonSettlementPending {
			t.Fatalf("retry %d (the dead claim's lease live: %v): %d %+v; want settlement_pending until the success", attempts, before, status, res)
		}
		if before && after {
			inLease++
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry %d: still no success after 60 s: %+v", attempts, res)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if inLease == 0 {
		t.Fatal("no retry fell inside the dead claim's lease: the undecided window was not exercised")
	}
	if hash := common.HexToHash(final.Transaction); hash != row.TxHash {
		t.Fatalf("the retry's success names %s, the ledger's transaction is %s", hash, row.TxHash)
	}

	// 4. One transfer, one transaction; the success now counts, and is not answered again.
	if got := h.balance(ctx, t, pay.payee); new(big.Int).Sub(got, payeeBefore).Cmp(pay.value) != 0 {
		t.Fatalf("payee balance went from %s to %s, want +%s exactly once", payeeBefore, got, pay.value)
	}
	if got := h.balance(ctx, t, pay.payer.Address); new(big.Int).Sub(payerBefore, got).Cmp(pay.value) != 0 {
		t.Fatalf("payer balance went from %s to %s, want -%s exactly once", payerBefore, got, pay.value)
	}
	if latest := h.nonce(ctx, t, false); latest != nonceBefore+1 {
		t.Fatalf("signer nonce went from %d to %d, want exactly one transaction", nonceBefore, latest)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err := conn.QueryRow(ctx, `SELECT success_lease_until IS NOT NULL FROM settlements WHERE id = $1`, row.ID).Scan(&unconfirmed); err != nil {
			t.Fatal(err)
		}
		if !unconfirmed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the written success's claim is not confirmed 30 s later")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if row, err = h.db.SettlementByKey(ctx, pay.key); err != nil || !row.Delivered || row.ClaimTakeovers != 1 {
		t.Fatalf("ledger row after the success: %+v, %v; want delivered, the dead claim's takeover counted once", row, err)
	}
	again, status, err := second.settle(pay.body)
	if err != nil || status != http.StatusOK || again.Success || again.ErrorReason != facilitator.ReasonAlreadySettled ||
		common.HexToHash(again.Transaction) != row.TxHash {
		t.Fatalf("a repeat after the success: %d %+v %v; want already_settled with %s", status, again, err, row.TxHash)
	}
	second.stop(t)
	t.Logf("after-claim: %d retries (%d inside the dead claim's lease, all settlement_pending), then success with %s; %s",
		attempts, inLease, row.TxHash.Hex()[:10], time.Since(began).Round(time.Millisecond))
}
