package settle

import (
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
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
	// when this call reverted. What a receipt did is read the same either way (effect); Batched
	// names the failure: batch_call_failed rather than a plain revert.
	Batched bool
}

// ExpectedOf is what the open ledger row s expects of its transactions. It is a batch member when
// its transactions call Multicall3, as the engine's own flights are (flight.go): the receipt is
// then read for the member's call alone, never as a lone settlement's.
func ExpectedOf(s *facilitator.OpenSettlement) (Expected, error) {
	want := Expected{ID: s.ID, Key: s.Key, PayTo: s.PayTo, Value: s.Value, ValidBefore: s.ValidBefore}
	for _, x := range s.Txs {
		var tx types.Transaction
		if err := tx.UnmarshalBinary(x.Raw); err != nil {
			return Expected{}, err
		}
		want.Batched = want.Batched || (tx.To() != nil && *tx.To() == multicall3.Address)
	}
	return want, nil
}

// effect is what a receipt did to want's authorization, by the one rule every reader of a receipt
// applies (eip3009.EffectOf).
func effect(r *ethrpc.Receipt, want Expected) eip3009.Effect {
	logs := make([]*types.Log, len(r.Logs))
	for i, l := range r.Logs {
		logs[i] = &types.Log{Address: l.Address, Topics: l.Topics, Data: l.Data}
	}
	e, _ := eip3009.EffectOf(r.Succeeded(), logs, want.Key, want.PayTo, want.Value)
	return e
}
