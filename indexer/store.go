package indexer

import (
	"context"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
)

// Block is a block's identity, kept for the unfinalized window to detect reorgs.
type Block struct {
	Number     uint64
	Hash       common.Hash
	ParentHash common.Hash
}

// Batch is what one step of the indexer writes, in one transaction: optionally a rollback of
// everything above a common ancestor (a reorg), then the new events, the new window blocks, and
// the cursor (the last block whose logs are all stored).
type Batch struct {
	RollbackTo *Block
	Events     Events
	Blocks     []Block
	Cursor     Block
}

// Store is the index's storage.
type Store interface {
	// Lead waits until this process is the network's indexer (a Postgres advisory lock held on a
	// dedicated connection) or ctx ends. The lease lasts until release, or until the connection
	// dies, which is how a crashed leader's replica takes over; leading is canceled then, so a
	// leader that lost its lock stops writing.
	Lead(ctx context.Context, network string) (leading context.Context, release func(), err error)
	// Cursor is the last indexed block; ok is false before the first commit.
	Cursor(ctx context.Context, network string) (b Block, ok bool, err error)
	Commit(ctx context.Context, network string, b Batch) error
	// WindowBlocks are the stored blocks from number from upward, ascending.
	WindowBlocks(ctx context.Context, network string, from uint64) ([]Block, error)
	PruneBlocks(ctx context.Context, network string, below uint64) error
}

// Use is an indexed AuthorizationUsed or AuthorizationCanceled, with the transfer the use made.
type Use struct {
	Canceled    bool
	BlockNumber uint64
	BlockHash   common.Hash
	TxHash      common.Hash
	To          common.Address // zero when the transaction made no transfer from the authorizer
	Value       *big.Int
}
