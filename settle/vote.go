package settle

import (
	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// How several endpoints' answers to the same reads are voted on (corroborate.go asks them): an
// answer counts where at least a quorum of the endpoints asked give it alike and no other answer
// has a quorum too; where the quorum first asked splits, the other healthy endpoints are asked
// and the split items vote again, so a lying endpoint is outvoted rather than waited out.

// outvote keeps for each item what at least need of its reads (one per endpoint asked) agree on
// (vote), calling disagreed for each item whose reads split. Where any split, the chain's other
// healthy endpoints are asked (readRest, for those items only) and every item that split votes
// again with their reads too: a lying endpoint is outvoted, not waited out.
func outvote[T, R any](chain ethrpc.Chain, asked []string, items []T, reads [][]R, need int,
	vote func(T, []R, int) bool, disagreed func(), readRest func([]ethrpc.Chain, []T) [][]R) {
	var split []int
	for i, it := range items {
		if vote(it, column(reads, i), need) {
			disagreed()
			split = append(split, i)
		}
	}
	more := restOf(chain, asked, len(split))
	if len(more) == 0 {
		return
	}
	again := make([]T, len(split))
	for j, i := range split {
		again[j] = items[i]
	}
	extra := readRest(more, again)
	for j, i := range split {
		vote(items[i], append(column(reads, i), column(extra, j)...), need)
	}
}

// column is the i-th settlement's reads, one per endpoint.
func column[T any](reads [][]T, i int) []T {
	out := make([]T, len(reads))
	for k := range reads {
		out[k] = reads[k][i]
	}
	return out
}

// votePinned keeps in pr what at least need of the endpoints' reads of it (reads) agree on, and
// reports whether they split: reads that differ, and no answer a quorum agrees on.
func votePinned(pr *pinnedRead, reads []*pinnedRead, need int) (split bool) {
	pr.read, pr.receipts, pr.voided = nil, nil, false
	var answered []*pinnedRead
	for _, r := range reads {
		pr.told = max(pr.told, r.told)
		if r.voided {
			// One saw another block at the verdict's height: the verdict's block is in doubt.
			pr.voided = true
		}
		if r.read != nil {
			answered = append(answered, r)
		}
	}
	if pr.voided {
		return false
	}
	won, split := agreeing(answered, sameEvidence, need)
	if won == nil {
		return split
	}
	// Finality counts from the lowest of their heads and tagged blocks: the block must be final
	// for each (a tag one of them could not read leaves finality to the depth rule).
	c := *won[0].read
	pr.receipts = map[common.Hash]receiptRead{}
	for _, r := range won {
		c.nodeHead = min(c.nodeHead, r.read.nodeHead)
		c.tag = lowerTag(c.tag, r.read.tag)
		c.receiptsComplete = c.receiptsComplete && r.read.receiptsComplete
		for h, rr := range r.receipts {
			if !pr.receipts[h].ok {
				pr.receipts[h] = rr
			}
		}
	}
	pr.read = &c
	return false
}

// agreeing is the answers that agree with one another (by same) and number at least need, when
// exactly one such group does; split reports answers that differ with no such group. Where the
// quorum is a majority of the endpoints (two of three), at most one answer can have it.
func agreeing[T any](answers []T, same func(a, b T) bool, need int) (won []T, split bool) {
	var groups [][]T
	for _, a := range answers {
		placed := false
		for g := range groups {
			if same(groups[g][0], a) {
				groups[g], placed = append(groups[g], a), true
				break
			}
		}
		if !placed {
			groups = append(groups, []T{a})
		}
	}
	for _, g := range groups {
		if len(g) < need {
			continue
		}
		if won != nil {
			return nil, true // two answers each with a quorum: not known
		}
		won = g
	}
	return won, won == nil && len(groups) > 1
}

// restOf is chain's healthy endpoints other than those asked, for reads a quorum of them
// disagreed on (none when nothing split).
func restOf(chain ethrpc.Chain, asked []string, split int) []ethrpc.Chain {
	q, is := chain.(quorate)
	if !is || split == 0 {
		return nil
	}
	eps, _ := q.Several(q.Endpoints(), asked...)
	return eps
}

// lowerTag is the lower of two endpoints' answers for the finality tag (not OK when either is).
func lowerTag(a, b facilitator.TagRead) facilitator.TagRead {
	if !a.OK || !b.OK {
		return facilitator.TagRead{}
	}
	return facilitator.TagRead{Number: min(a.Number, b.Number), OK: true}
}

// vote keeps in qr what at least need of the endpoints' observations (obs) agree on: the same
// receipts, and the same block at its height (with the lowest of their heads and tags). It
// reports whether they split: observations that differ, and none a quorum agrees on.
func (qr *quorumRead) vote(obs []observation, need int) (split bool) {
	qr.agreed, qr.receipts, qr.canon = false, map[common.Hash]receiptRead{}, nil
	for _, h := range qr.hashes {
		qr.receipts[h] = receiptRead{}
	}
	var answered []observation
	for _, o := range obs {
		if qr.complete(o) {
			answered = append(answered, o)
		}
	}
	won, split := agreeing(answered, qr.same, need)
	if won == nil {
		return split
	}
	for _, h := range qr.hashes {
		qr.receipts[h] = won[0].receipts[h]
	}
	if qr.at > 0 {
		c := *won[0].canon
		for _, o := range won[1:] {
			c.head, c.tag = min(c.head, o.canon.head), lowerTag(c.tag, o.canon.tag)
		}
		qr.canon = &c
	}
	qr.agreed = true
	return false
}

// complete reports whether o answered every read of qr (a read that failed is no vote).
func (qr *quorumRead) complete(o observation) bool {
	for _, h := range qr.hashes {
		if !o.receipts[h].ok {
			return false
		}
	}
	return qr.at == 0 || o.canon != nil
}

// same reports whether two endpoints' observations say the same of qr's reads.
func (qr *quorumRead) same(a, b observation) bool {
	for _, h := range qr.hashes {
		if !sameReceipt(a.receipts[h].r, b.receipts[h].r) {
			return false
		}
	}
	return qr.at == 0 || a.canon.hash == b.canon.hash
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
