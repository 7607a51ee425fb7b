// Package eip3009 is the FiatToken (USDC) contract as the facilitator speaks to it: the calldata of
// the calls made to it, the decoding of its answers, the EIP-712 digest a payer signs, and its
// Transfer, AuthorizationUsed and AuthorizationCanceled logs. Verify, the settlement engine, the
// indexer and the simulator all encode and decode the token here, so they cannot disagree on it.
package eip3009

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/params"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The token's methods, by the names DecodeCall reports.
const (
	MethodTransferWithAuthorization = "transferWithAuthorization"
	MethodCancelAuthorization       = "cancelAuthorization"
	MethodAuthorizationState        = "authorizationState"
	MethodBalanceOf                 = "balanceOf"
	MethodTransfer                  = "transfer"
	MethodName                      = "name"
	MethodVersion                   = "version"
	MethodDecimals                  = "decimals"
	MethodDomainSeparator           = "DOMAIN_SEPARATOR"
)

// tokenABI is the part of FiatToken V2.2's ABI the facilitator and its simulator use. Parsed once,
// never written.
var tokenABI = mustABI(`[
	{"type":"function","name":"transferWithAuthorization","stateMutability":"nonpayable","inputs":[
		{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},
		{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},
		{"name":"v","type":"uint8"},{"name":"r","type":"bytes32"},{"name":"s","type":"bytes32"}],"outputs":[]},
	{"type":"function","name":"transferWithAuthorization","stateMutability":"nonpayable","inputs":[
		{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},
		{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},
		{"name":"signature","type":"bytes"}],"outputs":[]},
	{"type":"function","name":"cancelAuthorization","stateMutability":"nonpayable","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"},
		{"name":"v","type":"uint8"},{"name":"r","type":"bytes32"},{"name":"s","type":"bytes32"}],"outputs":[]},
	{"type":"function","name":"cancelAuthorization","stateMutability":"nonpayable","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"},{"name":"signature","type":"bytes"}],"outputs":[]},
	{"type":"function","name":"authorizationState","stateMutability":"view","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"}],"outputs":[{"name":"","type":"bool"}]},
	{"type":"function","name":"balanceOf","stateMutability":"view","inputs":[{"name":"account","type":"address"}],"outputs":[{"name":"","type":"uint256"}]},
	{"type":"function","name":"transfer","stateMutability":"nonpayable","inputs":[{"name":"to","type":"address"},{"name":"value","type":"uint256"}],"outputs":[{"name":"","type":"bool"}]},
	{"type":"function","name":"name","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"string"}]},
	{"type":"function","name":"version","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"string"}]},
	{"type":"function","name":"decimals","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"uint8"}]},
	{"type":"function","name":"DOMAIN_SEPARATOR","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"bytes32"}]}
	]`)

// GasLimit is the gas limit a settlement transaction is signed with, for an estimate: the
// estimate is exact only for the state it ran on.
func GasLimit(estimate uint64) uint64 { return estimate + estimate/4 }

// PayeeSetGas is how much more gas a transfer needs, at most, when its payee holds nothing than
// when it holds some: the token keeps an account's balance in one storage slot, and setting a
// slot from zero costs this much more than changing it (EIP-2200 with EIP-2929's prices).
const PayeeSetGas = params.SstoreSetGasEIP2200 - (params.SstoreResetGasEIP2200 - params.ColdSloadCostEIP2929)

// TransferCalldata encodes transferWithAuthorization for sig: the (v, r, s) overload for a 65-byte
// signature, with v normalised to 27/28, and USDC 2.2's bytes overload for anything else
// (ERC-1271 wallets).
func TransferCalldata(a facilitator.Authorization, sig []byte) []byte {
	if len(sig) == 65 {
		// Nine static words after the selector, laid out by hand: abi.Pack's reflection was about
		// 30 allocations on every /verify and /settle (TestTransferCalldataMatchesPack pins it).
		v, r, s := normalizeV(sig)
		data := make([]byte, 4+9*32)
		copy(data, transferVRSSelector[:])
		w := data[4:]
		copy(w[12:32], a.From[:])
		copy(w[32+12:64], a.To[:])
		a.Value.FillBytes(w[64:96])
		a.ValidAfter.FillBytes(w[96:128])
		a.ValidBefore.FillBytes(w[128:160])
		copy(w[160:192], a.Nonce[:])
		w[223] = v
		copy(w[224:256], r[:])
		copy(w[256:288], s[:])
		return data
	}
	// go-ethereum renames the second overload with a 0 suffix; its selector stays the real one (0xcf092995).
	return pack(MethodTransferWithAuthorization+"0", a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig)
}

// transferVRSSelector is transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)'s.
var transferVRSSelector = [4]byte(tokenABI.Methods[MethodTransferWithAuthorization].ID)

// CancelCalldata encodes cancelAuthorization(authorizer, nonce, v, r, s) for a 65-byte sig.
func CancelCalldata(authorizer common.Address, nonce [32]byte, sig []byte) []byte {
	v, r, s := normalizeV(sig)
	return pack(MethodCancelAuthorization, authorizer, nonce, v, r, s)
}

// AuthorizationStateCalldata encodes authorizationState(authorizer, nonce).
func AuthorizationStateCalldata(authorizer common.Address, nonce [32]byte) []byte {
	return pack(MethodAuthorizationState, authorizer, nonce)
}

// BalanceOfCalldata encodes balanceOf(account).
func BalanceOfCalldata(account common.Address) []byte { return pack(MethodBalanceOf, account) }

// ERC20TransferCalldata is transfer(to, value): a holder moving its own tokens.
func ERC20TransferCalldata(to common.Address, value *big.Int) []byte {
	return pack(MethodTransfer, to, value)
}

