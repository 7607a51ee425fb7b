package eip3009

import (
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The token's event topics, as FiatToken emits them.
var (
	TransferTopic              = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))
	AuthorizationUsedTopic     = crypto.Keccak256Hash([]byte("AuthorizationUsed(address,bytes32)"))
	AuthorizationCanceledTopic = crypto.Keccak256Hash([]byte("AuthorizationCanceled(address,bytes32)"))
)

// DecodeTransfer decodes an ERC-20 Transfer log. ok is false for any other log, and for a
// Transfer indexed otherwise (an ERC-721's, one with an unindexed recipient): it is never guessed.
func DecodeTransfer(l *types.Log) (from, to common.Address, value *big.Int, ok bool) {
	if len(l.Topics) != 3 || l.Topics[0] != TransferTopic || len(l.Data) != 32 {
		return common.Address{}, common.Address{}, nil, false
	}
	return common.BytesToAddress(l.Topics[1][:]), common.BytesToAddress(l.Topics[2][:]), new(big.Int).SetBytes(l.Data), true
}

// DecodeAuthorization decodes an AuthorizationUsed or AuthorizationCanceled log (FiatToken indexes
// both the authorizer and the nonce). ok is false for any other log.
func DecodeAuthorization(l *types.Log) (authorizer common.Address, nonce [32]byte, canceled, ok bool) {
	if len(l.Topics) != 3 || (l.Topics[0] != AuthorizationUsedTopic && l.Topics[0] != AuthorizationCanceledTopic) {
		return common.Address{}, [32]byte{}, false, false
	}
	return common.BytesToAddress(l.Topics[1][:]), l.Topics[2], l.Topics[0] == AuthorizationCanceledTopic, true
}

// TransferLog is the Transfer log token emits for value moved from from to to.
func TransferLog(token, from, to common.Address, value *big.Int) *types.Log {
	return &types.Log{Address: token, Topics: []common.Hash{TransferTopic, addressTopic(from), addressTopic(to)},
		Data: common.LeftPadBytes(value.Bytes(), 32)}
}

// AuthorizationLog is the AuthorizationUsed (or, canceled, AuthorizationCanceled) log token emits.
func AuthorizationLog(token, authorizer common.Address, nonce [32]byte, canceled bool) *types.Log {
	topic := AuthorizationUsedTopic
	if canceled {
		topic = AuthorizationCanceledTopic
	}
	return &types.Log{Address: token, Topics: []common.Hash{topic, addressTopic(authorizer), nonce}, Data: []byte{}}
}

// AuthorizationTopics is the topic filter (eth_getLogs, indexed arguments in order) of the
// AuthorizationUsed and AuthorizationCanceled logs of one authorization.
func AuthorizationTopics(authorizer common.Address, nonce [32]byte) [][]common.Hash {
	return [][]common.Hash{{AuthorizationUsedTopic, AuthorizationCanceledTopic}, {addressTopic(authorizer)}, {nonce}}
}

func addressTopic(a common.Address) common.Hash { return common.BytesToHash(a[:]) }

// Transfer is a Transfer log's content.
type Transfer struct {
	From, To common.Address
	Value    *big.Int
}

// UsedBy finds, in a receipt's logs, the transfer the authorization (authorizer, nonce) made on
// token: FiatToken marks an authorization used (AuthorizationUsed) and then moves the value
// (Transfer), one log right after the other. In a batch transaction several authorizations can
// move the same value between the same addresses, so a Transfer alone says nothing about which
// authorization made it; the pair does. ok is false when the authorization made no transfer here.
func UsedBy(logs []*types.Log, token, authorizer common.Address, nonce [32]byte) (Transfer, bool) {
	for i, l := range logs {
		if l.Address != token || len(l.Topics) != 3 || l.Topics[0] != AuthorizationUsedTopic ||
			common.BytesToAddress(l.Topics[1][:]) != authorizer || l.Topics[2] != nonce {
			continue
		}
		if i+1 >= len(logs) || logs[i+1].Address != token {
			return Transfer{}, false
		}
		from, to, value, ok := DecodeTransfer(logs[i+1])
		if !ok || from != authorizer {
			return Transfer{}, false
		}
		return Transfer{From: from, To: to, Value: value}, true
	}
	return Transfer{}, false
}

// Effect is what one mined transaction did to one authorization, read from its receipt alone.
type Effect int

const (
	// NotUsed: the transaction reverted, or it succeeded without the authorization's own
	// AuthorizationUsed+Transfer pair (its call reverted inside a batch, which still succeeds, or
	// it never made that call). Either way this transaction moved nothing for the authorization.
	NotUsed Effect = iota
	// Paid: the pair is there and moved the expected value from the payer to the expected payee.
	Paid
	// PaidOther: the pair is there, but it moved another value or paid another address.
	PaidOther
)

// EffectOf is THE reading of a receipt for one authorization, lone settlement or batch member
// alike: the engine's watcher, the reconcile job (through settle.Judge) and the ledger check all
// decide by it, so that they cannot disagree about what a receipt means. Only the pair proves a
// transfer: in a batch several members can move the same value between the same addresses, and
// a receipt's status says only that the batch as a whole did not revert.
func EffectOf(succeeded bool, logs []*types.Log, key facilitator.AuthorizationKey, payTo common.Address, value *big.Int) (Effect, Transfer) {
	if !succeeded {
		return NotUsed, Transfer{}
	}
	tr, ok := UsedBy(logs, key.Asset, key.Payer, key.Nonce)
	switch {
	case !ok:
		return NotUsed, Transfer{}
	case tr.To == payTo && value != nil && tr.Value != nil && tr.Value.Cmp(value) == 0:
		return Paid, tr
	}
	return PaidOther, tr
}
