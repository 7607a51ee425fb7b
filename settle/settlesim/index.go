package settlesim

import (
	"context"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Index is the block index as a correct indexer keeps it: the canonical chain's authorization
// uses up to a cursor that lags the head by a number of blocks the driver sets, following every
// reorganisation (the indexer's own faults are its tests'; here the index is what the jobs and
// the status answers read).
type Index struct {
	chain *Chain
	lag   uint64
}

// NewIndex is an index of c at its head.
func NewIndex(c *Chain) *Index { return &Index{chain: c} }

// SetLag puts the cursor lag blocks below the head.
func (x *Index) SetLag(lag uint64) { x.lag = lag }

func (x *Index) cursor() (Block, bool) {
	head := x.chain.Head()
	if head.Number < x.lag {
		return Block{}, false
	}
	return x.chain.BlockByNumber(head.Number - x.lag)
}

// Cursor is the last block whose logs the index holds.
func (x *Index) Cursor(ctx context.Context, network string) (facilitator.Block, bool, error) {
	b, ok := x.cursor()
	if !ok {
		return facilitator.Block{}, false, nil
	}
	return facilitator.Block{Number: b.Number, Hash: b.Hash, ParentHash: b.ParentHash}, true, nil
}

// AuthorizationUse is the indexed use of an authorization: the chain's at the cursor.
func (x *Index) AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error) {
	b, ok := x.cursor()
	if !ok {
		return nil, nil
	}
	u, ok := x.chain.AuthorizationUseAt(b.Number, authorizer, nonce)
	if !ok {
		return nil, nil
	}
	out := &facilitator.AuthorizationUse{Canceled: u.Kind == UseCancel, BlockNumber: u.BlockNumber, BlockHash: u.BlockHash, TxHash: u.TxHash}
	if u.Kind == UseTransfer {
		out.To, out.Value = u.To, u.Value
	}
	return out, nil
}

// WindowBlocks is the index's recent blocks from from up to the cursor.
func (x *Index) WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error) {
	b, ok := x.cursor()
	if !ok {
		return nil, nil
	}
	var out []facilitator.Block
	for n := from; n <= b.Number; n++ {
		if c, ok := x.chain.BlockByNumber(n); ok {
			out = append(out, facilitator.Block{Number: c.Number, Hash: c.Hash, ParentHash: c.ParentHash})
		}
	}
	return out, nil
}

// Commit changes nothing: this index follows the canonical chain by itself.
func (x *Index) Commit(ctx context.Context, network string, b facilitator.IndexBatch) error {
	return nil
}

// AuthorizationUsesFrom lists the indexed uses (not cancels) in blocks from from up to the
// cursor, in chain order, at most limit.
func (x *Index) AuthorizationUsesFrom(ctx context.Context, network string, from uint64, limit int) ([]facilitator.AuthorizationEvent, error) {
	b, ok := x.cursor()
	if !ok {
		return nil, nil
	}
	out := x.chain.UsesAt(b.Number, from)
	return out[:min(len(out), limit)], nil
}
