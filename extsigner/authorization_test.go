package extsigner_test

import (
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// withSignature is the calldata of the payer's authorization n with signature sig: the (v, r, s)
// overload for 65 bytes (v as given, not normalised as the engine does), the bytes one otherwise.
func withSignature(n byte, sig []byte) []byte {
	data := eip3009.TransferCalldata(authorization(n), sig)
	if len(sig) == 65 {
		data[4+6*32+31] = sig[64]
	}
	return data
}

// signatureCases are signatures of authorization 0 that do not prove its payer signed it, and
// what the refusal says.
func signatureCases(t *testing.T) []struct {
	name string
	sig  []byte
	want string
} {
	a := authorization(0)
	good := signAuthorization(payerKey, a)
	other, _ := crypto.GenerateKey()
	otherDomain := a
	otherDomain.Value = big.NewInt(11) // as if signed for another transfer: the digest differs
	highS := append([]byte(nil), good...)
	s := new(big.Int).Sub(crypto.S256().Params().N, new(big.Int).SetBytes(good[32:64]))
	s.FillBytes(highS[32:64])
	highS[64] = 55 - good[64] // 27 <-> 28: the same key recovers, but the token refuses s in the upper half
	v0 := append([]byte(nil), good...)
	v0[64] -= 27 // 0 or 1: viem accepts it, the token's ecrecover does not
	return []struct {
		name string
		sig  []byte
		want string
	}{
		{"all-zero signature", make([]byte, 65), "does not recover to its from"},
		{"signed by another key", signAuthorization(other, a), "does not recover to its from"},
		{"signed for another authorization", signAuthorization(payerKey, otherDomain), "does not recover to its from"},
		{"s in the upper half", highS, "does not recover to its from"},
		{"v 0 or 1", v0, "does not recover to its from"},
		{"a contract wallet's (ERC-1271) signature", make([]byte, 97), "97-byte signature, a contract wallet's"},
		{"an ERC-6492 wrapper", wrap6492(t, common.HexToAddress("0xfac"), []byte{1}, good), "a contract wallet's"},
	}
}

func wrap6492(t *testing.T, factory common.Address, calldata, inner []byte) []byte {
	t.Helper()
	addrT, _ := abi.NewType("address", "", nil)
	bytesT, _ := abi.NewType("bytes", "", nil)
	enc, err := abi.Arguments{{Type: addrT}, {Type: bytesT}, {Type: bytesT}}.Pack(factory, calldata, inner)
	if err != nil {
		t.Fatal(err)
	}
	return append(enc, common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")...)
}

// TestPolicyRefusesUnsignedAuthorizations: a transferWithAuthorization whose signature does not
// recover to its from in the token's EIP-712 domain (all zeros, another key's, for another
// authorization, a malleated s or a v the token refuses), or that is a contract wallet's, is
// refused, alone and as any call of a batch; so is a signature made in another domain (another
// token name, version or chain). The refusal names the payer, never the signature.
func TestPolicyRefusesUnsignedAuthorizations(t *testing.T) {
	for _, tc := range signatureCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			args := argsOf(settlement())
			d := hexutil.Bytes(withSignature(0, tc.sig))
			args.Input = &d
			_, err := policy.Check(&args)
			if !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), authorization(0).From.Hex()) {
				t.Fatalf("alone: want a refusal saying %q, got %v", tc.want, err)
			}
			if strings.Contains(err.Error(), common.Bytes2Hex(tc.sig[:32])) {
				t.Fatalf("the refusal repeats the signature: %v", err)
			}
			calls := batchCalls(3)
			calls[0].CallData = withSignature(0, tc.sig)
			args = argsOf(batch(calls, 3*policy.MaxGas))
			if _, err := policy.Check(&args); !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), "call 0 of the batch: ") ||
				!strings.Contains(err.Error(), tc.want) {
				t.Fatalf("in a batch: want a refusal of call 0 saying %q, got %v", tc.want, err)
			}
		})
	}
	for name, p := range map[string]extsigner.Policy{
		"another token name": func() extsigner.Policy { p := policy; p.TokenName = "USDC"; return p }(),
		"another version":    func() extsigner.Policy { p := policy; p.TokenVersion = "1"; return p }(),
		"another chain":      func() extsigner.Policy { p := policy; p.ChainID = 8453; return p }(),
	} {
		t.Run(name, func(t *testing.T) {
			args := argsOf(settlement())
			args.ChainID = (*hexutil.Big)(new(big.Int).SetUint64(p.ChainID))
			if _, err := p.Check(&args); !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), "does not recover to its from") {
				t.Fatalf("a signature of policy's domain under %s: %v", name, err)
			}
		})
	}
}

