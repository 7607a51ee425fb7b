package settle

import (
	"context"

	"github.com/ethereum/go-ethereum/rpc"
)

// Chain is the JSON-RPC access the engine needs; *rpc.Client satisfies it. Batches carry the
// broadcasts and receipt polls, so a busy engine costs the node few requests.
type Chain interface {
	CallContext(ctx context.Context, result any, method string, args ...any) error
	BatchCallContext(ctx context.Context, b []rpc.BatchElem) error
}
