package settle

import (
	"bytes"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Expected is what a settlement's transaction must do: move value from the payer to payTo under
// the authorization in Key, before ValidBefore.
type Expected struct {
	ID          int64
	Key         facilitator.AuthorizationKey
	PayTo       common.Address
	Value       *big.Int
	ValidBefore *big.Int
	// Batched: the settlement's call is one of a Multicall3 batch's, whose receipt succeeds even
	// when this call reverted: only the authorization's own AuthorizationUsed+Transfer pair says
	// it transferred (memberTransfer).
	Batched bool
}

// ExpectedOf is what the ledger row s expects of its transactions.
func ExpectedOf(s *facilitator.Settlement) Expected {
	return Expected{ID: s.ID, Key: s.Key, PayTo: s.PayTo, Value: s.Value, ValidBefore: s.ValidBefore}
}

// transferLogged reports whether rcpt holds the Transfer log want expects: a receipt with status
// 1 without it is mined with ReasonTransferEventMismatch (sendstate.go).
func transferLogged(rcpt *ethrpc.Receipt, want Expected) bool {
	for _, l := range rcpt.Logs {
		if l.Address == want.Key.Asset && len(l.Topics) == 3 && l.Topics[0] == eip3009.TransferTopic &&
			common.BytesToAddress(l.Topics[1][:]) == want.Key.Payer && common.BytesToAddress(l.Topics[2][:]) == want.PayTo &&
			want.Value != nil && bytes.Equal(l.Data, common.LeftPadBytes(want.Value.Bytes(), 32)) {
			return true
		}
	}
	return false
}

// memberTransfer reports whether a batch's receipt holds want's own AuthorizationUsed+Transfer
// pair (eip3009.UsedBy), and whether that transfer paid what want expects. Several members can
// move the same value between the same addresses, so a Transfer log alone proves nothing.
func memberTransfer(rcpt *ethrpc.Receipt, want Expected) (used, paid bool) {
	logs := make([]*types.Log, len(rcpt.Logs))
	for i, l := range rcpt.Logs {
		logs[i] = &types.Log{Address: l.Address, Topics: l.Topics, Data: l.Data}
	}
	tr, ok := eip3009.UsedBy(logs, want.Key.Asset, want.Key.Payer, want.Key.Nonce)
	if !ok {
		return false, false
	}
	return true, tr.To == want.PayTo && want.Value != nil && tr.Value != nil && tr.Value.Cmp(want.Value) == 0
}
