// Package multicall3 is the Multicall3 contract as batched settlement speaks to it: aggregate3's
// calldata and the decoding of its answer. Multicall3 lives at one address on virtually every EVM
// chain (a keyless deployment), and the local stack deploys it there too.
package multicall3

import (
	"fmt"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
)

// Address is Multicall3's canonical address.
var Address = common.HexToAddress("0xcA11bde05977b3631167028862bE2a173976CA11")

// Call is one call of a batch. With AllowFailure a call that reverts does not revert the batch:
// its Result says so and the other calls stand.
type Call struct {
	Target       common.Address
	AllowFailure bool
	CallData     []byte
}

// Result is one call's answer, in the order of the calls.
type Result struct {
	Success    bool
	ReturnData []byte
}

// The aggregate3 tuple types, as go-ethereum's ABI packer reads them (field names are matched to
// the ABI's component names).
type call3 struct {
	Target       common.Address
	AllowFailure bool
	CallData     []byte
}

// mcABI is aggregate3 only: nothing else of Multicall3 is used. Parsed once, never written.
var mcABI = func() abi.ABI {
	a, err := abi.JSON(strings.NewReader(`[{"type":"function","name":"aggregate3","stateMutability":"payable",
		"inputs":[{"name":"calls","type":"tuple[]","components":[
			{"name":"target","type":"address"},{"name":"allowFailure","type":"bool"},{"name":"callData","type":"bytes"}]}],
		"outputs":[{"name":"returnData","type":"tuple[]","components":[
			{"name":"success","type":"bool"},{"name":"returnData","type":"bytes"}]}]}]`))
	if err != nil {
		panic(err)
	}
	return a
}()

// Aggregate3Calldata encodes aggregate3(calls).
func Aggregate3Calldata(calls []Call) []byte {
	in := make([]call3, len(calls))
	for i, c := range calls {
		in[i] = call3(c)
	}
	data, err := mcABI.Pack("aggregate3", in)
	if err != nil {
		panic(fmt.Sprintf("multicall3: packing aggregate3: %v", err)) // only on a programming error
	}
	return data
}

// DecodeAggregate3 decodes aggregate3's answer; ok is false when it is not one.
func DecodeAggregate3(out []byte) ([]Result, bool) {
	vals, err := mcABI.Unpack("aggregate3", out)
	if err != nil || len(vals) != 1 {
		return nil, false
	}
	rs, ok := vals[0].([]struct {
		Success    bool   `json:"success"`
		ReturnData []byte `json:"returnData"`
	})
	if !ok {
		return nil, false
	}
	res := make([]Result, len(rs))
	for i, r := range rs {
		res[i] = Result{Success: r.Success, ReturnData: r.ReturnData}
	}
	return res, true
}

// DecodeAggregate3Calldata decodes aggregate3's calldata (the simulator reads what a batch asks);
// ok is false for any other calldata.
func DecodeAggregate3Calldata(data []byte) ([]Call, bool) {
	m := mcABI.Methods["aggregate3"]
	if len(data) < 4 || string(data[:4]) != string(m.ID) {
		return nil, false
	}
	vals, err := m.Inputs.Unpack(data[4:])
	if err != nil || len(vals) != 1 {
		return nil, false
	}
	cs, ok := vals[0].([]struct {
		Target       common.Address `json:"target"`
		AllowFailure bool           `json:"allowFailure"`
		CallData     []byte         `json:"callData"`
	})
	if !ok {
		return nil, false
	}
	out := make([]Call, len(cs))
	for i, c := range cs {
		out[i] = Call{Target: c.Target, AllowFailure: c.AllowFailure, CallData: c.CallData}
	}
	return out, true
}

// The gas aggregate3 costs beyond its calls, measured on anvil with Circle's USDC
// (TestBatchGas, the figures in docs/benchmark-history.md, "batched settlement"). A lone call's
// eth_estimateGas includes the 21,000 every transaction pays, which a batch pays once; inside a
// batch a call pays instead Multicall3's loop, its ABI framing and, for the first call to a
// target, the cold access to it (the lone transaction's target is warm): 6,189 gas for a batch
// of one, the worst case (later calls to the same token find its code and slots warm and cost
// 17,000 less than their estimate minus 21,000).
const (
	// IntrinsicGas is what every transaction pays before it runs (EIP-2028 calldata aside).
	IntrinsicGas = 21_000
	// CallGas is what a call of a batch may cost beyond its lone estimate less IntrinsicGas:
	// the measured worst case (6,189, a call whose target is cold), rounded up.
	CallGas = 8_000
)

// NeededGas is the gas a batch of calls needs when each call's lone estimate (an eth_estimateGas of
// the call sent on its own) is right: one intrinsic cost, each call's estimate less its own
// intrinsic cost plus CallGas, and the 1/64 of the largest call that EIP-150 keeps back from a
// call (a call that gets too little fails alone, allowFailure, while the batch succeeds, so a
// short limit fails members silently rather than reverting). The caller adds its margin.
func NeededGas(estimates []uint64) uint64 {
	gas, largest := uint64(IntrinsicGas), uint64(0)
	for _, e := range estimates {
		gas += max(e, IntrinsicGas) - IntrinsicGas + CallGas
		largest = max(largest, e)
	}
	return gas + largest/63 + 1
}

// CallEstimate is NeededGas's inverse for calls alike: the lone estimate e such that a batch of
// calls calls each estimated at e needs need (at most, rounded down by less than calls). It is what a batch's calls were
// estimated at when only the batch's need is known (the ledger keeps a transaction's limit, not
// its calls' estimates) and its calls were sized alike, as the verifier's learned per-token
// estimate sizes them.
func CallEstimate(need uint64, calls int) uint64 {
	if calls <= 0 {
		return 0
	}
	n := uint64(calls)
	// need = IntrinsicGas + 1 + n*(e - (IntrinsicGas-CallGas)) + e/63, for e >= IntrinsicGas.
	extra := n * (IntrinsicGas - CallGas)
	if need+extra < IntrinsicGas+1 {
		return 0
	}
	x := need + extra - (IntrinsicGas + 1)
	return x * 63 / (63*n + 1)
}

// Aggregate3Answer encodes aggregate3's answer (the simulated chain answers as Multicall3 does).
func Aggregate3Answer(results []Result) []byte {
	type result struct {
		Success    bool
		ReturnData []byte
	}
	out := make([]result, len(results))
	for i, r := range results {
		out[i] = result(r)
	}
	data, err := mcABI.Methods["aggregate3"].Outputs.Pack(out)
	if err != nil {
		panic(fmt.Sprintf("multicall3: packing aggregate3's answer: %v", err)) // only on a programming error
	}
	return data
}
