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
