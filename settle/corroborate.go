package settle

import (
	"context"
	"slices"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// With several providers for a network, one lying or lagging provider must not decide an
// outcome: the reads a decision to record one rests on (a receipt that makes a settlement mined,
// the block and finality tag that make it final, the pinned reads of a terminal failure) are made
// on a quorum of endpoints at once (ethrpc.Pool's Quorum: two by default), and count only where
// all of them say the same. Where they disagree, the disagreement is counted and the pool's other
// healthy endpoints are asked too: an answer at least a quorum of them agrees on counts (one liar
// among three is outvoted, not waited out: the pair picked at random holds it two times in three);
// with none, the read is "not known" and the engine waits. With one endpoint configured (or a quorum of one: the operator
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
// when it has several, keeping a read only where a quorum agrees, and calling disagreed for each
// settlement whose reads the quorum's endpoints told differently. batchOn makes a batch function
// over one endpoint.
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
	reads, asked, err := pinnedOn(ctx, chain, batchOn, tag, eps, prs, false)
	if err != nil {
		return err
	}
	outvote(chain, asked, prs, reads, len(eps), votePinned, disagreed, func(more []ethrpc.Chain, again []*pinnedRead) [][]*pinnedRead {
		extra, _, _ := pinnedOn(ctx, chain, batchOn, tag, more, again, true)
		return extra
	})
	return nil
}

// pinnedOn makes the pinned reads of prs on each endpoint of eps at once, each into copies of its
// own, and names the endpoints that answered. lenient: an endpoint whose reads failed has no
// reads (not an error).
func pinnedOn(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	tag string, eps []ethrpc.Chain, prs []*pinnedRead, lenient bool) ([][]*pinnedRead, []string, error) {
	reads := make([][]*pinnedRead, len(eps))
	for k := range eps {
		reads[k] = make([]*pinnedRead, len(prs))
		for i, pr := range prs {
			c := *pr
			c.read, c.receipts, c.voided, c.told = nil, nil, false, 0
			reads[k][i] = &c
		}
	}
	errs := make([]error, len(eps))
	asked := make([]*ethrpc.Answered, len(eps))
	each(chain, len(eps), func(k int) {
		actx, a := ethrpc.WithAnswered(ctx)
		asked[k] = a
		errs[k] = readPinned(actx, batchOn(eps[k]), tag, reads[k])
	})
	var names []string
	for k, err := range errs {
		names = append(names, asked[k].Names()...)
		if err == nil {
			continue
		}
		if !lenient {
			return nil, nil, err
		}
		for _, c := range reads[k] {
			c.read, c.receipts, c.voided = nil, nil, false
		}
	}
	return reads, names, nil
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
// (the lower of their heads and tags). Where they answered differently, disagreed is called, the
// other healthy endpoints are asked, and what a quorum of them all agrees on is kept (else it is
// not known). With fewer healthy endpoints than the quorum nothing is agreed.
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
	obs, asked, err := observeOn(ctx, chain, batchOn, tag, eps, qrs, false)
	if err != nil {
		return err
	}
	if from != "" {
		// The first read is the quorum's first vote.
		first := make([]observation, len(qrs))
		for i, qr := range qrs {
			first[i] = qr.first
		}
		obs = append([][]observation{first}, obs...)
		asked = append(asked, from)
	}
	outvote(chain, asked, qrs, obs, len(obs), (*quorumRead).vote, disagreed, func(more []ethrpc.Chain, again []*quorumRead) [][]observation {
		extra, _, _ := observeOn(ctx, chain, batchOn, tag, more, again, true)
		return extra
	})
	return nil
}

// observeOn makes the reads of qrs on each endpoint of eps at once, and names the endpoints that
// answered. lenient: an endpoint whose reads failed has none (not an error).
func observeOn(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	tag string, eps []ethrpc.Chain, qrs []*quorumRead, lenient bool) ([][]observation, []string, error) {
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
	asked := make([]*ethrpc.Answered, len(eps))
	each(chain, len(eps), func(k int) {
		actx, a := ethrpc.WithAnswered(ctx)
		asked[k] = a
		errs[k] = reads[k].runWith(actx, batchOn(eps[k]))
	})
	var names []string
	for k, err := range errs {
		names = append(names, asked[k].Names()...)
		if err == nil {
			continue
		}
		if !lenient {
			return nil, nil, err
		}
		for i := range obs[k] {
			obs[k][i] = observation{receipts: map[common.Hash]receiptRead{}}
		}
	}
	return obs, names, nil
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
