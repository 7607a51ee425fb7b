package indexer

import (
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
)

// Position locates a log on chain.
type Position struct {
	BlockNumber uint64
	BlockHash   common.Hash
	BlockTime   time.Time // zero when the node does not report it
	TxHash      common.Hash
	LogIndex    uint
	Token       common.Address
}

// Transfer is an indexed ERC-20 Transfer.
type Transfer struct {
	Position
	From, To common.Address
	Value    *big.Int
}

// AuthEvent is an indexed AuthorizationUsed or AuthorizationCanceled.
type AuthEvent struct {
	Position
	Canceled   bool
	Authorizer common.Address
	Nonce      [32]byte
}

// Events are decoded logs.
type Events struct {
	Transfers []Transfer
	Auths     []AuthEvent
}

// Len is the number of events.
func (e Events) Len() int { return len(e.Transfers) + len(e.Auths) }

// Decode turns logs into events. Logs that are not one of the three events (eip3009), or are malformed (a
// token emitting a Transfer with other indexing), are skipped: the index never guesses.
func Decode(logs []types.Log) Events {
	var ev Events
	for i := range logs {
		l := &logs[i]
		if len(l.Topics) == 0 || l.Removed {
			continue
		}
		pos := Position{BlockNumber: l.BlockNumber, BlockHash: l.BlockHash, TxHash: l.TxHash, LogIndex: l.Index, Token: l.Address}
		if l.BlockTimestamp != 0 {
			pos.BlockTime = time.Unix(int64(l.BlockTimestamp), 0).UTC()
		}
		if from, to, value, ok := eip3009.DecodeTransfer(l); ok {
			ev.Transfers = append(ev.Transfers, Transfer{Position: pos, From: from, To: to, Value: value})
		} else if authorizer, nonce, canceled, ok := eip3009.DecodeAuthorization(l); ok {
			ev.Auths = append(ev.Auths, AuthEvent{Position: pos, Canceled: canceled, Authorizer: authorizer, Nonce: nonce})
		}
	}
	return ev
}
