package settle

import (
	"context"
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// The raw chain reads the engine makes through a network's chain: one call, a batch of them
// (in chunks, each bounded by the RPC timeout), and the watcher's reads of new blocks.

// one sends el alone, bounded by the RPC timeout.
func (n *chainEngine) one(ctx context.Context, el rpc.BatchElem) error {
	ctx, cancel := context.WithTimeout(ctx, n.engine.cfg.RPCTimeout)
	defer cancel()
	return ethrpc.One(ctx, n.chain, el)
}

// batch runs elems in chunks, each bounded by the RPC timeout.
func (n *chainEngine) batch(ctx context.Context, elems []rpc.BatchElem) error {
	return n.batchOn(n.chain)(ctx, elems)
}

// batchOn is batch over one chain (one endpoint of the network's, for corroborated reads).
func (n *chainEngine) batchOn(c ethrpc.Chain) func(context.Context, []rpc.BatchElem) error {
	return func(ctx context.Context, elems []rpc.BatchElem) error {
		const chunk = 500
		for i := 0; i < len(elems); i += chunk {
			end := min(i+chunk, len(elems))
			cctx, cancel := context.WithTimeout(ctx, n.engine.cfg.RPCTimeout)
			err := c.BatchCallContext(cctx, elems[i:end])
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// errNoBlockReceipts: the node answered eth_getBlockReceipts with an error (it may not serve it).
var errNoBlockReceipts = errors.New("eth_getBlockReceipts refused")

// blockReceipts returns the receipts of every transaction in blocks from..to, by hash.
func (n *chainEngine) blockReceipts(ctx context.Context, from, to uint64) (map[common.Hash]*ethrpc.Receipt, error) {
	blocks := make([][]*ethrpc.Receipt, to-from+1)
	elems := make([]rpc.BatchElem, len(blocks))
	for i := range blocks {
		elems[i] = ethrpc.BlockReceipts(ethrpc.At(from+uint64(i)), &blocks[i])
	}
	if err := n.batch(ctx, elems); err != nil {
		return nil, err
	}
	out := map[common.Hash]*ethrpc.Receipt{}
	for i, rs := range blocks {
		if elems[i].Error != nil {
			return nil, fmt.Errorf("%w: %w", errNoBlockReceipts, elems[i].Error)
		}
		if rs == nil {
			// A block the node does not have (yet, or no longer): read it again next round.
			return nil, fmt.Errorf("no receipts for block %d", from+uint64(i))
		}
		for _, r := range rs {
			if r != nil {
				out[r.TxHash] = r
			}
		}
	}
	return out, nil
}

// blockTxs returns the hashes of the transactions in blocks from..to.
func (n *chainEngine) blockTxs(ctx context.Context, from, to uint64) (map[common.Hash]bool, error) {
	blocks := make([]struct {
		Txs []common.Hash `json:"transactions"`
	}, to-from+1)
	elems := make([]rpc.BatchElem, len(blocks))
	for i := range blocks {
		elems[i] = ethrpc.Block(ethrpc.At(from+uint64(i)), false, &blocks[i])
	}
	if err := n.batch(ctx, elems); err != nil {
		return nil, err
	}
	out := map[common.Hash]bool{}
	for i, b := range blocks {
		if elems[i].Error != nil {
			return nil, elems[i].Error
		}
		for _, h := range b.Txs {
			out[h] = true
		}
	}
	return out, nil
}
