package verify

import (
	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
)

// erc1271Magic is what isValidSignature returns for a valid signature.
var erc1271Magic = []byte{0x16, 0x26, 0xba, 0x7e}

// recoverEOA checks a 65-byte (r, s, v) signature over digest, accepting v in {0, 1, 27, 28} as
// viem does (eip3009.RecoverEOA: the narrow signer checks payers' signatures with it too).
func recoverEOA(digest common.Hash, sig []byte, want common.Address) bool {
	return eip3009.RecoverEOA(digest, sig, want)
}
