package eip3009

import (
	"bytes"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// eip6492Magic ends every ERC-6492 wrapped signature.
var eip6492Magic = common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")

// Wrapped6492 is an ERC-6492 signature: a counterfactual wallet's factory call and the signature
// the wallet will accept once deployed.
type Wrapped6492 struct {
	Factory     common.Address
	FactoryData []byte
	Inner       []byte
}

var wrapperArgs = abi.Arguments{
	{Type: mustType("address")},
	{Type: mustType("bytes")},
	{Type: mustType("bytes")},
}

// Unwrap6492 returns the wrapper when sig carries deployment info. Like viem, a wrapper whose
// factory is the zero address counts as carrying none.
func Unwrap6492(sig []byte) (Wrapped6492, bool) {
	if len(sig) < len(eip6492Magic) || !bytes.Equal(sig[len(sig)-len(eip6492Magic):], eip6492Magic) {
		return Wrapped6492{}, false
	}
	vals, err := wrapperArgs.Unpack(sig[:len(sig)-len(eip6492Magic)])
	if err != nil || len(vals) != 3 {
		return Wrapped6492{}, false
	}
	w := Wrapped6492{Factory: vals[0].(common.Address), FactoryData: vals[1].([]byte), Inner: vals[2].([]byte)}
	if w.Factory == (common.Address{}) {
		return Wrapped6492{}, false
	}
	return w, true
}

// SettlementSignature is the signature to submit on chain for sig: the inner signature of an
// ERC-6492 wrapper (the wallet is deployed by then), sig itself otherwise.
func SettlementSignature(sig []byte) []byte {
	if w, ok := Unwrap6492(sig); ok {
		return w.Inner
	}
	return sig
}

// RecoverEOA reports whether a 65-byte (r, s, v) signature over digest recovers to want,
// accepting v in {0, 1, 27, 28} as viem does.
func RecoverEOA(digest common.Hash, sig []byte, want common.Address) bool {
	if len(sig) != 65 {
		return false
	}
	v := sig[64]
	switch v {
	case 27, 28:
		v -= 27
	case 0, 1:
	default:
		return false
	}
	rsv := make([]byte, 65)
	copy(rsv, sig[:64])
	rsv[64] = v
	// The recovered key's bytes are hashed directly: crypto.SigToPub would also parse them into a
	// curve point (big.Int arithmetic to check it is on the curve, which secp256k1's recovery
	// already guarantees) only for PubkeyToAddress to serialise it back.
	pub, err := crypto.Ecrecover(digest[:], rsv)
	if err != nil || len(pub) != 65 {
		return false
	}
	return common.BytesToAddress(crypto.Keccak256(pub[1:])[12:]) == want
}

// normalizeV returns r, s and v with v as 27/28: USDC's ecrecover rejects 0/1 on chain even though
// the official verify accepts them.
func normalizeV(sig []byte) (v uint8, r, s [32]byte) {
	copy(r[:], sig[:32])
	copy(s[:], sig[32:64])
	v = sig[64]
	if v < 27 {
		v += 27
	}
	return v, r, s
}

func mustType(t string) abi.Type {
	typ, err := abi.NewType(t, "", nil)
	if err != nil {
		panic(err)
	}
	return typ
}
