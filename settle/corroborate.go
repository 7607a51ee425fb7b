package settle

import (
	"context"
	"sync"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// With several providers for a network, one lying or lagging provider must not decide a
// terminal outcome: the pinned reads such a decision rests on are made on two endpoints at once,
// and a settlement's read counts only where both say the same about the block. Where they
// disagree the read is "not known": the engine waits, and the disagreement is counted. With one
// endpoint configured, the reads made at different times are the rule, as with one node; with
// several of which only one is healthy now, nothing terminal is decided until a second is back
// (the one left could be the one that lies).

// pairer is a chain of several endpoints that can name two healthy ones (ethrpc.Pool).
type pairer interface {
	Pair() (a, b ethrpc.Chain, ok bool)
	// Endpoints is how many endpoints the chain has, healthy or not.
	Endpoints() int
}

// readCorroborated makes the pinned reads of prs through chain: on two of its endpoints when it
// has them, keeping a read only where they agree, and calling disagreed for each that they did
// not. batchOn makes a batch function over one endpoint.
func readCorroborated(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	tag string, prs []*pinnedRead, disagreed func()) error {
	p, ok := chain.(pairer)
	if !ok {
		return readPinned(ctx, batchOn(chain), tag, prs)
	}
	a, b, ok := p.Pair()
	switch {
	case !ok && p.Endpoints() > 1:
		for _, pr := range prs {
			pr.read, pr.receipts = nil, nil // one endpoint's word alone: not known yet
		}
		return nil
	case !ok:
		return readPinned(ctx, batchOn(chain), tag, prs)
	}
	second := make([]*pinnedRead, len(prs))
	for i, pr := range prs {
		c := *pr
		c.read, c.receipts, c.voided = nil, nil, false
		second[i] = &c
	}
	var errA, errB error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); errA = readPinned(ctx, batchOn(a), tag, prs) }()
	go func() { defer wg.Done(); errB = readPinned(ctx, batchOn(b), tag, second) }()
	wg.Wait()
	if errA != nil {
		return errA
	}
	if errB != nil {
		return errB
	}
	for i, pr := range prs {
		other := second[i]
		switch {
		case pr.voided || other.voided:
			// Either saw another block at the verdict's height: the verdict's block is in doubt.
			pr.voided, pr.read, pr.receipts = true, nil, nil
		case pr.read == nil || other.read == nil:
			pr.read, pr.receipts = nil, nil // one of them lacks the block: not known yet
		case !sameEvidence(pr, other):
			pr.read, pr.receipts = nil, nil
			disagreed()
		default:
			// Finality counts from the lower of the two heads and tagged blocks: the block must be
			// final for both (a tag one of them could not read leaves finality to the depth rule).
			pr.read.nodeHead = min(pr.read.nodeHead, other.read.nodeHead)
			if !other.read.tag.OK {
				pr.read.tag = other.read.tag
			} else if pr.read.tag.OK {
				pr.read.tag.Number = min(pr.read.tag.Number, other.read.tag.Number)
			}
			pr.read.receiptsComplete = pr.read.receiptsComplete && other.read.receiptsComplete
			for h, r := range other.receipts {
				if !pr.receipts[h].ok {
					pr.receipts[h] = r
				}
			}
		}
	}
	return nil
}

// sameEvidence reports whether two endpoints' pinned reads of one settlement say the same about
// the block they are pinned at: its hash and time, the signer's nonce, the authorization's state
// and use log there, and each transaction's receipt where both read it (a receipt of a block past
// the pinned one may be on one endpoint only, and says nothing about the pinned block; it is
// compared as not mined).
func sameEvidence(x, y *pinnedRead) bool {
	a, b := x.read, y.read
	if a.at != b.at || a.atHash != b.atHash || a.time != b.time || a.keyNonce != b.keyNonce || a.used != b.used {
		return false
	}
	if (a.use == nil) != (b.use == nil) || (a.use != nil && *a.use != *b.use) {
		return false
	}
	if (a.balance == nil) != (b.balance == nil) || (a.balance != nil && a.balance.Cmp(b.balance) != 0) {
		return false
	}
	for h, ra := range x.receipts {
		rb, ok := y.receipts[h]
		if !ok || !ra.ok || !rb.ok {
			continue
		}
		if !sameReceipt(upTo(ra.r, a.at), upTo(rb.r, a.at)) {
			return false
		}
	}
	return true
}

// upTo is the receipt as of block at: nil when it was mined after it.
func upTo(r *receipt, at uint64) *receipt {
	if r == nil || r.block > at {
		return nil
	}
	return r
}

func sameReceipt(a, b *receipt) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}
