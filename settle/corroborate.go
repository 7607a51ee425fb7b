package settle

import (
	"context"
	"slices"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// With several providers for a network, one lying or lagging provider must not decide an
// outcome: the reads a decision to record one rests on (a receipt that makes a settlement mined,
// the block and finality tag that make it final, the pinned reads of a terminal failure) are made
// on a quorum of endpoints at once (ethrpc.Pool's Quorum: two by default), and count only where
// all of them say the same. Where they disagree the read is "not known": the engine waits, and
// the disagreement is counted. With one endpoint configured (or a quorum of one: the operator
// trusts each provider alone), the reads made at different times are the rule, as with one node;
// with fewer healthy endpoints than the quorum, nothing is decided until enough are back (the
// ones left could be the ones that lie).

// pairer is a chain of several endpoints that can name two healthy ones (ethrpc.Pool).
type pairer interface {
	Pair() (a, b ethrpc.Chain, ok bool)
	// Endpoints is how many endpoints the chain has, healthy or not.
	Endpoints() int
}

// quorate is a chain of several endpoints that can name a quorum of healthy ones (ethrpc.Pool).
type quorate interface {
	pairer
	Quorum() int
	// Several names n healthy endpoints other than those in except.
	Several(n int, except ...string) ([]ethrpc.Chain, bool)
}

// each runs f(k) for every endpoint k of a read, all at once, or one after the other on a chain
// that asks for it (ethrpc.Pool.SetSerial: the simulator's, whose endpoints answer from one
// simulated chain, and whose seed must replay whichever goroutine would have come first).
func each(chain ethrpc.Chain, n int, f func(k int)) {
	s, ok := chain.(interface{ Serial() bool })
	ethrpc.Each(ok && s.Serial(), n, f)
}

// quorumOf is the endpoints an outcome's reads are made on. eps nil and ok: the chain is trusted
// as one (one endpoint, or a quorum of one); not ok: fewer than the quorum are healthy now.
func quorumOf(chain ethrpc.Chain) (eps []ethrpc.Chain, ok bool) {
	return quorumBeside(chain, "")
}

// quorumBeside is quorumOf beside a read the endpoint named from (not "") already answered: the
// quorum's other endpoints, none of them that one. A chain that cannot name its endpoints (a test's
// pair) gives the whole quorum.
func quorumBeside(chain ethrpc.Chain, from string) (eps []ethrpc.Chain, ok bool) {
	if q, is := chain.(quorate); is {
		switch {
		case q.Quorum() <= 1:
			return nil, true
		case from != "":
			return q.Several(q.Quorum()-1, from)
		}
		return q.Several(q.Quorum())
	}
	p, is := chain.(pairer)
	if !is {
		return nil, true
	}
	a, b, ok := p.Pair()
	switch {
	case ok:
		return []ethrpc.Chain{a, b}, true
	case p.Endpoints() > 1:
		return nil, false
	}
	return nil, true
}

// quorumSize is how many endpoints must agree on chain's reads of an outcome (1: it is trusted
// as one).
func quorumSize(chain ethrpc.Chain) int {
	if q, is := chain.(quorate); is {
		return q.Quorum()
	}
	if p, is := chain.(pairer); is && p.Endpoints() > 1 {
		return 2
	}
	return 1
}

// readCorroborated makes the pinned reads of prs through chain: on a quorum of its endpoints
// when it has several, keeping a read only where they all agree, and calling disagreed for each
// that they did not. batchOn makes a batch function over one endpoint.
func readCorroborated(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	tag string, prs []*pinnedRead, disagreed func()) error {
	eps, ok := quorumOf(chain)
	switch {
	case !ok:
		for _, pr := range prs {
			pr.read, pr.receipts = nil, nil // fewer endpoints' word than the quorum: not known yet
		}
		return nil
	case eps == nil:
		return readPinned(ctx, batchOn(chain), tag, prs)
	}
	copies := make([][]*pinnedRead, len(eps))
	copies[0] = prs
	for k := 1; k < len(eps); k++ {
		copies[k] = make([]*pinnedRead, len(prs))
		for i, pr := range prs {
			c := *pr
			c.read, c.receipts, c.voided = nil, nil, false
			copies[k][i] = &c
		}
	}
	errs := make([]error, len(eps))
	each(chain, len(eps), func(k int) { errs[k] = readPinned(ctx, batchOn(eps[k]), tag, copies[k]) })
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	for k := 1; k < len(eps); k++ {
		mergePinned(prs, copies[k], disagreed)
	}
	return nil
}

// mergePinned keeps in prs only what second, another endpoint's reads of the same settlements,
// agrees with.
func mergePinned(prs, second []*pinnedRead, disagreed func()) {
	for i, pr := range prs {
		other := second[i]
		pr.told = max(pr.told, other.told)
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
			pr.read.tag = lowerTag(pr.read.tag, other.read.tag)
			pr.read.receiptsComplete = pr.read.receiptsComplete && other.read.receiptsComplete
			for h, r := range other.receipts {
				if !pr.receipts[h].ok {
					pr.receipts[h] = r
				}
			}
		}
	}
}

