package extsigner

import (
	"errors"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
)

// Policy is what the narrow signer signs: nothing but a settlement, that is a call of the token's
// transferWithAuthorization, sending no value, on one chain, within gas and fee ceilings. A
// facilitator that is compromised can then spend the key's gas only on transfers the payers
// themselves authorized, at bounded fees: not on arbitrary calls, deployments or transfers of the
// key's native balance.
type Policy struct {
	ChainID uint64
	Token   common.Address
	// MaxGas is the highest gas limit signed.
	MaxGas uint64
	// MaxFeeCap is the highest fee per gas signed (maxFeePerGas, or gasPrice of a legacy
	// transaction), in wei.
	MaxFeeCap *big.Int
}

// ErrRefused is the narrow signer's "no": the transaction is outside its policy.
var ErrRefused = errors.New("refused by the signer's policy")

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
	case args.To.Address() != p.Token:
		return refuse("to %s is not the token %s", args.To.Address(), p.Token)
	case args.Value.ToInt().Sign() != 0:
		return refuse("value %s wei is not zero", args.Value.ToInt())
	case args.Gas == 0 || uint64(args.Gas) > p.MaxGas:
		return refuse("gas %d is not within 1..%d", uint64(args.Gas), p.MaxGas)
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
	if c, ok := eip3009.DecodeCall(*data); !ok || c.Method != eip3009.MethodTransferWithAuthorization {
		return refuse("the calldata is not a transferWithAuthorization call")
	}
	to := p.Token
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
