package devchain

import (
	"crypto/ecdsa"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
)

// TransferAuthorization is the EIP-3009 message a payer signs.
type TransferAuthorization struct {
	From, To                       common.Address
	Value, ValidAfter, ValidBefore *big.Int
	Nonce                          [32]byte
}

// typedData builds the message with go-ethereum's EIP-712 implementation, which is
// independent of whatever the facilitator uses, so tests get a second opinion.
func (u *USDC) typedData(a TransferAuthorization) apitypes.TypedData {
	num := func(b *big.Int) *big.Int {
		if b == nil {
			return new(big.Int)
		}
		return b
	}
	return apitypes.TypedData{
		Types: apitypes.Types{
			"EIP712Domain": {
				{Name: "name", Type: "string"},
				{Name: "version", Type: "string"},
				{Name: "chainId", Type: "uint256"},
				{Name: "verifyingContract", Type: "address"},
			},
			"TransferWithAuthorization": {
				{Name: "from", Type: "address"},
				{Name: "to", Type: "address"},
				{Name: "value", Type: "uint256"},
				{Name: "validAfter", Type: "uint256"},
				{Name: "validBefore", Type: "uint256"},
				{Name: "nonce", Type: "bytes32"},
			},
		},
		PrimaryType: "TransferWithAuthorization",
		Domain:      u.Domain(),
		Message: apitypes.TypedDataMessage{
			"from":        a.From.Hex(),
			"to":          a.To.Hex(),
			"value":       num(a.Value),
			"validAfter":  num(a.ValidAfter),
			"validBefore": num(a.ValidBefore),
			"nonce":       a.Nonce[:],
		},
	}
}

// AuthorizationDigest is the EIP-712 digest USDC checks the signature against.
func (u *USDC) AuthorizationDigest(a TransferAuthorization) (common.Hash, error) {
	td := u.typedData(a)
	digest, _, err := apitypes.TypedDataAndHash(td)
	if err != nil {
		return common.Hash{}, fmt.Errorf("devchain: EIP-712 hash: %w", err)
	}
	return common.BytesToHash(digest), nil
}

// SignTransferAuthorization signs a with key and returns r||s||v with v in {27, 28},
// the form wallets produce.
func (u *USDC) SignTransferAuthorization(key *ecdsa.PrivateKey, a TransferAuthorization) ([]byte, error) {
	digest, err := u.AuthorizationDigest(a)
	if err != nil {
		return nil, err
	}
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		return nil, err
	}
	sig[64] += 27
	return sig, nil
}

// SignCancelAuthorization signs EIP-3009's CancelAuthorization(authorizer, nonce) with key (the
// authorizer's) and returns r||s||v with v in {27, 28}.
func (u *USDC) SignCancelAuthorization(key *ecdsa.PrivateKey, nonce [32]byte) ([]byte, error) {
	td := apitypes.TypedData{
		Types: apitypes.Types{
			"EIP712Domain": u.typedData(TransferAuthorization{}).Types["EIP712Domain"],
			"CancelAuthorization": {
				{Name: "authorizer", Type: "address"},
				{Name: "nonce", Type: "bytes32"},
			},
		},
		PrimaryType: "CancelAuthorization",
		Domain:      u.Domain(),
		Message:     apitypes.TypedDataMessage{"authorizer": crypto.PubkeyToAddress(key.PublicKey).Hex(), "nonce": nonce[:]},
	}
	digest, _, err := apitypes.TypedDataAndHash(td)
	if err != nil {
		return nil, fmt.Errorf("devchain: EIP-712 hash: %w", err)
	}
	sig, err := crypto.Sign(digest, key)
	if err != nil {
		return nil, err
	}
	sig[64] += 27
	return sig, nil
}
