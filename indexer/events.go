package indexer

import (
	"time"

	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Decode turns logs into events. Logs that are not one of the three events (eip3009), or are
// malformed (a token emitting a facilitator.Transfer with other indexing), are skipped: the index never guesses.
func Decode(logs []types.Log) facilitator.Events {
	var ev facilitator.Events
	for i := range logs {
		l := &logs[i]
		if len(l.Topics) == 0 || l.Removed {
			continue
		}
		pos := facilitator.LogPosition{BlockNumber: l.BlockNumber, BlockHash: l.BlockHash, TxHash: l.TxHash, LogIndex: l.Index, Token: l.Address}
		if l.BlockTimestamp != 0 {
			pos.BlockTime = time.Unix(int64(l.BlockTimestamp), 0).UTC()
		}
		if from, to, value, ok := eip3009.DecodeTransfer(l); ok {
			ev.Transfers = append(ev.Transfers, facilitator.Transfer{LogPosition: pos, From: from, To: to, Value: value})
		} else if authorizer, nonce, canceled, ok := eip3009.DecodeAuthorization(l); ok {
			ev.Auths = append(ev.Auths, facilitator.AuthorizationEvent{LogPosition: pos, Canceled: canceled, Authorizer: authorizer, Nonce: nonce})
		}
	}
	return ev
}
