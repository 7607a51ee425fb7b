package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestAllSignersRetiring: with every key of the network retiring, /settle is refused as
// signers_retiring (503, not a wait that passes) and nothing is signed, committed or sent; the
// keys report retiring. An address to retire that is none of the network's signers is refused
// when the engine is built: a typo must not leave a key taking settlements.
func TestAllSignersRetiring(t *testing.T) {
	a, b := env.NewSigner(t), env.NewSigner(t)
	addrA, addrB := crypto.PubkeyToAddress(a.PublicKey), crypto.PubkeyToAddress(b.PublicKey)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{a, b}, Config: func(c *settle.Config) {
		c.Networks[0].Retiring = []common.Address{addrA, addrB}
	}})
	ctx := context.Background()
	payer := env.FundedPayer(t, 10_000)
	pay := env.NewPay(t, payer, 1_000)
	sentA, sentB := nonceOf(t, addrA, "pending"), nonceOf(t, addrB, "pending")
	_, err := r.SettleBody(ctx, t, pay.Body(t))
	var fe *facilitator.Error
	if !errors.As(err, &fe) || fe.Code != facilitator.EUnavailable || fe.Reason != facilitator.ReasonSignersRetiring || !strings.Contains(fe.Message, "nothing was sent") {
		t.Fatalf("with every signer retiring: %v", err)
	}
	if nonceOf(t, addrA, "pending") != sentA || nonceOf(t, addrB, "pending") != sentB {
		t.Fatal("a transaction was sent with every signer retiring")
	}
	key := facilitator.AuthorizationKey{Network: env.Network().ID, Asset: env.Chain.USDC.Address, Payer: crypto.PubkeyToAddress(payer.PublicKey), Nonce: pay.Nonce}
	if _, err := r.DB.SettlementByKey(ctx, key); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("ledger row for the refused payment: %v", err)
	}
	for _, s := range r.Engine.Signers() {
		if !s.Retiring || s.Open != 0 {
			t.Errorf("signer %s: %+v, want retiring with nothing open", s.Address, s)
		}
	}

	stranger := common.HexToAddress("0x00000000000000000000000000000000000000aa")
	_, err = settle.New(settle.Config{Store: r.DB, Networks: []settle.NetworkConfig{{Network: env.Network(), Chain: env.Chain.RPC,
		Signers: []*ecdsa.PrivateKey{a}, Retiring: []common.Address{stranger}}}})
	if err == nil || !strings.Contains(err.Error(), "retires signer "+stranger.Hex()+", which is not one of its signers") {
		t.Fatalf("retiring an address that is not a signer: %v", err)
	}
}

// TestRetiringKeyDrains: a key retired while it has a settlement mined and not yet final (a
// reorg could still need it sent again) counts it open after the restart that retires it, settles
// the next payment with the other key, and reports nothing open once the settlement is final.
func TestRetiringKeyDrains(t *testing.T) {
	a, b := env.NewSigner(t), env.NewSigner(t)
	addrA, addrB := crypto.PubkeyToAddress(a.PublicKey), crypto.PubkeyToAddress(b.PublicKey)
	ctx := context.Background()
	payer := env.FundedPayer(t, 10_000)
	first := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{a}, Depth: 3})
	out, err := first.SettleBody(ctx, t, env.NewPay(t, payer, 1_000).Body(t))
	mustSucceed(t, out, err)
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{a, b}, Depth: 3, DB: first.DB, Config: func(c *settle.Config) {
		c.Networks[0].Retiring = []common.Address{addrA}
	}})
	health := func(addr common.Address) settle.SignerHealth {
		for _, s := range r.Engine.Signers() {
			if s.Address == addr {
				return s
			}
		}
		t.Fatalf("no signer %s", addr)
		return settle.SignerHealth{}
	}
	if s, err := r.DB.SettlementByID(ctx, out.SettlementID); err != nil || s.State != facilitator.StateMined {
		t.Fatalf("the first settlement: %+v, %v; want it mined, not final", s, err)
	}
	if h := health(addrA); !h.Retiring || !h.Leased || h.Open != 1 {
		t.Fatalf("the retiring key with a mined settlement not yet final: %+v, want 1 open", h)
	}
	next, err := r.SettleBody(ctx, t, env.NewPay(t, payer, 1_000).Body(t))
	mustSucceed(t, next, err)
	if s, err := r.DB.SettlementByID(ctx, next.SettlementID); err != nil || s.Signer != addrB {
		t.Fatalf("the next settlement: %+v, %v; want it on %s", s, err, addrB)
	}
	for deadline := time.Now().Add(20 * time.Second); health(addrA).Open != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the retiring key never drained: %+v", health(addrA))
		}
		env.Mine(t)
	}
	if s, err := r.DB.SettlementByID(ctx, out.SettlementID); err != nil || s.State != facilitator.StateFinal || s.Signer != addrA {
		t.Fatalf("the drained key's settlement: %+v, %v; want final, from %s", s, err, addrA)
	}
}
