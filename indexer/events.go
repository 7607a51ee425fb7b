package indexer

import (
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The three events indexed for every configured EIP-3009 token.
var (
	TransferTopic              = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))
	AuthorizationUsedTopic     = crypto.Keccak256Hash([]byte("AuthorizationUsed(address,bytes32)"))
	AuthorizationCanceledTopic = crypto.Keccak256Hash([]byte("AuthorizationCanceled(address,bytes32)"))
)

// Decode turns logs into events. Logs that are not one of the three events, or are malformed (a
// token emitting a Transfer with other indexing), are skipped: the index never guesses.
func Decode(logs []types.Log) facilitator.Events {
	var ev facilitator.Events
	for _, l := range logs {
		if len(l.Topics) == 0 || l.Removed {
			continue
		}
		pos := facilitator.LogPosition{BlockNumber: l.BlockNumber, BlockHash: l.BlockHash, TxHash: l.TxHash, LogIndex: l.Index, Token: l.Address}
		if l.BlockTimestamp != 0 {
			pos.BlockTime = time.Unix(int64(l.BlockTimestamp), 0).UTC()
		}
		switch l.Topics[0] {
		case TransferTopic:
			if len(l.Topics) != 3 || len(l.Data) != 32 {
				continue
			}
			ev.Transfers = append(ev.Transfers, facilitator.Transfer{LogPosition: pos,
				From: common.BytesToAddress(l.Topics[1][:]), To: common.BytesToAddress(l.Topics[2][:]),
				Value: new(big.Int).SetBytes(l.Data)})
		case AuthorizationUsedTopic, AuthorizationCanceledTopic:
			// authorizer is indexed, the nonce is indexed too in FiatToken (both topics).
			if len(l.Topics) != 3 {
				continue
			}
			ev.Auths = append(ev.Auths, facilitator.AuthorizationEvent{LogPosition: pos, Canceled: l.Topics[0] == AuthorizationCanceledTopic,
				Authorizer: common.BytesToAddress(l.Topics[1][:]), Nonce: l.Topics[2]})
		}
	}
	return ev
}
