package extsigner

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// Policy is what the narrow signer signs: nothing but settlements, that is a call of the token's
// transferWithAuthorization, or a batch of them (Multicall3's aggregate3 at its canonical address,
// every inner call such a call allowed to fail on its own), sending no value, on one chain, within
// gas and fee ceilings, each call carrying an authorization its payer signed (the EIP-712
// signature recovers to its from, in the token's domain). A facilitator that is compromised can
// then spend the key's gas only on calls of authorizations payers signed, at bounded fees and at
// most Window's transactions and gas per period: not on arbitrary calls, deployments, transfers of
// the key's native balance, or calls it made up. It can still submit a real authorization that
// reverts (used already, expired, the payer's balance short), which only the chain can tell: the
// window bounds those.
type Policy struct {
	ChainID uint64
	Token   common.Address
	// TokenName and TokenVersion are the token's EIP-712 domain name and version (with ChainID and
	// Token, its domain): the authorizations' signatures are checked in it.
	TokenName, TokenVersion string
	// AllowContractWallets signs authorizations whose signature this signer cannot check without
	// the chain: a contract wallet's (ERC-1271: a signature that is not 65 bytes, or one of 65 that
	// does not recover to the payer; ERC-6492 wrappers are not 65 bytes). Off, they are refused.
	AllowContractWallets bool
	// MaxGas is the highest gas limit signed per settlement: a lone one's, and a batch's divided
	// by its calls (a batch of n may use n times MaxGas).
	MaxGas uint64
	// MaxFeeCap is the highest fee per gas signed (maxFeePerGas, or gasPrice of a legacy
	// transaction), in wei.
	MaxFeeCap *big.Int
	// Window bounds the transactions and gas signed per period, across the keys (the server's,
	// not Check's: Check is a pure function of one transaction). Zero fields are DefaultWindow's.
	Window Window
}

// ErrRefused is the narrow signer's "no": the transaction is outside its policy, or past its window's bounds.
var ErrRefused = errors.New("refused by the signer's policy")

// MaxBatchCalls is the most calls a batch signed may hold: a network's batch policy allows no
// more (facilitator.BatchPolicy).
const MaxBatchCalls = 100

// Check returns the unsigned transaction args describe when the policy allows it, and otherwise
// an error (wrapping ErrRefused) saying what is outside the policy. It is a pure function of args.
func (p Policy) Check(args *apitypes.SendTxArgs) (types.TxData, error) {
	refuse := func(format string, a ...any) (types.TxData, error) {
		return nil, fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
	}
	chainID := new(big.Int).SetUint64(p.ChainID)
	switch {
	case args.ChainID == nil:
		return refuse("no chainId (this signer signs only for chain %d)", p.ChainID)
	case args.ChainID.ToInt().Cmp(chainID) != 0:
		return refuse("chainId %s is not this signer's chain %d", args.ChainID.ToInt(), p.ChainID)
	case args.To == nil:
		return refuse("a contract deployment (no to address)")
	case args.To.Address() != p.Token && args.To.Address() != multicall3.Address:
		return refuse("to %s is not the token %s (nor Multicall3 %s)", args.To.Address(), p.Token, multicall3.Address)
	case args.Value.ToInt().Sign() != 0:
		return refuse("value %s wei is not zero", args.Value.ToInt())
	case args.Gas == 0:
		return refuse("gas 0")
	case args.AccessList != nil && len(*args.AccessList) > 0, args.BlobFeeCap != nil, len(args.BlobHashes) > 0, len(args.Blobs) > 0:
		return refuse("only dynamic-fee (type 2) or legacy transactions are signed")
	case args.Data != nil && args.Input != nil && string(*args.Data) != string(*args.Input):
		return refuse("data and input differ")
	}
	data := args.Input
	if data == nil {
		data = args.Data
	}
	if data == nil {
		return refuse("no calldata: only transferWithAuthorization is signed")
	}
	to := args.To.Address()
	calls := uint64(1)
	if to == multicall3.Address {
		n, err := p.checkBatch(*data)
		if err != nil {
			return nil, err
		}
		calls = n
	} else if c, ok := transfer(*data); !ok {
		return refuse("the calldata is not a transferWithAuthorization call")
	} else if why := p.checkAuthorization(p.domain(), c); why != "" {
		return refuse("%s", why)
	}
	if uint64(args.Gas) > p.MaxGas*calls {
		return refuse("gas %d is not within 1..%d (%d per settlement, %d settlements)", uint64(args.Gas), p.MaxGas*calls, p.MaxGas, calls)
	}
	switch {
	case args.MaxFeePerGas != nil && args.GasPrice == nil:
		if args.MaxPriorityFeePerGas == nil {
			return refuse("maxFeePerGas without maxPriorityFeePerGas")
		}
		fee, tip := args.MaxFeePerGas.ToInt(), args.MaxPriorityFeePerGas.ToInt()
		if fee.Cmp(p.MaxFeeCap) > 0 {
			return refuse("maxFeePerGas %s wei is over the ceiling %s", fee, p.MaxFeeCap)
		}
		if tip.Sign() < 0 || tip.Cmp(fee) > 0 {
			return refuse("maxPriorityFeePerGas %s wei is not within 0..maxFeePerGas", tip)
		}
		return &types.DynamicFeeTx{ChainID: chainID, Nonce: uint64(args.Nonce), GasTipCap: tip, GasFeeCap: fee,
			Gas: uint64(args.Gas), To: &to, Data: *data}, nil
	case args.GasPrice != nil && args.MaxFeePerGas == nil && args.MaxPriorityFeePerGas == nil:
		price := args.GasPrice.ToInt()
		if price.Cmp(p.MaxFeeCap) > 0 {
			return refuse("gasPrice %s wei is over the ceiling %s", price, p.MaxFeeCap)
		}
		return &types.LegacyTx{Nonce: uint64(args.Nonce), GasPrice: price, Gas: uint64(args.Gas), To: &to, Data: *data}, nil
	default:
		return refuse("give either maxFeePerGas and maxPriorityFeePerGas, or gasPrice")
	}
}

