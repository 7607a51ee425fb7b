package verify

import (
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// erc1271Magic is what isValidSignature returns for a valid signature.
var erc1271Magic = []byte{0x16, 0x26, 0xba, 0x7e}

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
	// The recovered key's bytes are hashed directly: crypto.SigToPub would also parse them into a
	// curve point (big.Int arithmetic to check it is on the curve, which secp256k1's recovery
	// already guarantees) only for PubkeyToAddress to serialise it back.
	pub, err := crypto.Ecrecover(digest[:], rsv)
	if err != nil || len(pub) != 65 {
		return false
	}
	return common.BytesToAddress(crypto.Keccak256(pub[1:])[12:]) == want
}
