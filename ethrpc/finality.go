package ethrpc

import (
	"context"

	"github.com/ethereum/go-ethereum/common"
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
	return Block(tag, false, new(*tagBlock))
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

// Height is one node's word, from one batch, on a block height: which block it has there, and
// how far its head and tag make blocks final.
type Height struct {
	Head  uint64
	Final facilitator.FinalPoint
	block *common.Hash
}

// Has reports whether the node has the block hash at the height.
func (h Height) Has(hash common.Hash) bool { return h.block != nil && *h.block == hash }

// ReadHeight reads the block at number, the head and fin's tag in one batch, so that all three
// are one node's answer (a node still on a branch a reorg replaced has the old block there, but
// not the depth past it). ok is false when the block or the head could not be read.
func ReadHeight(ctx context.Context, batch func(context.Context, []rpc.BatchElem) error, number uint64, fin facilitator.Finality) (h Height, ok bool) {
	var b *struct {
		Hash common.Hash `json:"hash"`
	}
	var head hexutil.Uint64
	elems := []rpc.BatchElem{
		Block(At(number), false, &b),
		BlockNumber(&head),
	}
	if fin.Tag != "" {
		elems = append(elems, TagElem(fin.Tag))
	}
	if err := batch(ctx, elems); err != nil || elems[0].Error != nil || elems[1].Error != nil {
		return Height{}, false
	}
	var tag facilitator.TagRead
	if len(elems) > 2 {
		tag = TagAnswer(elems[2])
	}
	h = Height{Head: uint64(head), Final: fin.At(uint64(head), tag, 0)}
	if b != nil {
		h.block = &b.Hash
	}
	return h, true
}
