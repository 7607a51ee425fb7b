package stacktest

import (
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Pay is a signed payment of Value from Payer to PayTo. It is a value: a test copies one and
// edits the copy to make a payment that differs in one field (the signature follows the fields).
type Pay struct {
	env         *Env
	Payer       *ecdsa.PrivateKey
	PayTo       common.Address
	Value       int64
	Nonce       [32]byte
	ValidBefore *big.Int
	ID          string // payment-identifier id, "" for none
	Resource    string // the resource URL the client paid for
}

// NewPay is a payment of value from payer to a fresh payTo, valid for an hour from the later of
// the wall clock and the chain's clock (the verifier checks validBefore against the first, the
// simulation against the second, and some tests move the chain's ahead).
func (e *Env) NewPay(t testing.TB, payer *ecdsa.PrivateKey, value int64) Pay {
	t.Helper()
	return Pay{env: e, Payer: payer, PayTo: NewAddress(t), Value: value, Nonce: Random32(t),
		ValidBefore: big.NewInt(e.TimeBase(t) + 3600), Resource: "http://merchant.test/paid"}
}

// From is the payer's address.
func (p Pay) From() common.Address { return AddressOf(p.Payer) }

// Key is the ledger's key for p's authorization.
func (p Pay) Key() facilitator.AuthorizationKey {
	return facilitator.AuthorizationKey{Network: p.env.Network().ID, Asset: p.env.Chain.USDC.Address, Payer: p.From(), Nonce: p.Nonce}
}

// Authorization is p's EIP-3009 transferWithAuthorization arguments.
func (p Pay) Authorization() devchain.TransferAuthorization {
	return devchain.TransferAuthorization{From: p.From(), To: p.PayTo, Value: big.NewInt(p.Value), ValidAfter: big.NewInt(0),
		ValidBefore: p.ValidBefore, Nonce: p.Nonce}
}

// Signature is the payer's EIP-712 signature of p's authorization.
func (p Pay) Signature(t testing.TB) []byte {
	t.Helper()
	sig, err := p.env.Chain.USDC.SignTransferAuthorization(p.Payer, p.Authorization())
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// Body is the /settle (or /verify) request for p, as the official client and resource server send
// it, with the payment-identifier extension when p has an ID.
func (p Pay) Body(t testing.TB) []byte {
	t.Helper()
	a, usdc := p.Authorization(), p.env.Chain.USDC
	reqs := map[string]any{"scheme": "exact", "network": p.env.Network().ID, "amount": a.Value.String(),
		"asset": usdc.Address.Hex(), "payTo": p.PayTo.Hex(), "maxTimeoutSeconds": 3600,
		"extra": map[string]any{"name": usdc.Name, "version": usdc.Version}}
	payload := map[string]any{
		"x402Version": 2, "accepted": reqs, "resource": map[string]any{"url": p.Resource},
		"payload": map[string]any{"signature": "0x" + hex.EncodeToString(p.Signature(t)), "authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value.String(), "validAfter": "0",
			"validBefore": a.ValidBefore.String(), "nonce": "0x" + hex.EncodeToString(p.Nonce[:])}}}
	if p.ID != "" {
		payload["extensions"] = map[string]any{facilitator.PaymentIdentifierKey: map[string]any{
			"info": map[string]any{"required": false, "id": p.ID}}}
	}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentRequirements": reqs, "paymentPayload": payload})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// Decode decodes a /settle or /verify request body, failing the test on an error.
func Decode(t testing.TB, body []byte) *facilitator.Payment {
	t.Helper()
	d, err := facilitator.DecodeRequest(body)
	if err != nil {
		t.Fatalf("decoding: %v", err)
	}
	return d
}

// SubmitElsewhere submits p's authorization from a dev account, as a third party would, with
// auto-mining on; it returns the transaction's hash.
func (p Pay) SubmitElsewhere(t testing.TB) common.Hash {
	t.Helper()
	a := p.Authorization()
	h, err := p.env.Chain.USDC.TransferWithAuthorization(context.Background(), p.env.Chain.Accounts[1], a.From, a.To, a.Value,
		a.ValidAfter, a.ValidBefore, a.Nonce, p.Signature(t))
	if err != nil {
		t.Fatalf("third-party transferWithAuthorization: %v", err)
	}
	return h
}

// SendElsewhere is SubmitElsewhere for a chain that is not auto-mining: it sends the third
// party's transaction and returns its hash at once, unmined; the test mines it.
func (p Pay) SendElsewhere(t testing.TB) common.Hash {
	t.Helper()
	tx := p.ElsewhereTx(t)
	if err := p.env.Chain.Client.SendTransaction(context.Background(), tx); err != nil {
		t.Fatalf("third-party transferWithAuthorization: %v", err)
	}
	return tx.Hash()
}

// ElsewhereTx is the third party's transferWithAuthorization of p's authorization (from the dev
// account SubmitElsewhere uses, at its next nonce), signed and not sent: SendElsewhere sends it,
// a test building a new branch of the chain places it (Reorg).
func (p Pay) ElsewhereTx(t testing.TB) *types.Transaction {
	t.Helper()
	a := p.Authorization()
	data := eip3009.TransferCalldata(facilitator.Authorization{From: a.From, To: a.To, Value: a.Value, ValidAfter: a.ValidAfter,
		ValidBefore: a.ValidBefore, Nonce: a.Nonce}, p.Signature(t))
	return p.env.signTx(t, p.env.Chain.Accounts[1], data)
}
