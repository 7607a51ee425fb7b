package verify

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The parts of the EIP-3009 token, ERC-1271 and Multicall3 ABIs that verify reads. Parsed once,
// never written.
var (
	tokenABI = mustABI(`[
	{"type":"function","name":"transferWithAuthorization","stateMutability":"nonpayable","inputs":[
		{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},
		{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},
		{"name":"v","type":"uint8"},{"name":"r","type":"bytes32"},{"name":"s","type":"bytes32"}],"outputs":[]},
	{"type":"function","name":"transferWithAuthorization","stateMutability":"nonpayable","inputs":[
		{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},
		{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},
		{"name":"signature","type":"bytes"}],"outputs":[]},
	{"type":"function","name":"authorizationState","stateMutability":"view","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"}],"outputs":[{"name":"","type":"bool"}]},
	{"type":"function","name":"balanceOf","stateMutability":"view","inputs":[{"name":"account","type":"address"}],"outputs":[{"name":"","type":"uint256"}]},
	{"type":"function","name":"name","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"string"}]},
	{"type":"function","name":"version","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"string"}]},
	{"type":"function","name":"isValidSignature","stateMutability":"view","inputs":[
		{"name":"hash","type":"bytes32"},{"name":"signature","type":"bytes"}],"outputs":[{"name":"","type":"bytes4"}]},
	{"type":"function","name":"tryAggregate","stateMutability":"payable","inputs":[
		{"name":"requireSuccess","type":"bool"},
		{"name":"calls","type":"tuple[]","components":[{"name":"target","type":"address"},{"name":"callData","type":"bytes"}]}],
	 "outputs":[{"name":"returnData","type":"tuple[]","components":[{"name":"success","type":"bool"},{"name":"returnData","type":"bytes"}]}]}
	]`)
	// Multicall3 is at the same address on every chain that has it.
	Multicall3 = common.HexToAddress("0xcA11bde05977b3631167028862bE2a173976CA11")
)

// TransferCalldata encodes transferWithAuthorization for sig: the (v, r, s) overload for a 65-byte
// signature, with v normalised to 27/28, and USDC 2.2's bytes overload for anything else
// (ERC-1271 wallets).
func TransferCalldata(a facilitator.Authorization, sig []byte) []byte {
	var data []byte
	var err error
	if len(sig) == 65 {
		v, r, s := normalizeV(sig)
		data, err = tokenABI.Pack("transferWithAuthorization", a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, v, r, s)
	} else {
		// go-ethereum renames the second overload with a 0 suffix; its selector stays the real one (0xcf092995).
		data, err = tokenABI.Pack("transferWithAuthorization0", a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig)
	}
	if err != nil {
		panic(fmt.Sprintf("verify: packing transferWithAuthorization: %v", err)) // only on a programming error
	}
	return data
}

func pack(method string, args ...any) []byte {
	data, err := tokenABI.Pack(method, args...)
	if err != nil {
		panic(fmt.Sprintf("verify: packing %s: %v", method, err))
	}
	return data
}

type aggregateCall struct {
	Target   common.Address
	CallData []byte
}

type aggregateResult struct {
	Success    bool
	ReturnData []byte
}

func unpackAggregate(data []byte) ([]aggregateResult, error) {
	vals, err := tokenABI.Unpack("tryAggregate", data)
	if err != nil || len(vals) != 1 {
		return nil, fmt.Errorf("decoding tryAggregate: %v", err)
	}
	raw, ok := vals[0].([]struct {
		Success    bool   `json:"success"`
		ReturnData []byte `json:"returnData"`
	})
	if !ok {
		return nil, fmt.Errorf("decoding tryAggregate: unexpected %T", vals[0])
	}
	out := make([]aggregateResult, len(raw))
	for i, r := range raw {
		out[i] = aggregateResult{Success: r.Success, ReturnData: r.ReturnData}
	}
	return out, nil
}

func unpackString(method string, data []byte) (string, bool) {
	vals, err := tokenABI.Unpack(method, data)
	if err != nil || len(vals) != 1 {
		return "", false
	}
	s, ok := vals[0].(string)
	return s, ok
}

func unpackBool(method string, data []byte) (bool, bool) {
	vals, err := tokenABI.Unpack(method, data)
	if err != nil || len(vals) != 1 {
		return false, false
	}
	b, ok := vals[0].(bool)
	return b, ok
}

func unpackUint(method string, data []byte) (*big.Int, bool) {
	vals, err := tokenABI.Unpack(method, data)
	if err != nil || len(vals) != 1 {
		return nil, false
	}
	n, ok := vals[0].(*big.Int)
	return n, ok
}

func mustABI(s string) abi.ABI {
	a, err := abi.JSON(strings.NewReader(s))
	if err != nil {
		panic(err)
	}
	return a
}

// AuthorizationStateCalldata encodes authorizationState(authorizer, nonce).
func AuthorizationStateCalldata(authorizer common.Address, nonce [32]byte) []byte {
	return pack("authorizationState", authorizer, nonce)
}
