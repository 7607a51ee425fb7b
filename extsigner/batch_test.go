package extsigner_test

import (
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// batchCalls are n allowFailure transferWithAuthorization calls to the token, each of its own
// signed authorization, as the engine batches them.
func batchCalls(n int) []multicall3.Call {
	calls := make([]multicall3.Call, n)
	for i := range calls {
		calls[i] = multicall3.Call{Target: token, AllowFailure: true, CallData: transferDataN(byte(i))}
	}
	return calls
}

// batch is the transaction the engine asks for a batch of calls: type 2, to Multicall3.
func batch(calls []multicall3.Call, gas uint64) *types.DynamicFeeTx {
	to := multicall3.Address
	return &types.DynamicFeeTx{Nonce: 9, GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(50e9), Gas: gas, To: &to,
		Data: multicall3.Aggregate3Calldata(calls)}
}

// TestPolicyAcceptsBatch: a batch of allowFailure transferWithAuthorization calls to the token,
// each of an authorization its payer signed, through Multicall3 at its canonical address, is
// signed as asked, with a gas limit of up to MaxGas per call.
func TestPolicyAcceptsBatch(t *testing.T) {
	for _, n := range []int{1, 3, extsigner.MaxBatchCalls} {
		want := batch(batchCalls(n), policy.MaxGas*uint64(n))
		args := argsOf(want)
		got, err := policy.Check(&args)
		if err != nil {
			t.Fatalf("a batch of %d: %v", n, err)
		}
		tx := types.NewTx(got)
		if *tx.To() != multicall3.Address || tx.Gas() != want.Gas || tx.Nonce() != 9 || string(tx.Data()) != string(want.Data) ||
			tx.Value().Sign() != 0 || tx.ChainId().Int64() != 31337 {
			t.Fatalf("a batch of %d checked as %+v", n, tx)
		}
	}
}

// TestPolicyRefusesBatch: everything but a batch of settlements to Multicall3 is refused, saying
// why: a call not allowed to fail, another target (a nested Multicall3 among them), another
// method, an empty or oversized batch, gas past MaxGas per call, value, another Multicall3
// method, calldata not in aggregate3's canonical encoding, and the lone policy's limits.
func TestPolicyRefusesBatch(t *testing.T) {
	other := common.HexToAddress("0xdead")
	withCalls := func(edit func([]multicall3.Call) []multicall3.Call) func(a *apitypes.SendTxArgs) {
		return func(a *apitypes.SendTxArgs) {
			d := hexutil.Bytes(multicall3.Aggregate3Calldata(edit(batchCalls(3))))
			a.Input = &d
		}
	}
	for _, tc := range []struct {
		name string
		edit func(a *apitypes.SendTxArgs)
		want string
	}{
		{"a call not allowed to fail", withCalls(func(c []multicall3.Call) []multicall3.Call { c[1].AllowFailure = false; return c }),
			"call 1 of the batch does not allow failure"},
		{"a call to another contract", withCalls(func(c []multicall3.Call) []multicall3.Call { c[2].Target = other; return c }),
			"call 2 of the batch targets"},
		{"a nested batch", withCalls(func(c []multicall3.Call) []multicall3.Call {
			c[0] = multicall3.Call{Target: multicall3.Address, AllowFailure: true, CallData: multicall3.Aggregate3Calldata(batchCalls(2))}
			return c
		}), "call 0 of the batch targets " + multicall3.Address.Hex()},
		{"an ERC-20 transfer inside", withCalls(func(c []multicall3.Call) []multicall3.Call {
			c[1].CallData = append(common.FromHex("0xa9059cbb"), make([]byte, 64)...)
			return c
		}), "call 1 of the batch is not a transferWithAuthorization"},
		{"cancelAuthorization inside", withCalls(func(c []multicall3.Call) []multicall3.Call {
			c[0].CallData = eip3009.CancelCalldata(other, [32]byte{1}, make([]byte, 65))
			return c
		}), "call 0 of the batch is not a transferWithAuthorization"},
		{"no calls", withCalls(func([]multicall3.Call) []multicall3.Call { return nil }), "a batch of 0 calls"},
		{"too many calls", withCalls(func([]multicall3.Call) []multicall3.Call { return batchCalls(extsigner.MaxBatchCalls + 1) }),
			"a batch of 101 calls"},
		{"gas over the ceiling per call", func(a *apitypes.SendTxArgs) { a.Gas = hexutil.Uint64(3*policy.MaxGas + 1) }, "gas 600001 is not within 1..600000"},
		{"value", func(a *apitypes.SendTxArgs) { a.Value = hexutil.Big(*big.NewInt(1)) }, "value 1 wei is not zero"},
		{"another Multicall3 method (aggregate)", func(a *apitypes.SendTxArgs) {
			d := hexutil.Bytes(append(common.FromHex("0x252dba42"), multicall3.Aggregate3Calldata(batchCalls(3))[4:]...))
			a.Input = &d
		}, "not an aggregate3 call"},
		{"trailing bytes", func(a *apitypes.SendTxArgs) {
			d := append(hexutil.Bytes(nil), *a.Input...)
			d = append(d, make([]byte, 32)...)
			a.Input = &d
		}, "canonical encoding"},
		{"fee over cap", func(a *apitypes.SendTxArgs) { a.MaxFeePerGas = (*hexutil.Big)(big.NewInt(100e9 + 1)) }, "over the ceiling"},
		{"wrong chain", func(a *apitypes.SendTxArgs) { a.ChainID = (*hexutil.Big)(big.NewInt(1)) }, "chainId 1"},
		{"access list", func(a *apitypes.SendTxArgs) { a.AccessList = &types.AccessList{{Address: other}} }, "type 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := argsOf(batch(batchCalls(3), 3*policy.MaxGas))
			tc.edit(&args)
			_, err := policy.Check(&args)
			if !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a refusal saying %q, got %v", tc.want, err)
			}
		})
	}
}

