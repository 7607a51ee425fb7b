package verify_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// fundedKey is a fresh key holding usdc of the token's units.
func fundedKey(t *testing.T, usdc int64) *ecdsa.PrivateKey {
	t.Helper()
	key := newKey(t)
	if err := chain.USDC.Mint(context.Background(), crypto.PubkeyToAddress(key.PublicKey), big.NewInt(usdc)); err != nil {
		t.Fatal(err)
	}
	return key
}

// paymentBy is a valid 1 USDC payment from key to payTo.
func paymentBy(t *testing.T, key *ecdsa.PrivateKey, payTo string) *payment {
	p := newPayment(t, 1)
	p.key, p.auth.From = key, crypto.PubkeyToAddress(key.PublicKey)
	p.auth.To, p.payTo = common.HexToAddress(payTo), payTo
	return p
}

// TestVerifyGroupedNotFundedByAnother: a caller's refused authorization, from a funded payer to
// an empty account X, and X's own payment go in one group of simulations, in that order. The
// first is refused for its recipient; X's payment is refused for X's balance (nothing), by
// Verify and by Settleable at a gas hint alike, as each is alone: the first's transfer, run in
// the group before it, does not fund it.
func TestVerifyGroupedNotFundedByAnother(t *testing.T) {
	groups := stacktest.NewSimGroups(chain.RPC)
	v := newVerifier(t, verify.Config{Readers: map[string]verify.Reader{network().ID: groups.Reader}})
	// A settle simulation estimates once per token; from then on it is a call at the hinted limit,
	// which goes in groups.
	if res, _ := settleable(t, v, newPayment(t, 1)); !res.IsValid {
		t.Fatalf("learning the gas hint: %s", res.InvalidReason)
	}

	for _, settling := range []bool{false, true} {
		name := "Verify"
		if settling {
			name = "Settleable"
		}
		t.Run(name, func(t *testing.T) { groupedNotFunded(t, v, groups, settling) })
	}
}

// groupedNotFunded is one round of TestVerifyGroupedNotFundedByAnother.
func groupedNotFunded(t *testing.T, v *verify.Verifier, groups *stacktest.SimGroups, settling bool) {
	x := newKey(t) // holds nothing
	merchant := randomAddress(t).Hex()
	funding := paymentBy(t, fundedKey(t, 1_000_000), crypto.PubkeyToAddress(x.PublicKey).Hex())
	funding.payTo = merchant // the requirements pay someone else: refused for its recipient
	own := paymentBy(t, x, merchant)

	// Decoded here: the callers run on goroutines of their own, which must not stop the test.
	decode := func(p *payment) *facilitator.Payment {
		pay, err := facilitator.DecodeRequest(p.body(t))
		if err != nil {
			t.Fatal(err)
		}
		return pay
	}
	first, fundingPay, ownPay := decode(newPayment(t, 2)), decode(funding), decode(own)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var fundingRes, ownRes facilitator.VerifyResponse
	var fundingErr, ownErr error
	var gas uint64
	groups.Group(t, func() {
		if res, err := v.Verify(ctx, first); err != nil || !res.IsValid {
			t.Errorf("first: %v %+v", err, res)
		}
	}, func() {
		fundingRes, fundingErr = v.Verify(ctx, fundingPay)
	}, func() {
		if settling {
			ownRes, gas, ownErr = v.Settleable(ctx, ownPay, chain.Accounts[0].Address)
		} else {
			ownRes, ownErr = v.Verify(ctx, ownPay)
		}
	})
	if fundingErr != nil || ownErr != nil {
		t.Fatalf("%v, %v", fundingErr, ownErr)
	}
	if fundingRes.IsValid || fundingRes.InvalidReason != facilitator.ReasonRecipientMismatch {
		t.Fatalf("the funding authorization: valid=%v reason=%s, want %s", fundingRes.IsValid, fundingRes.InvalidReason, facilitator.ReasonRecipientMismatch)
	}
	if ownRes.IsValid || ownRes.InvalidReason != facilitator.ReasonInsufficientBalance {
		t.Fatalf("X's own payment, X holding nothing: valid=%v reason=%s, want %s", ownRes.IsValid, ownRes.InvalidReason, facilitator.ReasonInsufficientBalance)
	}
	if gas != 0 {
		t.Fatalf("Settleable gave gas %d for an invalid payment", gas)
	}
}
