package ethrpc

import (
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A finality tag is read inside the caller's batch, beside the head and the evidence it judges,
// so that all of them come from the node that answered the batch.

type tagBlock struct {
	Number *hexutil.Uint64 `json:"number"`
}

// TagElem is the batch element reading the block a node reports under tag ("finalized", "safe").
func TagElem(tag string) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{tag, false}, Result: new(*tagBlock)}
}

// TagAnswer is the answer of a TagElem element once its batch ran: not OK when the element
// failed (a node that does not serve the tag answers an error) or the node answered null.
func TagAnswer(el rpc.BatchElem) facilitator.TagRead {
	b, ok := el.Result.(**tagBlock)
	if el.Error != nil || !ok || *b == nil || (*b).Number == nil {
		return facilitator.TagRead{}
	}
	return facilitator.TagRead{Number: uint64(*(*b).Number), OK: true}
}