// TestPolicyRefusesAllZeroBatch: the batch of 100 calls with all-zero signatures that the
// policy once signed is refused at its first call.
func TestPolicyRefusesAllZeroBatch(t *testing.T) {
	calls := make([]multicall3.Call, extsigner.MaxBatchCalls)
	for i := range calls {
		calls[i] = multicall3.Call{Target: token, AllowFailure: true, CallData: withSignature(byte(i), make([]byte, 65))}
	}
	args := argsOf(batch(calls, policy.MaxGas*extsigner.MaxBatchCalls))
	if _, err := policy.Check(&args); !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), "call 0 of the batch: the authorization's signature does not recover") {
		t.Fatalf("100 all-zero signatures: %v", err)
	}
}

// TestPolicyRefusesRepeatedAuthorization: a batch carrying one authorization twice is refused
// (the second call could only revert, at the key's expense).
func TestPolicyRefusesRepeatedAuthorization(t *testing.T) {
	calls := batchCalls(3)
	calls[2].CallData = calls[0].CallData
	args := argsOf(batch(calls, 3*policy.MaxGas))
	if _, err := policy.Check(&args); !errors.Is(err, extsigner.ErrRefused) || !strings.Contains(err.Error(), "call 2 of the batch repeats call 0's authorization") {
		t.Fatalf("a repeated authorization: %v", err)
	}
}

// TestPolicyAllowsContractWallets: with AllowContractWallets, a signature this signer cannot
// check (a contract wallet's, ERC-1271 or ERC-6492, of any length) is signed; a payer's EOA
// signature still is, and the rest of the policy still holds.
func TestPolicyAllowsContractWallets(t *testing.T) {
	p := policy
	p.AllowContractWallets = true
	for _, tc := range signatureCases(t) {
		args := argsOf(settlement())
		d := hexutil.Bytes(withSignature(0, tc.sig))
		args.Input = &d
		if _, err := p.Check(&args); err != nil {
			t.Fatalf("%s with contract wallets allowed: %v", tc.name, err)
		}
	}
	args := argsOf(settlement())
	args.Value = hexutil.Big(*big.NewInt(1))
	if _, err := p.Check(&args); !errors.Is(err, extsigner.ErrRefused) {
		t.Fatalf("value with contract wallets allowed: %v", err)
	}
}

// signedArgs is argsOf for a transaction whose from is any account (Check ignores it).
func signedArgs(data []byte) apitypes.SendTxArgs {
	tx := settlement()
	tx.Data = data
	return argsOf(tx)
}

// FuzzPolicyTransfer: whatever signature a lone transferWithAuthorization carries, the policy
// never panics and signs it only when the payer's key made it over the authorization's digest in
// the token's domain.
func FuzzPolicyTransfer(f *testing.F) {
	good := signAuthorization(payerKey, authorization(0))
	f.Add(good)
	f.Add(make([]byte, 65))
	f.Add(make([]byte, 97))
	f.Add(append(append([]byte(nil), good[:64]...), 1))
	f.Fuzz(func(t *testing.T, sig []byte) {
		args := signedArgs(withSignature(0, sig))
		_, err := policy.Check(&args)
		if err != nil {
			if !errors.Is(err, extsigner.ErrRefused) {
				t.Fatalf("an error that is not a refusal: %v", err)
			}
			return
		}
		c, _ := eip3009.DecodeCall(*args.Input)
		digest := eip3009.AuthorizationDigest(eip3009.DomainSeparator(policy.TokenName, policy.TokenVersion, policy.ChainID, policy.Token), c.Authorization)
		if !eip3009.RecoverEOA(digest, c.Signature, crypto.PubkeyToAddress(payerKey.PublicKey)) || (c.Signature[64] != 27 && c.Signature[64] != 28) {
			t.Fatalf("signed a transfer whose signature %x is not the payer's", c.Signature)
		}
	})
}
