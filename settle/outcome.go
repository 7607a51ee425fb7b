package settle

import (
	"bytes"
	"context"
	"errors"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// Expected is what a settlement's transaction must do: move value from the payer to payTo under
// the authorization in Key, before ValidBefore.
type Expected struct {
	ID          int64
	Key         facilitator.AuthorizationKey
	PayTo       common.Address
	Value       *big.Int
	ValidBefore *big.Int
}

// ExpectedOf is what the ledger row s expects of its transactions.
func ExpectedOf(s *facilitator.Settlement) Expected {
	return Expected{ID: s.ID, Key: s.Key, PayTo: s.PayTo, Value: s.Value, ValidBefore: s.ValidBefore}
}

// ReceiptOutcome turns a receipt of one of our transactions into the settlement's outcome. It is
// the only classifier: the watcher and reconcile both use it, so the same receipt always becomes
// the same state. A revert is explained from the chain in one batch: the authorization used by
// someone else, expired by the time of the block that mined it (not the head's, which would call
// a plain failure expired once enough time passed), or a plain failure.
func ReceiptOutcome(ctx context.Context, batch func(context.Context, []rpc.BatchElem) error, want Expected, rcpt *types.Receipt) (Resolution, error) {
	res := Resolution{ID: want.ID, TxHash: rcpt.TxHash, BlockNumber: rcpt.BlockNumber.Uint64(), BlockHash: rcpt.BlockHash}
	if rcpt.Status == types.ReceiptStatusSuccessful {
		res.State = facilitator.StateMined
		if !transferLogged(rcpt, want) {
			res.ErrorReason = facilitator.ReasonTransferEventMismatch
			res.ErrorMessage = "the transaction succeeded without the expected Transfer event"
		}
		return res, nil
	}
	var state hexutil.Bytes
	var block struct {
		Time hexutil.Uint64 `json:"timestamp"`
	}
	call := map[string]any{"to": want.Key.Asset, "input": hexutil.Bytes(verify.AuthorizationStateCalldata(want.Key.Payer, want.Key.Nonce))}
	elems := []rpc.BatchElem{
		{Method: "eth_call", Args: []any{call, "latest"}, Result: &state},
		{Method: "eth_getBlockByHash", Args: []any{rcpt.BlockHash, false}, Result: &block},
	}
	if err := batch(ctx, elems); err != nil {
		return Resolution{}, err
	}
	for _, el := range elems {
		if el.Error != nil {
			return Resolution{}, el.Error
		}
	}
	used := len(state) == 32 && state[31] == 1
	switch {
	case used:
		res.State = facilitator.StateSettledElsewhere
		res.ErrorReason = facilitator.ReasonNonceAlreadyUsed
		res.ErrorMessage = "the authorization was used by another transaction before ours"
	case block.Time == 0:
		// The block is gone (a reorg under us): no outcome yet; the next round reads the new one.
		return Resolution{}, errBlockGone
	case want.ValidBefore != nil && new(big.Int).SetUint64(uint64(block.Time)).Cmp(want.ValidBefore) >= 0:
		res.State = facilitator.StateExpired
		res.ErrorReason = facilitator.ReasonValidBefore
		res.ErrorMessage = "the authorization expired before the transaction was mined"
	default:
		res.State = facilitator.StateReverted
		res.ErrorReason = facilitator.ReasonTransactionFailed
		res.ErrorMessage = "the transaction reverted"
	}
	return res, nil
}

var errBlockGone = errors.New("the receipt's block is no longer on the chain")

func transferLogged(rcpt *types.Receipt, want Expected) bool {
	for _, l := range rcpt.Logs {
		if l.Address == want.Key.Asset && len(l.Topics) == 3 && l.Topics[0] == transferTopic &&
			common.BytesToAddress(l.Topics[1][:]) == want.Key.Payer && common.BytesToAddress(l.Topics[2][:]) == want.PayTo &&
			want.Value != nil && bytes.Equal(l.Data, common.LeftPadBytes(want.Value.Bytes(), 32)) {
			return true
		}
	}
	return false
}
