package status

import (
	"regexp"
	"strings"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The forms a status query names an authorization by; the API's routes, its OpenAPI document and
// the console's search box read them alike.
const (
	AddressPattern   = `^0[xX][0-9a-fA-F]{40}$`
	HashPattern      = `^0[xX][0-9a-fA-F]{64}$`
	PaymentIDPattern = `^[A-Za-z0-9_-]{16,128}$`
)

var (
	addressForm = regexp.MustCompile(AddressPattern)
	hashForm    = regexp.MustCompile(HashPattern)
	idForm      = regexp.MustCompile(PaymentIDPattern)
)

// ParseKey reads an authorization key from its four parts (network, asset, payer, nonce); a
// part that is not what it should be is an EInvalid error saying which.
func ParseKey(network, asset, from, nonce string) (facilitator.AuthorizationKey, error) {
	if _, err := facilitator.ParseCAIP2(network); err != nil {
		return facilitator.AuthorizationKey{}, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network must be eip155:<chain id>, got %q", clip(network))
	}
	if !addressForm.MatchString(asset) || !addressForm.MatchString(from) {
		return facilitator.AuthorizationKey{}, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "asset and from must be 0x-prefixed 20-byte hex addresses")
	}
	n, ok := ParseNonce(nonce)
	if !ok {
		return facilitator.AuthorizationKey{}, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "nonce must be 0x-prefixed 32-byte hex")
	}
	return facilitator.AuthorizationKey{Network: network, Asset: common.HexToAddress(asset), Payer: common.HexToAddress(from), Nonce: n}, nil
}

// ParseTx reads a transaction hash.
func ParseTx(s string) (common.Hash, error) {
	if !hashForm.MatchString(s) {
		return common.Hash{}, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "the transaction hash must be 0x-prefixed 32-byte hex")
	}
	return common.HexToHash(s), nil
}

// CheckPaymentID refuses what cannot be a payment-identifier id.
func CheckPaymentID(id string) error {
	if !idForm.MatchString(id) {
		return facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidPaymentIdentifier, "a payment id is 16 to 128 characters of A-Z, a-z, 0-9, _ and -")
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return strings.TrimSpace(s)
}
