package ethrpc

import (
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
)

// Receipt is a transaction receipt as the engine reads it, decoded into only what its decisions
// and reports use. A watcher reads every receipt of every block (eth_getBlockReceipts), and
// go-ethereum's types.Receipt decodes each in full (the 256-byte bloom, every log's fields, its
// own validation): that decoding was the largest share of the facilitator's CPU while settling.
// A null answer decodes into a nil *Receipt.
type Receipt struct {
	TxHash common.Hash `json:"transactionHash"`
	// Status is 1 for success, 0 for a revert (post-Byzantium receipts).
	Status hexutil.Uint64 `json:"status"`
	// BlockNumber is nil in a node's answer for a transaction not in a block.
	BlockNumber       *hexutil.Uint64 `json:"blockNumber"`
	BlockHash         common.Hash     `json:"blockHash"`
	TxIndex           hexutil.Uint64  `json:"transactionIndex"`
	GasUsed           hexutil.Uint64  `json:"gasUsed"`
	EffectiveGasPrice *hexutil.Big    `json:"effectiveGasPrice"`
	Logs              []Log           `json:"logs"`
}

// Log is a receipt's log: the emitter, topics and data (no bloom, indexes or positions).
type Log struct {
	Address common.Address `json:"address"`
	Topics  []common.Hash  `json:"topics"`
	Data    hexutil.Bytes  `json:"data"`
}

// Succeeded reports a receipt of a transaction that did not revert.
func (r *Receipt) Succeeded() bool { return r.Status == 1 }