// transfer is data decoded when it is a transferWithAuthorization call.
func transfer(data []byte) (eip3009.Call, bool) {
	c, ok := eip3009.DecodeCall(data)
	return c, ok && c.Method == eip3009.MethodTransferWithAuthorization
}

func (p Policy) domain() common.Hash {
	return eip3009.DomainSeparator(p.TokenName, p.TokenVersion, p.ChainID, p.Token)
}

// checkAuthorization is why the signer does not sign c, a transferWithAuthorization call, or ""
// when it does: its signature must be its payer's, by the token's own rule for an EOA (a 65-byte
// r, s, v with v 27 or 28 and s in the lower half, recovering to from over the EIP-712 digest in
// the token's domain). Anything else can only be a contract wallet's, which the token asks the
// wallet about (ERC-1271): signed only when AllowContractWallets. The refusal names the payer and
// nothing of the signature.
func (p Policy) checkAuthorization(domain common.Hash, c eip3009.Call) string {
	a, sig := c.Authorization, c.Signature
	if len(sig) != 65 {
		if p.AllowContractWallets {
			return ""
		}
		return fmt.Sprintf("the authorization of %s carries a %d-byte signature, a contract wallet's (ERC-1271 or ERC-6492), which this signer cannot check (signed only with --allow-contract-wallets)", a.From, len(sig))
	}
	v, r, s := sig[64], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:64])
	// v 0 or 1, or s in the upper half, would recover here and revert on chain (the token's
	// ecrecover refuses them).
	if (v == 27 || v == 28) && crypto.ValidateSignatureValues(v-27, r, s, true) &&
		eip3009.RecoverEOA(eip3009.AuthorizationDigest(domain, a), sig, a.From) {
		return ""
	}
	if p.AllowContractWallets {
		return "" // perhaps a contract wallet's 65-byte signature: only the chain can tell
	}
	return fmt.Sprintf("the authorization's signature does not recover to its from %s in the token's EIP-712 domain (a contract wallet's is signed only with --allow-contract-wallets)", a.From)
}

// checkBatch returns how many settlements Multicall3 calldata holds when it is a batch the policy
// signs: aggregate3 in its canonical encoding (what Aggregate3Calldata of its decoded calls
// gives, byte for byte: no trailing bytes, no aliased or out-of-order offsets a lenient decoder
// might read differently from the contract), of 1..MaxBatchCalls calls, each one allowFailure
// (a reverting call must not take the others along) and a transferWithAuthorization call to the
// token of an authorization its payer signed (checkAuthorization), none repeated (the repeat could
// only revert). A call to anything else, Multicall3 itself included (a nested batch), is refused.
func (p Policy) checkBatch(data []byte) (uint64, error) {
	refuse := func(format string, a ...any) (uint64, error) {
		return 0, fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
	}
	calls, ok := multicall3.DecodeAggregate3Calldata(data)
	switch {
	case !ok:
		return refuse("the calldata to Multicall3 is not an aggregate3 call")
	case len(calls) == 0 || len(calls) > MaxBatchCalls:
		return refuse("a batch of %d calls (1..%d are signed)", len(calls), MaxBatchCalls)
	case !bytes.Equal(multicall3.Aggregate3Calldata(calls), data):
		return refuse("the aggregate3 calldata is not in its canonical encoding")
	}
	domain := p.domain()
	type authorization struct {
		from  common.Address
		nonce [32]byte
	}
	seen := make(map[authorization]int, len(calls))
	for i, c := range calls {
		tc, ok := transfer(c.CallData)
		switch {
		case !c.AllowFailure:
			return refuse("call %d of the batch does not allow failure", i)
		case c.Target != p.Token:
			return refuse("call %d of the batch targets %s, not the token %s", i, c.Target, p.Token)
		case !ok:
			return refuse("call %d of the batch is not a transferWithAuthorization call", i)
		}
		k := authorization{tc.Authorization.From, tc.Authorization.Nonce}
		if j, dup := seen[k]; dup {
			return refuse("call %d of the batch repeats call %d's authorization", i, j)
		}
		seen[k] = i
		if why := p.checkAuthorization(domain, tc); why != "" {
			return refuse("call %d of the batch: %s", i, why)
		}
	}
	return uint64(len(calls)), nil
}
