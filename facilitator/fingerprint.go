package facilitator

import (
	"strconv"
	"strings"

	"github.com/ethereum/go-ethereum/crypto"
)

// Fingerprint is the canonical identity of what a request asks: who pays whom how much under
// which signed authorization. Two requests with the same fingerprint are the same payment,
// whatever their JSON spelling (key order, address case, unknown fields, resource text).
//
// It is keccak256 of these fields joined by "\n", each in canonical form (checksummed addresses,
// decimal amounts without leading zeros, lower-case 0x-hex for bytes):
//
//	x402-fingerprint-v1
//	requirements: scheme, network (CAIP-2 or v1 name as sent), asset, amount, payTo
//	authorization: from, to, value, validAfter, validBefore, nonce
//	signature (as sent, ERC-6492 wrapper included)
//	x402Version
//
// Settlement rows keep it to tell a retry of the request that made them from someone else's
// request for the same authorization, so it must never change for a payment already in the
// ledger: what else a payment id is bound to goes into IDFingerprint instead.
type Fingerprint [32]byte

// Fingerprint computes p's fingerprint.
func (p *Payment) Fingerprint() Fingerprint {
	r, a := p.Requirements, p.Authorization
	parts := []string{
		"x402-fingerprint-v1",
		r.Scheme, r.Network, r.Asset.Hex(), r.Amount.String(), r.PayTo.Hex(),
		a.From.Hex(), a.To.Hex(), a.Value.String(), a.ValidAfter.String(), a.ValidBefore.String(),
		hexBytes(a.Nonce[:]),
		hexBytes(p.Signature),
		strconv.Itoa(p.X402Version),
	}
	return Fingerprint(crypto.Keccak256Hash([]byte(strings.Join(parts, "\n"))))
}

// IDFingerprint is what a payment-identifier id is bound to: the payment (its Fingerprint) and
// the resource it pays for. The resource is not signed and the chain never sees it, but without
// it one paid id would replay as valid for every route with the same price and payee.
//
// It is keccak256 of these lines joined by "\n":
//
//	x402-payment-id-v2
//	the payment's Fingerprint, lower-case 0x-hex
//	the resource URL exactly as sent ("" when absent)
//
// Ids bound before it existed are bound to the Fingerprint alone (PaymentIDRecord.BindsTo).
func (p *Payment) IDFingerprint() Fingerprint {
	fp := p.Fingerprint()
	return Fingerprint(crypto.Keccak256Hash([]byte(strings.Join([]string{"x402-payment-id-v2", hexBytes(fp[:]), p.Resource}, "\n"))))
}
