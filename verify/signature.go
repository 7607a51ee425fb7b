package verify

import (
	"bytes"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// eip6492Magic ends every ERC-6492 wrapped signature.
var eip6492Magic = common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")

// erc1271Magic is what isValidSignature returns for a valid signature.
var erc1271Magic = []byte{0x16, 0x26, 0xba, 0x7e}

// wrapped6492 is an ERC-6492 signature: a counterfactual wallet's factory call and the signature
// the wallet will accept once deployed.
type wrapped6492 struct {
	Factory     common.Address
	FactoryData []byte
	Inner       []byte
}

var wrapperArgs = abi.Arguments{
	{Type: mustType("address")},
	{Type: mustType("bytes")},
	{Type: mustType("bytes")},
}

// unwrap6492 returns the wrapper when sig carries deployment info. Like viem, a wrapper whose
// factory is the zero address counts as carrying none.
func unwrap6492(sig []byte) (wrapped6492, bool) {
	if len(sig) < len(eip6492Magic) || !bytes.Equal(sig[len(sig)-len(eip6492Magic):], eip6492Magic) {
		return wrapped6492{}, false
	}
	vals, err := wrapperArgs.Unpack(sig[:len(sig)-len(eip6492Magic)])
	if err != nil || len(vals) != 3 {
		return wrapped6492{}, false
	}
	w := wrapped6492{Factory: vals[0].(common.Address), FactoryData: vals[1].([]byte), Inner: vals[2].([]byte)}
	if w.Factory == (common.Address{}) {
		return wrapped6492{}, false
	}
	return w, true
}

// recoverEOA checks a 65-byte (r, s, v) signature over digest, accepting v in {0, 1, 27, 28} as
// viem does.
func recoverEOA(digest common.Hash, sig []byte, want common.Address) bool {
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
	pub, err := crypto.SigToPub(digest[:], rsv)
	if err != nil {
		return false
	}
	return crypto.PubkeyToAddress(*pub) == want
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

// SettlementSignature is the signature to submit on chain for sig: the inner signature of an
// ERC-6492 wrapper (the wallet is deployed by then), sig itself otherwise.
func SettlementSignature(sig []byte) []byte {
	if w, ok := unwrap6492(sig); ok {
		return w.Inner
	}
	return sig
}
