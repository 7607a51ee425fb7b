package settle_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestSettleNonceGapObserved: the signer key sends a transaction behind the engine's back, after
// the engine loaded its nonce; the engine's next transaction reuses that nonce, the node refuses
// it as nonce too low, and the observer hears a nonce gap for that network and key.
func TestSettleNonceGapObserved(t *testing.T) {
	ctx := context.Background()
	obs := &recordingObserver{}
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second,
		Config: func(c *settle.Config) { c.Observer = obs }})

	// Nonce 0, spent outside the engine (anvil mines it at once).
	tip := big.NewInt(1e9)
	head, err := env.Chain.Client.HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	sendSelfTransfer(t, signer, 0, tip, new(big.Int).Add(tip, new(big.Int).Mul(head.BaseFee, big.NewInt(2))))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if n, err := env.Chain.Client.NonceAt(ctx, addr, nil); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the outside transaction was not mined")
		}
	}
	if got := obs.count(gap(addr, settle.NonceUsed)); got != 0 {
		t.Fatalf("a gap observed before any send: %d", got)
	}

	p := env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	body := p.Body(t)
	out := r.MustSettle(t, body)
	obs.await(t, gap(addr, settle.NonceUsed), 1, 10*time.Second)
	// The nonce went to a transaction that is not ours: the settlement is re-signed with the next
	// one, and settles.
	for deadline := time.Now().Add(10 * time.Second); !out.Response.Success; time.Sleep(100 * time.Millisecond) {
		if out.Response.ErrorReason != facilitator.ReasonSettlementPending || time.Now().After(deadline) {
			t.Fatalf("after the foreign transaction: %+v", out.Response)
		}
		if out, err = r.SettleBody(ctx, t, body); err != nil {
			t.Fatal(err)
		}
	}
	if got := env.Row(t, p.Key()).TxNonce; got != 1 {
		t.Fatalf("ledger tx nonce %d, want 1 (0 is the foreign transaction's)", got)
	}
	if got := obs.count(gap(addr, settle.NonceForeign)); got != 1 {
		t.Fatalf("foreign nonce observed %d times, want 1", got)
	}
}
