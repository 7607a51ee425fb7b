package ops

import (
	"context"
	"errors"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/ledgercheck"
)

// Chain is a network's JSON-RPC access, as the ledger check reads it (ethrpc.Chain has it).
type Chain interface {
	BatchCallContext(ctx context.Context, b []rpc.BatchElem) error
}

// CheckRow is one recent settlement checked against the chain.
type CheckRow struct {
	Network  string              `json:"network"`
	Payer    string              `json:"payer"`
	Nonce    string              `json:"nonce"`
	Tx       string              `json:"transaction"`
	Block    uint64              `json:"block"`
	State    string              `json:"state"`
	Verdict  ledgercheck.Verdict `json:"verdict"`
	Problems []string            `json:"problems,omitempty"`
}

// checkChain checks rows against their networks' chains: per network, one batch for the head and
// every receipt, then one for authorizationState pinned at each receipt's block by hash (EIP-1898:
// a node without that block, behind or on another branch, answers an error, which is
// "unreadable", never an old "unused"). Each batch is bounded by rpcTimeout.
func checkChain(ctx context.Context, chains map[string]Chain, rows []facilitator.Settlement, rpcTimeout time.Duration) []CheckRow {
	out := make([]CheckRow, len(rows))
	byNet := map[string][]int{}
	for i, r := range rows {
		out[i] = CheckRow{Network: r.Key.Network, Payer: r.Key.Payer.Hex(), Nonce: hexutil.Encode(r.Key.Nonce[:]), Tx: r.TxHash.Hex(),
			Block: r.BlockNumber, State: string(r.State)}
		byNet[r.Key.Network] = append(byNet[r.Key.Network], i)
	}
	for network, idx := range byNet {
		ev := readEvidence(ctx, chains[network], rows, idx, rpcTimeout)
		for j, i := range idx {
			out[i].Verdict, out[i].Problems = ledgercheck.Check(rows[i], ev[j])
		}
	}
	return out
}

// readEvidence reads the receipts and pinned authorization states of rows[idx] on one chain; what
// cannot be read is left unknown.
func readEvidence(ctx context.Context, c Chain, rows []facilitator.Settlement, idx []int, rpcTimeout time.Duration) []ledgercheck.Evidence {
	ev := make([]ledgercheck.Evidence, len(idx))
	if c == nil {
		return ev // a network this process does not serve
	}
	var head hexutil.Uint64
	rcpts := make([]*types.Receipt, len(idx))
	first := []rpc.BatchElem{ethrpc.BlockNumber(&head)}
	for j, i := range idx {
		first = append(first, ethrpc.TransactionReceipt(rows[i].TxHash, &rcpts[j]))
	}
	if batch(ctx, c, first, rpcTimeout) != nil || first[0].Error != nil {
		return ev
	}
	type pinned struct {
		j   int
		out hexutil.Bytes
	}
	var calls []*pinned
	var elems []rpc.BatchElem
	for j, i := range idx {
		r := rcpts[j]
		// A receipt from a node whose head is below it is not one to conclude on.
		if first[j+1].Error != nil || r == nil || r.BlockNumber == nil || r.BlockNumber.Cmp(new(big.Int).SetUint64(uint64(head))) > 0 {
			continue
		}
		ev[j].Receipt = r
		k := rows[i].Key
		call := map[string]any{"to": k.Asset, "input": hexutil.Bytes(eip3009.AuthorizationStateCalldata(k.Payer, k.Nonce))}
		p := &pinned{j: j}
		calls = append(calls, p)
		elems = append(elems, ethrpc.Call(call, blockHash(r.BlockHash), &p.out))
	}
	if len(calls) == 0 || batch(ctx, c, elems, rpcTimeout) != nil {
		return ev
	}
	for n, p := range calls {
		if elems[n].Error != nil {
			continue
		}
		if used, ok := eip3009.DecodeAuthorizationState(p.out); ok {
			ev[p.j].Used, ev[p.j].UsedKnown = used, true
		}
	}
	return ev
}

// blockHash pins a read at a block by its hash (EIP-1898), requiring it to be on the node's
// canonical chain.
func blockHash(h common.Hash) map[string]any {
	return map[string]any{"blockHash": h, "requireCanonical": true}
}

// batch sends one batch within its own bound.
func batch(ctx context.Context, c Chain, elems []rpc.BatchElem, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.BatchCallContext(ctx, elems); err != nil {
		return errors.Join(errors.New("ops: reading the chain"), err)
	}
	return nil
}
