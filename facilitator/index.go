package facilitator

import (
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// The index's rows: the token events the indexer decodes from every block, and the block
// identities it keeps to detect reorgs. Status and reconcile read them back.

// LogPosition locates a log on chain.
type LogPosition struct {
	BlockNumber uint64
	BlockHash   common.Hash
	BlockTime   time.Time // zero when the node does not report it
	TxHash      common.Hash
	LogIndex    uint
	Token       common.Address
}

// Transfer is an indexed ERC-20 Transfer.
type Transfer struct {
	LogPosition
	From, To common.Address
	Value    *big.Int
}

// AuthorizationEvent is an indexed AuthorizationUsed or AuthorizationCanceled.
type AuthorizationEvent struct {
	LogPosition
	Canceled   bool
	Authorizer common.Address
	Nonce      [32]byte
}

// Events are decoded logs.
type Events struct {
	Transfers []Transfer
	Auths     []AuthorizationEvent
}

// Len is the number of events.
func (e Events) Len() int { return len(e.Transfers) + len(e.Auths) }

// Block is a block's identity, kept for the unfinalized window to detect reorgs.
type Block struct {
	Number     uint64
	Hash       common.Hash
	ParentHash common.Hash
}

// IndexBatch is what one step of the indexer writes, in one transaction: optionally a rollback of
// everything above a common ancestor (a reorg), then the new events, the new window blocks, and
// the cursor (the last block whose logs are all stored).
type IndexBatch struct {
	RollbackTo *Block
	Events     Events
	Blocks     []Block
	Cursor     Block
}

// AuthorizationUse is an indexed AuthorizationUsed or AuthorizationCanceled, with the transfer the use made.
type AuthorizationUse struct {
	Canceled    bool
	BlockNumber uint64
	BlockHash   common.Hash
	TxHash      common.Hash
	To          common.Address // zero when the transaction made no transfer from the authorizer
	Value       *big.Int
}
