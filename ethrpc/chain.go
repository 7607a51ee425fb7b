// Package ethrpc is the facilitator's access to Ethereum JSON-RPC nodes: the one Chain interface
// every service reads and writes through, the reader verify's checks use, the heads subscription the
// settlement engine and the indexer share, and the transaction signer.
package ethrpc

import (
	"context"

	"github.com/ethereum/go-ethereum/rpc"
)

// Chain is the JSON-RPC access the services need; *rpc.Client satisfies it. Batches carry the
// broadcasts, receipt polls and pinned reads, so a busy facilitator costs the node few requests.
type Chain interface {
	CallContext(ctx context.Context, result any, method string, args ...any) error
	BatchCallContext(ctx context.Context, b []rpc.BatchElem) error
}