// NameCalldata encodes name(), the EIP-712 domain's name.
func NameCalldata() []byte { return pack(MethodName) }

// VersionCalldata encodes version(), the EIP-712 domain's version.
func VersionCalldata() []byte { return pack(MethodVersion) }

// DomainSeparatorCalldata encodes DOMAIN_SEPARATOR(), the EIP-712 domain hash the token checks
// signatures against (FiatToken computes it from its name, version, the chain id and its address).
func DomainSeparatorCalldata() []byte { return pack(MethodDomainSeparator) }

// DecimalsCalldata encodes decimals().
func DecimalsCalldata() []byte { return pack(MethodDecimals) }

// DecodeDecimals decodes decimals()'s answer.
func DecodeDecimals(out []byte) (uint8, bool) {
	vals, err := tokenABI.Unpack(MethodDecimals, out)
	if err != nil || len(vals) != 1 {
		return 0, false
	}
	d, ok := vals[0].(uint8)
	return d, ok
}

// DecodeDomainSeparator decodes DOMAIN_SEPARATOR's answer.
func DecodeDomainSeparator(out []byte) (common.Hash, bool) {
	vals, err := tokenABI.Unpack(MethodDomainSeparator, out)
	if err != nil || len(vals) != 1 {
		return common.Hash{}, false
	}
	h, ok := vals[0].([32]byte)
	return h, ok
}

// DecodeAuthorizationState decodes authorizationState's answer: whether the authorization is used
// or canceled. ok is false when the answer is not a bool.
func DecodeAuthorizationState(out []byte) (used, ok bool) {
	vals, err := tokenABI.Unpack(MethodAuthorizationState, out)
	if err != nil || len(vals) != 1 {
		return false, false
	}
	used, ok = vals[0].(bool)
	return used, ok
}

// DecodeBalance decodes balanceOf's answer.
func DecodeBalance(out []byte) (*big.Int, bool) {
	vals, err := tokenABI.Unpack(MethodBalanceOf, out)
	if err != nil || len(vals) != 1 {
		return nil, false
	}
	n, ok := vals[0].(*big.Int)
	return n, ok
}

// DecodeString decodes the answer of name() or version().
func DecodeString(out []byte) (string, bool) {
	vals, err := tokenABI.Unpack(MethodName, out)
	if err != nil || len(vals) != 1 {
		return "", false
	}
	s, ok := vals[0].(string)
	return s, ok
}

// Call is a decoded call of one of the token's methods.
type Call struct {
	Method string // one of the Method constants
	// Authorization is transferWithAuthorization's; for cancelAuthorization and
	// authorizationState only From (the authorizer) and Nonce are set.
	Authorization facilitator.Authorization
	// Account is balanceOf's account, or the ERC-20 transfer's recipient.
	Account common.Address
	// Value is the ERC-20 transfer's amount.
	Value *big.Int
	// Signature is transferWithAuthorization's and cancelAuthorization's signature as the token
	// checks it: r, s and v (65 bytes) for the (v, r, s) overload, the bytes of the other.
	Signature []byte
}

// DecodeCall decodes calldata of any of the token's methods (either overload); ok is false for
// anything else, or for arguments that do not decode.
func DecodeCall(data []byte) (Call, bool) {
	if len(data) < 4 {
		return Call{}, false
	}
	m, err := tokenABI.MethodById(data[:4])
	if err != nil {
		return Call{}, false
	}
	args, err := m.Inputs.Unpack(data[4:])
	if err != nil {
		return Call{}, false
	}
	c := Call{Method: m.RawName}
	switch m.RawName {
	case MethodTransferWithAuthorization:
		c.Authorization = facilitator.Authorization{From: args[0].(common.Address), To: args[1].(common.Address), Value: args[2].(*big.Int),
			ValidAfter: args[3].(*big.Int), ValidBefore: args[4].(*big.Int), Nonce: args[5].([32]byte)}
		c.Signature = signatureArg(args[6:])
	case MethodCancelAuthorization, MethodAuthorizationState:
		c.Authorization = facilitator.Authorization{From: args[0].(common.Address), Nonce: args[1].([32]byte)}
		if m.RawName == MethodCancelAuthorization {
			c.Signature = signatureArg(args[2:])
		}
	case MethodBalanceOf:
		c.Account = args[0].(common.Address)
	case MethodTransfer:
		c.Account, c.Value = args[0].(common.Address), args[1].(*big.Int)
	}
	return c, true
}

// signatureArg is the signature of a call's trailing arguments: (v, r, s) as r‖s‖v, or bytes.
func signatureArg(args []any) []byte {
	if len(args) == 3 {
		v, r, s := args[0].(uint8), args[1].([32]byte), args[2].([32]byte)
		return append(append(append(make([]byte, 0, 65), r[:]...), s[:]...), v)
	}
	return args[0].([]byte)
}

// EncodeAnswer is the ABI encoding of what method returns, for a contract that answers as the
// token does (the simulator): vals are the method's outputs.
func EncodeAnswer(method string, vals ...any) ([]byte, error) {
	m, ok := tokenABI.Methods[method]
	if !ok {
		return nil, fmt.Errorf("eip3009: no method %s", method)
	}
	return m.Outputs.Pack(vals...)
}

func pack(method string, args ...any) []byte {
	data, err := tokenABI.Pack(method, args...)
	if err != nil {
		panic(fmt.Sprintf("eip3009: packing %s: %v", method, err)) // only on a programming error
	}
	return data
}

func mustABI(s string) abi.ABI {
	a, err := abi.JSON(strings.NewReader(s))
	if err != nil {
		panic(err)
	}
	return a
}
