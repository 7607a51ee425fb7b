package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// TestCrashWithPaymentID: the real binary is killed right after broadcasting a settlement made
// under a payment identifier; after a restart the id already resolves to that settlement (it was
// bound in the settlement's own statement), the retry with the same body gets the success with
// the transaction committed before the crash, there is exactly one transfer, and later retries
// under the id keep getting that success as a replay.
func TestCrashWithPaymentID(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	h := newCrashHarness(ctx, t)
	chain, signer, network := h.chain, h.signer, h.network

	pay := h.newPayment(ctx, t, 23_456)
	id := "crash_" + hex.EncodeToString(pay.nonce[:8])
	body := withPaymentID(t, pay.body, id)
	payerBefore, payeeBefore := h.balance(ctx, t, pay.payer.Address), h.balance(ctx, t, pay.payee)
	nonceBefore := h.nonce(ctx, t, false)

	// 1. The process dies right after the broadcast, before it answers.
	first := h.start(ctx, t, "crashing process", string(settle.FaultAfterBroadcast))
	if res, status, err := first.settle(body); err == nil {
		t.Fatalf("the process set to die after the broadcast answered %d %+v", status, res)
	}
	first.waitKilled(t, 15*time.Second)

	// 2. The crash left the settlement and, bound to it, the id; the transaction reached the node.
	row, err := h.db.SettlementByKey(ctx, pay.key)
	if err != nil {
		t.Fatalf("no ledger row after the crash: %v", err)
	}
	if !row.State.Open() || row.TxNonce != nonceBefore {
		t.Fatalf("ledger row after the crash: state %s tx nonce %d, want open with %d", row.State, row.TxNonce, nonceBefore)
	}
	rec, err := h.db.PaymentID(ctx, "", id)
	if err != nil {
		t.Fatalf("the payment id is not bound after the crash: %v", err)
	}
	if rec.Settlement.ID != row.ID || rec.Response != nil || rec.Summary["from"] != pay.payer.Address.Hex() {
		t.Fatalf("id record after the crash: settlement %d (want %d), stored answer %q, summary %v", rec.Settlement.ID, row.ID, rec.Response, rec.Summary)
	}
	var crashHash common.Hash
	open, err := h.db.OpenSettlements(ctx, network, signer)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range open {
		if o.ID == row.ID && len(o.Txs) == 1 {
			crashHash = o.Txs[0].Hash
		}
	}
	if crashHash == (common.Hash{}) {
		t.Fatalf("the crashed settlement %d has no single signed transaction among %d open", row.ID, len(open))
	}
	if pending := h.nonce(ctx, t, true); pending != nonceBefore+1 {
		t.Fatalf("the signer's pending nonce is %d after the crash, want %d", pending, nonceBefore+1)
	}

	// 3. Restart; the merchant retries the same body, same id.
	second := h.start(ctx, t, "restarted process", "")
	final, attempts, waits := retryUntilSuccess(t, second, body, facilitator.ReasonSettlementPending, facilitator.ReasonPaymentInFlight)
	hash := common.HexToHash(final.Transaction)
	if hash != crashHash || final.Network != network || !strings.EqualFold(final.Payer, pay.payer.Address.Hex()) {
		t.Fatalf("success answer %+v; want the transaction committed before the crash %s", final, crashHash)
	}
	firstReplay := facilitator.IsReplay(final.Extensions)

	// 4. One transfer, one transaction; the ledger and the id agree with the chain.
	if got := h.balance(ctx, t, pay.payee); new(big.Int).Sub(got, payeeBefore).Cmp(pay.value) != 0 {
		t.Fatalf("payee balance went from %s to %s, want +%s exactly once", payeeBefore, got, pay.value)
	}
	if got := h.balance(ctx, t, pay.payer.Address); new(big.Int).Sub(payerBefore, got).Cmp(pay.value) != 0 {
		t.Fatalf("payer balance went from %s to %s, want -%s exactly once", payerBefore, got, pay.value)
	}
	if latest, pending := h.nonce(ctx, t, false), h.nonce(ctx, t, true); latest != nonceBefore+1 || pending != latest {
		t.Fatalf("signer nonce went from %d to latest %d / pending %d, want exactly one transaction", nonceBefore, latest, pending)
	}
	rcpt, err := chain.Client.TransactionReceipt(ctx, hash)
	if err != nil || rcpt.Status != 1 {
		t.Fatalf("receipt of %s: %v %+v", hash, err, rcpt)
	}
	row, err = h.db.SettlementByKey(ctx, pay.key)
	if err != nil {
		t.Fatal(err)
	}
	if !row.State.Succeeded() || row.TxHash != hash || row.BlockNumber != rcpt.BlockNumber.Uint64() || !row.Delivered {
		t.Fatalf("ledger row after recovery: %+v; want mined/final with %s in block %d, delivered", row, hash, rcpt.BlockNumber)
	}
	rec, err = h.db.PaymentID(ctx, "", id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Settlement.ID != row.ID || !rec.Settlement.State.Succeeded() || rec.Settlement.TxHash != hash || rec.Response == nil {
		t.Fatalf("id after recovery: settlement %d state %s tx %s stored %q; want %d mined/final with %s and the answer stored",
			rec.Settlement.ID, rec.Settlement.State, rec.Settlement.TxHash, rec.Response, row.ID, hash)
	}

	// 5. Under the id, a later retry is the same success, a replay; without it, already_settled.
	again, status, err := second.settle(body)
	if err != nil || status != http.StatusOK || !again.Success || common.HexToHash(again.Transaction) != hash || !facilitator.IsReplay(again.Extensions) {
		t.Fatalf("a retry under the id after the success: %d %+v %v; want the success with %s, replayed", status, again, err, hash)
	}
	plain, status, err := second.settle(pay.body)
	if err != nil || status != http.StatusOK || plain.Success || plain.ErrorReason != facilitator.ReasonAlreadySettled || common.HexToHash(plain.Transaction) != hash {
		t.Fatalf("the same payment without the id: %d %+v %v; want already_settled with %s", status, plain, err, hash)
	}
	second.stop(t)
	t.Logf("after-broadcast with payment id: retry answered success after %d attempt(s) (%d pending/in flight); replay-marked %v; tx %s %s; %s",
		attempts, waits, firstReplay, hash.Hex()[:10], row.State, time.Since(began).Round(time.Millisecond))
}

// withPaymentID adds the payment-identifier extension with id to a /settle body.
func withPaymentID(t *testing.T, body []byte, id string) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	doc["paymentPayload"].(map[string]any)["extensions"] = map[string]any{
		facilitator.PaymentIdentifierKey: map[string]any{"info": map[string]any{"required": false, "id": id}}}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
