package settle

import (
	"bytes"
	"math/big"

	"github.com/ethereum/go-ethereum/common"

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
