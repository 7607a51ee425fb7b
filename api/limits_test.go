package api_test

import (
	"context"
	"math/big"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// retryAfter reads a response's Retry-After as whole seconds within (0, most].
func retryAfter(t *testing.T, r response, most int) int {
	t.Helper()
	n, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || n <= 0 || n > most {
		t.Fatalf("Retry-After %q, want whole seconds within (0, %d] (%s)", r.Header.Get("Retry-After"), most, r)
	}
	return n
}

// TestSettleWalletCap: past the wallet cap /settle answers 429 with Retry-After and an x402
// SettleResponse (success false, the reason, transaction "", network and payer), nothing is sent,
// and /verify says the same in advance.
func TestSettleWalletCap(t *testing.T) {
	s := newSettleStack(t, settleOptions{engine: func(c *settle.Config) {
		c.Limits = facilitator.Limits{WalletCapCount: 1, WalletWindow: time.Hour}
	}})
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	first, second := paymentFrom(t, key), paymentFrom(t, key)
	if err := chain.USDC.Mint(context.Background(), first.auth.From, new(big.Int).Mul(first.auth.Value, big.NewInt(2))); err != nil {
		t.Fatal(err)
	}
	if r := do(t, http.MethodPost, s.URL+"/verify", second.body(t)); r.Status != http.StatusOK {
		t.Fatalf("/verify under the cap: %s", r)
	}
	if r := s.settle(t, first.body(t)); r.Status != http.StatusOK {
		t.Fatalf("first settle: %s", r)
	}
	before := s.nonces(t)

	r := s.settle(t, second.body(t))
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("want 429, got %s", r)
	}
	retryAfter(t, r, 3600)
	res, keys := settlement(t, r)
	if res.Success || res.ErrorReason != facilitator.ReasonWalletCapExceeded || string(keys["transaction"]) != `""` ||
		res.Network != facilitator.CAIP2(chain.ChainID) || res.Payer != second.auth.From.Hex() {
		t.Fatalf("want success:false %s with transaction \"\", network and payer, got %s", facilitator.ReasonWalletCapExceeded, r)
	}
	if after := s.nonces(t); after != before {
		t.Fatalf("signer nonces %v -> %v: the refused settlement was sent", before, after)
	}
	if got := usdcOf(t, second.auth.To); got != 0 {
		t.Fatalf("the refused payment's payee holds %d", got)
	}

	vr := do(t, http.MethodPost, s.URL+"/verify", second.body(t))
	v, _ := verdict(t, vr)
	if vr.Status != http.StatusTooManyRequests || v.IsValid || v.InvalidReason != facilitator.ReasonWalletCapExceeded || v.Payer != second.auth.From.Hex() {
		t.Fatalf("/verify over the cap: want 429 isValid:false %s, got %s", facilitator.ReasonWalletCapExceeded, vr)
	}
	retryAfter(t, vr, 3600)
}

// TestSettleSignersUnfunded: when every signer is below its minimum balance /settle answers 503
// insufficient_signer_funds with Retry-After, and sends nothing.
func TestSettleSignersUnfunded(t *testing.T) {
	s := newSettleStack(t, settleOptions{engine: func(c *settle.Config) {
		c.SignerMinBalance = new(big.Int).Exp(big.NewInt(10), big.NewInt(30), nil) // more than any test signer holds
		c.BalanceInterval = 7 * time.Second
	}})
	p := fundedPayment(t)
	r := s.settle(t, p.body(t))
	if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") != "7" {
		t.Fatalf("want 503 with Retry-After 7, got %s (Retry-After %q)", r, r.Header.Get("Retry-After"))
	}
	res, _ := settlement(t, r)
	if res.Success || res.ErrorReason != facilitator.ReasonInsufficientSignerFunds || res.Transaction != "" {
		t.Fatalf("want %s, got %s", facilitator.ReasonInsufficientSignerFunds, r)
	}
	if n := s.nonces(t); n != [2]uint64{0, 0} {
		t.Fatalf("signer nonces %v: something was sent", n)
	}
}

// TestSettleKeyGasBudget: the API key a /settle came with is charged: a key whose budget cannot
// cover one settlement is refused with 429 gas_budget_exceeded, another key settles.
func TestSettleKeyGasBudget(t *testing.T) {
	s := newAuthStack(t)
	scopes := []facilitator.Scope{facilitator.ScopeVerify, facilitator.ScopeSettle}
	poor, poorID := newKey(t, s.DB, scopes)
	if err := s.DB.SetAPIKeyGasBudget(context.Background(), poorID, big.NewInt(1)); err != nil {
		t.Fatal(err)
	}
	rich, _ := newKey(t, s.DB, scopes)
	p := fundedPayment(t)
	body := p.body(t)

	r := doAuth(t, http.MethodPost, s.URL+"/settle", poor, body)
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("want 429, got %s", r)
	}
	retryAfter(t, r, 24*3600)
	res, _ := settlement(t, r)
	if res.Success || res.ErrorReason != facilitator.ReasonGasBudgetExceeded || res.Transaction != "" || res.Payer != p.auth.From.Hex() {
		t.Fatalf("want success:false %s, got %s", facilitator.ReasonGasBudgetExceeded, r)
	}
	if n := s.nonces(t); n != [2]uint64{0, 0} {
		t.Fatalf("signer nonces %v: the refused settlement was sent", n)
	}
	r = doAuth(t, http.MethodPost, s.URL+"/settle", rich, body)
	if res, _ := settlement(t, r); r.Status != http.StatusOK || !res.Success {
		t.Fatalf("another key: want success, got %s", r)
	}
}