// lowerTag is the lower of two endpoints' answers for the finality tag (not OK when either is).
func lowerTag(a, b facilitator.TagRead) facilitator.TagRead {
	if !a.OK || !b.OK {
		return facilitator.TagRead{}
	}
	return facilitator.TagRead{Number: min(a.Number, b.Number), OK: true}
}

// quorumRead is what an outcome read from one endpoint rests on, read again on a quorum of
// endpoints before it is recorded: the receipts that make a settlement mined, and for a mined
// settlement the block at its height with the node's head and finality tag (which make it final,
// or show it reorganised away).
type quorumRead struct {
	hashes []common.Hash
	want   Expected
	at     uint64 // the height whose block is read beside the receipts (0: none)
	// from names the endpoint whose answer the decision rests on (first: its receipts and block),
	// when one endpoint answered it all: its answer is one of the quorum's, and the others are
	// asked. "": the whole quorum is asked.
	from  string
	first observation

	// agreed: every endpoint of the quorum answered every read, and the same.
	agreed   bool
	receipts map[common.Hash]receiptRead
	canon    *canonRead
}

// beside makes qr rest on the first read o, answered by the endpoint named from, where that read
// holds everything the quorum compares.
func (qr *quorumRead) beside(from string, o observation) {
	if from == "" || (qr.at > 0 && o.canon == nil) {
		return
	}
	for _, h := range qr.hashes {
		if !o.receipts[h].ok {
			return
		}
	}
	qr.from, qr.first = from, o
}

// readQuorum makes the reads of qrs on a quorum of chain's endpoints (beside the endpoint a read
// rests on, which is not asked again), in one batch per endpoint, and keeps what they all say
// (the lower of their heads and tags). A receipt or block the endpoints answered differently is
// not known, and disagreed is called for it. With fewer healthy endpoints than the quorum
// nothing is agreed.
func readQuorum(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	tag string, qrs []*quorumRead, disagreed func()) error {
	groups := map[string][]*quorumRead{}
	var order []string
	for _, qr := range qrs {
		if _, ok := groups[qr.from]; !ok {
			order = append(order, qr.from)
		}
		groups[qr.from] = append(groups[qr.from], qr)
	}
	for _, from := range order {
		if err := readQuorumBeside(ctx, chain, batchOn, tag, from, groups[from], disagreed); err != nil {
			return err
		}
	}
	return nil
}

func readQuorumBeside(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	tag, from string, qrs []*quorumRead, disagreed func()) error {
	for _, qr := range qrs {
		qr.agreed, qr.receipts, qr.canon = false, nil, nil
	}
	eps, ok := quorumBeside(chain, from)
	switch {
	case !ok:
		return nil // fewer healthy endpoints than the quorum
	case eps == nil:
		eps = []ethrpc.Chain{chain}
	}
	obs := make([][]observation, len(eps))
	errs := make([]error, len(eps))
	reads := make([]*receiptReads, len(eps))
	for k := range eps {
		obs[k] = make([]observation, len(qrs))
		rr := &receiptReads{tag: tag}
		for i, qr := range qrs {
			obs[k][i] = observation{receipts: map[common.Hash]receiptRead{}}
			for _, h := range qr.hashes {
				rr.receipt(&obs[k][i], h, qr.want)
			}
			if qr.at > 0 {
				rr.canon(&obs[k][i], qr.at)
			}
		}
		reads[k] = rr
	}
	each(chain, len(eps), func(k int) { errs[k] = reads[k].runWith(ctx, batchOn(eps[k])) })
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if from != "" {
		// The first read is the quorum's first vote.
		first := make([]observation, len(qrs))
		for i, qr := range qrs {
			first[i] = qr.first
		}
		obs = append([][]observation{first}, obs...)
	}
	for i, qr := range qrs {
		qr.agreed, qr.receipts = true, map[common.Hash]receiptRead{}
		for _, h := range qr.hashes {
			r := obs[0][i].receipts[h]
			agree := r.ok
			for k := 1; k < len(obs) && agree; k++ {
				other := obs[k][i].receipts[h]
				if agree = other.ok; agree && !sameReceipt(r.r, other.r) {
					agree = false
					disagreed()
				}
			}
			if !agree {
				qr.agreed, r = false, receiptRead{}
			}
			qr.receipts[h] = r
		}
		if qr.at == 0 {
			continue
		}
		c := obs[0][i].canon
		for k := 1; k < len(obs) && c != nil; k++ {
			other := obs[k][i].canon
			switch {
			case other == nil:
				c = nil
			case other.hash != c.hash:
				c = nil
				disagreed()
			default:
				c = &canonRead{hash: c.hash, head: min(c.head, other.head), tag: lowerTag(c.tag, other.tag)}
			}
		}
		qr.canon = c
		qr.agreed = qr.agreed && c != nil
	}
	return nil
}

