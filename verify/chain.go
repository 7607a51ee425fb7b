package verify

import (
	"context"
	"fmt"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// Reader is the narrow view of one chain that verify needs; *ethrpc.Reader is the one over
// JSON-RPC.
type Reader interface {
	// Read performs reads against the latest block, in one round trip where the transport allows.
	// A call the node executed and rejected sets Read.Reverted; any other failure is returned,
	// because then nothing is known about the payment.
	Read(ctx context.Context, reads ...*ethrpc.Read) error
}

func codeAt(addr common.Address) *ethrpc.Read { return &ethrpc.Read{Code: true, To: addr} }

func call(to common.Address, data []byte) *ethrpc.Read { return &ethrpc.Read{To: to, Data: data} }

// TokenDomain reads a token's EIP-712 name and version.
func TokenDomain(ctx context.Context, r Reader, token common.Address) (name, version string, err error) {
	n, v := domainReads(token)
	if err := r.Read(ctx, n, v); err != nil {
		return "", "", err
	}
	name, version, ok := decodeDomain(n, v)
	if !ok {
		return "", "", fmt.Errorf("token %s does not answer name() and version()", token.Hex())
	}
	return name, version, nil
}

// domainReads are the reads of a token's EIP-712 name and version, for one batch.
func domainReads(token common.Address) (name, version *ethrpc.Read) {
	return call(token, eip3009.NameCalldata()), call(token, eip3009.VersionCalldata())
}

// decodeDomain reads domainReads' answers: ok is false when either reverted or is not a string.
func decodeDomain(n, v *ethrpc.Read) (name, version string, ok bool) {
	name, ok1 := eip3009.DecodeString(n.Out)
	version, ok2 := eip3009.DecodeString(v.Out)
	return name, version, !n.Reverted && !v.Reverted && ok1 && ok2
}

// AuthorizationUsed reads authorizationState(authorizer, nonce): whether the authorization is
// used or canceled on chain now.
func AuthorizationUsed(ctx context.Context, r Reader, token, authorizer common.Address, nonce [32]byte) (bool, error) {
	rd := call(token, eip3009.AuthorizationStateCalldata(authorizer, nonce))
	if err := r.Read(ctx, rd); err != nil {
		return false, err
	}
	if rd.Reverted {
		return false, fmt.Errorf("token %s has no authorizationState: %s", token.Hex(), rd.RevertReason)
	}
	used, ok := eip3009.DecodeAuthorizationState(rd.Out)
	if !ok {
		return false, fmt.Errorf("token %s: authorizationState answered %x", token.Hex(), rd.Out)
	}
	return used, nil
}