// FuzzPolicyBatch: whatever calldata a facilitator sends to Multicall3, the policy never panics,
// and what it signs is a batch of settlements: every call of it, as the contract decodes it, an
// allowFailure transferWithAuthorization call to the token of an authorization its payer signed
// (the signature recovers to from in the token's domain), none repeated, within MaxGas per call.
func FuzzPolicyBatch(f *testing.F) {
	good := multicall3.Aggregate3Calldata(batchCalls(2))
	f.Add(good, uint64(2*policy.MaxGas))
	f.Add(multicall3.Aggregate3Calldata(batchCalls(1)), uint64(100_000))
	bad := batchCalls(2)
	bad[1].AllowFailure = false
	f.Add(multicall3.Aggregate3Calldata(bad), uint64(100_000))
	f.Add(append(append([]byte(nil), good...), 1, 2, 3), uint64(100_000))
	f.Add(good[:len(good)/2], uint64(100_000))
	f.Add([]byte{0x82, 0xad, 0x56, 0xcb}, uint64(1))
	zero := batchCalls(2)
	zero[1].CallData = withSignature(1, make([]byte, 65))
	f.Add(multicall3.Aggregate3Calldata(zero), uint64(100_000))
	f.Fuzz(func(t *testing.T, data []byte, gas uint64) {
		tx := batch(nil, gas)
		tx.Data = data
		args := argsOf(tx)
		got, err := policy.Check(&args)
		if err != nil {
			if !errors.Is(err, extsigner.ErrRefused) {
				t.Fatalf("an error that is not a refusal: %v", err)
			}
			return
		}
		signed := types.NewTx(got)
		calls, ok := multicall3.DecodeAggregate3Calldata(signed.Data())
		if !ok || len(calls) == 0 || len(calls) > extsigner.MaxBatchCalls || *signed.To() != multicall3.Address || signed.Value().Sign() != 0 ||
			signed.Gas() == 0 || signed.Gas() > policy.MaxGas*uint64(len(calls)) {
			t.Fatalf("signed %x with gas %d: %d calls (%v)", signed.Data(), signed.Gas(), len(calls), ok)
		}
		domain := eip3009.DomainSeparator(policy.TokenName, policy.TokenVersion, policy.ChainID, policy.Token)
		seen := map[[32]byte]bool{}
		for i, c := range calls {
			d, ok := eip3009.DecodeCall(c.CallData)
			if !c.AllowFailure || c.Target != token || !ok || d.Method != eip3009.MethodTransferWithAuthorization {
				t.Fatalf("signed a batch whose call %d is %+v", i, c)
			}
			if !eip3009.RecoverEOA(eip3009.AuthorizationDigest(domain, d.Authorization), d.Signature, d.Authorization.From) || seen[d.Authorization.Nonce] {
				t.Fatalf("signed a batch whose call %d's authorization is not its payer's, or repeated: %+v", i, d)
			}
			seen[d.Authorization.Nonce] = true
		}
	})
}
