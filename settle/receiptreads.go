package settle

import (
	"context"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// receiptReads gathers a round's reads into one batch: receipts, and a mined settlement's block at
// its recorded height with the answering node's head.
type receiptReads struct {
	tag   string // the network's finality tag, read beside each block at a height ("": none)
	elems []rpc.BatchElem
	after []func()
	hs    []*hexutil.Uint64 // the eth_blockNumber answers
	// canons is each height's block read of this round: settlements mined in one block share
	// it (one request, so one node's head and block for all of them).
	canons map[uint64]func() *canonRead
	// receiptAt is where each transaction's receipt read of this round is: a batch's members
	// share their transaction, so one read (one node's answer) serves every one of them.
	receiptAt map[common.Hash]int
}

// finalityRead is a node's head and its answer for the finality tag, read in one request.
type finalityRead struct {
	ok   bool // the head was read
	head uint64
	tag  facilitator.TagRead
}

// finality reads the head and the finality tag, for the round to know where the tag stands.
func (rr *receiptReads) finality() *finalityRead {
	fr := &finalityRead{}
	head := new(hexutil.Uint64)
	rr.hs = append(rr.hs, head)
	i := len(rr.elems)
	rr.elems = append(rr.elems, ethrpc.BlockNumber(head), ethrpc.TagElem(rr.tag))
	rr.after = append(rr.after, func() {
		if rr.elems[i].Error != nil {
			return
		}
		fr.ok, fr.head, fr.tag = true, uint64(*head), ethrpc.TagAnswer(rr.elems[i+1])
	})
	return fr
}

// heads is the highest head the answered elements told of (0: none).
func (rr *receiptReads) heads() uint64 {
	var h uint64
	for _, x := range rr.hs {
		h = max(h, uint64(*x))
	}
	return h
}

func (rr *receiptReads) receipt(o *observation, h common.Hash, want Expected) {
	i, ok := rr.receiptAt[h]
	if !ok {
		if rr.receiptAt == nil {
			rr.receiptAt = map[common.Hash]int{}
		}
		i = len(rr.elems)
		rr.receiptAt[h] = i
		rr.elems = append(rr.elems, ethrpc.TransactionReceipt(h, new(*ethrpc.Receipt)))
	}
	r := rr.elems[i].Result.(**ethrpc.Receipt)
	rr.after = append(rr.after, func() {
		if rr.elems[i].Error != nil {
			o.receipts[h] = receiptRead{}
			return
		}
		o.receipts[h] = receiptRead{ok: true, r: summarize(*r, want)}
	})
}

func (rr *receiptReads) canon(o *observation, number uint64) {
	if read, ok := rr.canons[number]; ok {
		rr.after = append(rr.after, func() { o.canon = read() })
		return
	}
	head := new(hexutil.Uint64)
	rr.hs = append(rr.hs, head)
	var b *struct {
		Hash common.Hash `json:"hash"`
	}
	i := len(rr.elems)
	rr.elems = append(rr.elems,
		ethrpc.BlockNumber(head),
		ethrpc.Block(ethrpc.At(number), false, &b))
	if rr.tag != "" {
		rr.elems = append(rr.elems, ethrpc.TagElem(rr.tag))
	}
	read := func() *canonRead {
		if rr.elems[i].Error != nil || rr.elems[i+1].Error != nil {
			return nil
		}
		c := &canonRead{head: uint64(*head)}
		if rr.tag != "" {
			c.tag = ethrpc.TagAnswer(rr.elems[i+2])
		}
		if b != nil {
			c.hash = b.Hash
		}
		return c
	}
	if rr.canons == nil {
		rr.canons = map[uint64]func() *canonRead{}
	}
	rr.canons[number] = read
	rr.after = append(rr.after, func() { o.canon = read() })
}

func (rr *receiptReads) run(ctx context.Context, n *chainEngine) error {
	return rr.runWith(ctx, n.batch)
}

// runWith is run through batch (one endpoint's, for a quorum's reads).
func (rr *receiptReads) runWith(ctx context.Context, batch func(context.Context, []rpc.BatchElem) error) error {
	if len(rr.elems) == 0 {
		return nil
	}
	if err := batch(ctx, rr.elems); err != nil {
		return err
	}
	for _, f := range rr.after {
		f()
	}
	return nil
}

// summarize reduces a receipt to what decisions need; nil stays nil.
func summarize(r *ethrpc.Receipt, want Expected) *receipt {
	if r == nil || r.BlockNumber == nil {
		return nil
	}
	out := &receipt{tx: r.TxHash, block: uint64(*r.BlockNumber), blockHash: r.BlockHash}
	// Only the authorization's own AuthorizationUsed+Transfer pair says it transferred. A receipt
	// that succeeded without it is, for this settlement, a reverted transaction (decided as one:
	// who used the authorization, if anyone): inside a batch the member's call reverted.
	e := effect(r, want)
	out.success, out.transfer = e != eip3009.NotUsed, e == eip3009.Paid
	out.batchFailed = want.Batched && r.Succeeded() && e == eip3009.NotUsed
	return out
}
