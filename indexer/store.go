package indexer

import (
	"context"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Store is the index's storage.
type Store interface {
	// Lead waits until this process is the network's indexer (a Postgres advisory lock held on a
	// dedicated connection) or ctx ends. The lease lasts until release, or until the connection
	// dies, which is how a crashed leader's replica takes over; leading is canceled then, so a
	// leader that lost its lock stops writing.
	Lead(ctx context.Context, network string) (leading context.Context, release func(), err error)
	// Cursor is the last indexed block; ok is false before the first commit.
	Cursor(ctx context.Context, network string) (b facilitator.Block, ok bool, err error)
	Commit(ctx context.Context, network string, b facilitator.IndexBatch) error
	// WindowBlocks are the stored blocks from number from upward, ascending.
	WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error)
	PruneBlocks(ctx context.Context, network string, below uint64) error
}