// confirmOutcomes is the watcher's round confirming its outcomes: an outcome read from one
// endpoint (a receipt that makes a settlement mined, the block and tag that make it final or show
// it gone) is carried out only once a quorum of the network's endpoints agrees with it: one more
// batch per endpoint, for the round's outcomes together. A decision not confirmed waits, its
// verdict kept, for a later round.
func (n *chainEngine) confirmOutcomes(ctx context.Context, r *round) {
	if quorumSize(n.chain) <= 1 {
		return
	}
	var qrs []*quorumRead
	var qFor []int
	from := ""
	if names := append(r.blocksFrom.Names(), r.readsFrom.Names()...); len(names) > 0 && !slices.ContainsFunc(names, func(s string) bool { return s != names[0] }) {
		from = names[0] // one endpoint answered every read of the round
	}
	for i, w := range r.works {
		if recordsOutcome(r.decisions[i]) {
			qr := quorumFor(w.t, w.want)
			if !r.pinnedAt[i] {
				qr.beside(from, w.o) // (pinned reads are several endpoints' already)
			}
			qrs = append(qrs, qr)
			qFor = append(qFor, i)
		}
	}
	if len(qrs) == 0 {
		return
	}
	err := readQuorum(ctx, n.chain, n.batchOn, n.net.Finality.Tag, qrs, func() { n.engine.cfg.Observer.Disagreement(n.net.ID) })
	if err != nil {
		n.engine.log.Warn("confirming outcomes with a quorum of providers failed; deciding next round", "network", n.net.ID, "err", err)
	}
	for j, qr := range qrs {
		i := qFor[j]
		if w := r.works[i]; err != nil || !qr.confirmed(w.t, w.o, n.policy(), r.decisions[i]) {
			r.decisions[i] = keep(w.t, "not confirmed by a quorum of providers: "+r.decisions[i].why)
		}
	}
}

// recordsOutcome reports whether d records what a receipt or a block read says (mined, moved,
// reopened, final): such a decision is carried out only once a quorum of endpoints agrees with the
// reads it rests on (readQuorum). A terminal failure rests on pinned reads, which
// readCorroborated already made on a quorum.
func recordsOutcome(d decision) bool {
	switch d.act {
	case actResolve:
		return d.res.State.Succeeded()
	case actFinalize, actMove, actReopen:
		return true
	}
	return false
}

// quorumFor is the reads a decision to record t's outcome rests on: a mined settlement's receipt
// and its block, an open one's receipts.
func quorumFor(t track, want Expected) *quorumRead {
	if t.state.Succeeded() {
		return &quorumRead{hashes: []common.Hash{t.mined.tx}, want: want, at: t.mined.block}
	}
	qr := &quorumRead{want: want}
	for _, v := range t.variants {
		qr.hashes = append(qr.hashes, v.hash)
	}
	return qr
}

// confirmed decides again on the quorum's reads in place of the first ones, and reports whether
// the decision stands: the same action and the same outcome.
func (qr *quorumRead) confirmed(t track, o observation, p policy, d decision) bool {
	if !qr.agreed {
		return false
	}
	receipts := make(map[common.Hash]receiptRead, len(o.receipts))
	for h, r := range o.receipts {
		receipts[h] = r
	}
	for h, r := range qr.receipts {
		receipts[h] = r
	}
	o.receipts = receipts
	if qr.at > 0 {
		o.canon = qr.canon
	}
	again := decide(t, o, p)
	a, b := again.res, d.res
	return again.act == d.act && a.State == b.State && a.TxHash == b.TxHash && a.BlockNumber == b.BlockNumber &&
		a.BlockHash == b.BlockHash && a.ErrorReason == b.ErrorReason
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
