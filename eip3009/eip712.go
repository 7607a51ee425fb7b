package eip3009

import (
	"encoding/binary"

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
	var d [5 * 32]byte
	copy(d[:32], domainTypeHash[:])
	nameHash, versionHash := crypto.Keccak256Hash([]byte(name)), crypto.Keccak256Hash([]byte(version))
	copy(d[32:64], nameHash[:])
	copy(d[64:96], versionHash[:])
	binary.BigEndian.PutUint64(d[96+24:128], chainID)
	copy(d[128+12:160], token[:])
	return crypto.Keccak256Hash(d[:])
}

// AuthorizationDigest is the EIP-712 digest a payer signs for transferWithAuthorization. It is
// built by hand rather than through apitypes.TypedData: the layout is fixed and this runs on
// every verify (a test pins it against apitypes). The struct's words go into one buffer, hashed
// once, rather than a slice per word.
func AuthorizationDigest(domain common.Hash, a facilitator.Authorization) common.Hash {
	var st [7 * 32]byte
	copy(st[:32], TransferWithAuthorizationTypeHash[:])
	copy(st[32+12:64], a.From[:])
	copy(st[64+12:96], a.To[:])
	a.Value.FillBytes(st[96:128])
	a.ValidAfter.FillBytes(st[128:160])
	a.ValidBefore.FillBytes(st[160:192])
	copy(st[192:224], a.Nonce[:])
	var msg [2 + 32 + 32]byte
	msg[0], msg[1] = 0x19, 0x01
	copy(msg[2:34], domain[:])
	structHash := crypto.Keccak256Hash(st[:])
	copy(msg[34:], structHash[:])
	return crypto.Keccak256Hash(msg[:])
}
