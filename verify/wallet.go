package verify

import (
	"fmt"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
)

// The parts of the ERC-1271 and Multicall3 ABIs that verify calls (the token's are in eip3009).
// Parsed once, never written.
var (
	walletABI = mustABI(`[
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

func pack(method string, args ...any) []byte {
	data, err := walletABI.Pack(method, args...)
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
	vals, err := walletABI.Unpack("tryAggregate", data)
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

func mustABI(s string) abi.ABI {
	a, err := abi.JSON(strings.NewReader(s))
	if err != nil {
		panic(err)
	}
	return a
}
