package eip3009

import (
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

var (
	domainTypeHash = crypto.Keccak256Hash([]byte("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"))
	// TransferWithAuthorizationTypeHash is EIP-3009's primary type hash (0x7c7c6cdb…).
	TransferWithAuthorizationTypeHash = crypto.Keccak256Hash([]byte("TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"))
)

// DomainSeparator is the EIP-712 domain hash of an EIP-3009 token.
func DomainSeparator(name, version string, chainID uint64, token common.Address) common.Hash {
	return crypto.Keccak256Hash(
		domainTypeHash[:],
		crypto.Keccak256([]byte(name)),
		crypto.Keccak256([]byte(version)),
		word(new(big.Int).SetUint64(chainID)),
		common.LeftPadBytes(token[:], 32),
	)
}

// AuthorizationDigest is the EIP-712 digest a payer signs for transferWithAuthorization. It is
// built by hand rather than through apitypes.TypedData: the layout is fixed and this runs on
// every verify (a test pins it against apitypes).
func AuthorizationDigest(domain common.Hash, a facilitator.Authorization) common.Hash {
	structHash := crypto.Keccak256(
		TransferWithAuthorizationTypeHash[:],
		common.LeftPadBytes(a.From[:], 32),
		common.LeftPadBytes(a.To[:], 32),
		word(a.Value),
		word(a.ValidAfter),
		word(a.ValidBefore),
		a.Nonce[:],
	)
	return crypto.Keccak256Hash([]byte{0x19, 0x01}, domain[:], structHash)
}

func word(n *big.Int) []byte {
	var b [32]byte
	n.FillBytes(b[:])
	return b[:]
}
