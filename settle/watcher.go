package settle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// watchLoop polls receipts for every transaction this network's flights have signed, resolves
// outcomes from them, and keeps unmined transactions moving (resend, fee bump). It runs every
// PollInterval, and at once after a broadcast is accepted (wake).
func (n *chainEngine) watchLoop(ctx context.Context) {
	t := time.NewTicker(n.engine.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.watch(ctx, true)
		case <-n.kick:
			n.watch(ctx, false)
		}
		n.beat(LoopWatch)
	}
}

// watch is one round of the watcher. It follows new blocks rather than polling every receipt:
// it reads the hashes of the blocks mined since the last round and fetches receipts only for our
// transactions among them, so a thousand transactions in flight cost the node a few calls per
// block, not a thousand per round. A full sweep of every receipt still runs at start, after a gap
// of more than maxBlockGap blocks, and every fullSweepEvery, in case a block was missed.
//
// What the round read goes to decide (sendstate.go), one settlement at a time; the round carries
// out what it answers. polled is a round of the ticker's (not one woken by a broadcast or a head).
func (n *chainEngine) watch(ctx context.Context, polled bool) {
	e := n.engine
	n.checkUnknown(ctx)
	e.retryReleases(ctx)
	if len(e.flightsOf(n)) == 0 {
		return
	}
	// A head the subscription announced past the last round's saves asking the node for one
	// (reading up to a head that is already behind is harmless: the next round reads on).
	head := hexutil.Uint64(n.headHint.Load())
	switch {
	case uint64(head) > n.lastBlock:
	case !polled && n.lastBlock > 0 && n.subscribed():
		// Woken (by a broadcast) while the subscription is up and has announced nothing past the
		// last block read: asking the node would tell of a block the announcement of which wakes
		// the next round anyway. The ticker's rounds still ask, so a subscription gone silent
		// costs latency, never progress.
		head = hexutil.Uint64(n.lastBlock)
	default:
		if err := n.one(ctx, ethrpc.BlockNumber(&head)); err != nil {
			e.log.Warn("reading the head", "network", n.net.ID, "err", err)
			return
		}
	}
	n.saw(uint64(head))
	// The flights are read after the head: a flight tracked later was broadcast later, so it lands
	// in a block past head, which the next round reads. (Read before the head, a flight signed in
	// between could be mined at or below head, in a block this round marks as read without
	// asking for its receipt; only the next full sweep would find it.)
	flights := e.flightsOf(n)
	now := e.now()
	var candidates map[common.Hash]bool // nil: every transaction is a candidate
	var blockRcpts map[common.Hash]*ethrpc.Receipt
	// Which endpoints answered the round's reads: an outcome one endpoint told is confirmed on the
	// others of the quorum, not asked of it again.
	blocksCtx, blocksFrom := ethrpc.WithAnswered(ctx)
	switch {
	case n.lastBlock == 0, uint64(head) > n.lastBlock+maxBlockGap, now.Sub(n.lastSweep) >= fullSweepEvery, n.resweep.Swap(false):
		n.lastSweep = now
	case uint64(head) > n.lastBlock:
		var err error
		if !n.noBlockReceipts {
			// Every receipt of the new blocks in one call per block: ours among them need no
			// second round trip.
			if blockRcpts, err = n.blockReceipts(blocksCtx, n.lastBlock+1, uint64(head)); errors.Is(err, errNoBlockReceipts) {
				e.log.Info("the node does not serve eth_getBlockReceipts; reading blocks, then receipts", "network", n.net.ID, "err", err)
				n.noBlockReceipts = true
			}
		}
		if n.noBlockReceipts {
			candidates, err = n.blockTxs(blocksCtx, n.lastBlock+1, uint64(head))
		} else if err == nil {
			candidates = make(map[common.Hash]bool, len(blockRcpts))
			for h := range blockRcpts {
				candidates[h] = true
			}
		}
		if err != nil {
			// The announced head may be gone (a reorganisation to a shorter chain), or the node
			// answering lags: ask again next time.
			n.headHint.Store(0)
			e.log.Warn("reading new blocks", "network", n.net.ID, "err", err)
			return
		}
	default:
		candidates = map[common.Hash]bool{}
	}

	type work struct {
		f    *flight
		t    track
		o    observation
		want Expected
	}
	var works []*work
	reads := receiptReads{tag: n.net.Finality.Tag}
	fin := n.net.Finality
	// By a tag, a mined settlement is due for its finality read once the tag has reached its block
	// (as last read); by depth (or while the tag goes unanswered), once that deep.
	byTag := fin.Tag != "" && n.tagOK.Load()
	finalFloor := n.finalFloor.Load()
	var tagRead *finalityRead // the round's own read of the tag, while settlements wait for it
	for _, f := range flights {
		if f.view().resolving {
			continue // the previous round's outcome is being written
		}
		if !n.settleMove(ctx, f) {
			continue // which nonce the settlement holds is not known yet
		}
		want := f.want()
		w := &work{f: f, t: f.track(), o: observation{now: now, head: uint64(head), receipts: map[common.Hash]receiptRead{}}, want: want}
		works = append(works, w)
		for _, v := range w.t.variants {
			if r := blockRcpts[v.hash]; r != nil {
				w.o.receipts[v.hash] = receiptRead{ok: true, r: summarize(r, want)}
			}
		}
		switch {
		case w.t.closing:
		case w.t.state.Succeeded():
			// Mined: read again when due for finality (its block is checked to be still the
			// recorded one), when a verdict waits for its second read, and on full sweeps.
			due := uint64(head)+1 >= w.t.mined.block+max(fin.Depth, 1)
			if byTag {
				due = finalFloor >= w.t.mined.block
			}
			if fin.Tag != "" && tagRead == nil {
				tagRead = reads.finality()
			}
			if candidates == nil || due || w.t.verdict != nil {
				// The block at the recorded height says whether the receipt is still the recorded
				// one (decideMined): the receipt itself is read again for a verdict's confirming
				// read (a final settlement rests on a receipt read beside its block), on full
				// sweeps, where the block was not recorded, or after that block was seen replaced
				// (a resweep): once per settlement, not every round.
				if _, ok := w.o.receipts[w.t.mined.tx]; !ok && (candidates == nil || w.t.verdict != nil || w.t.mined.blockHash == (common.Hash{})) {
					reads.receipt(&w.o, w.t.mined.tx, want)
				}
				reads.canon(&w.o, w.t.mined.block)
			}
		default:
			for _, v := range w.t.variants {
				if _, ok := w.o.receipts[v.hash]; !ok && (candidates == nil || candidates[v.hash] || w.t.verdict != nil) {
					reads.receipt(&w.o, v.hash, want)
				}
			}
		}
		w.o.nonceLow = f.takeNonceLow()
		w.o.underpriced = n.takeBump(f)
	}
	roundCtx, roundFrom := ethrpc.WithAnswered(ctx)
	err := reads.run(roundCtx, n)
	// Every head an answer told of counts, whatever else of its request failed: a bump never rests
	// on reads behind it (the simulator's seed 54925: a block read whose element failed told of
	// head 26, and a bump went out on reads at 25 for a nonce mined in block 26).
	n.saw(reads.heads())
	if err != nil {
		e.log.Warn("polling receipts", "network", n.net.ID, "err", err)
		return
	}
	n.lastBlock = uint64(head)
	if tagRead != nil {
		if tagRead.ok {
			n.sawFinal(tagRead.head, tagRead.tag)
		}
		n.tagOK.Store(tagRead.ok && tagRead.tag.OK)
	}
	for _, w := range works {
		if w.o.canon != nil {
			if tagRead == nil {
				// (With a tag, the round's own read of it came in the same answer: one answer is
				// told to the floor once, since it moves only on answers that agree.)
				n.sawFinal(w.o.canon.head, w.o.canon.tag)
			}
			if _, ok := w.o.receipts[w.t.mined.tx]; !ok && w.o.canon.hash != w.t.mined.blockHash {
				// Another block (or none) at a mined settlement's height, and its receipt not read
				// this round: the next round reads every receipt, to see where it went.
				n.resweep.Store(true)
			}
		}
	}

	// Decide; a decision that needs the pinned reads gets them (all such settlements in one
	// request) and decides again.
	decisions := make([]decision, len(works))
	var pinned []*pinnedRead
	var pinnedFor []int
	// Reads "at the head" pin at the highest head seen, not this round's, which a lagging backend
	// may have answered: "the nonce is unused" from a block behind what we know would let a
	// replacement go out for a mined nonce. (After rounds of failing there, a reorg to a shorter
	// chain is likelier than lag: the round's head takes over.)
	seen := uint64(head)
	for _, w := range works {
		if w.o.canon != nil {
			seen = max(seen, w.o.canon.head) // a head another read of this round answered
		}
	}
	if seen > n.pinHead || n.pinFails >= 5 {
		n.pinHead, n.pinFails = seen, 0
	}
	n.saw(seen)
	for i, w := range works {
		w.o.head = n.pinHead // finality of evidence counts from the highest head seen
		w.o.highest = n.maxSeen.Load()
		w.o.floor = n.finalFloor.Load()
		decisions[i] = decide(w.t, w.o, n.policy())
		if d := decisions[i]; d.act == actReadAt {
			at := d.at
			if at == 0 {
				at = n.pinHead
			}
			pinned = append(pinned, newPinnedRead(w.f.key, w.f.sender.addr, w.want, w.t, at))
			pinnedFor = append(pinnedFor, i)
		}
	}
	gaps := map[gapKey]bool{}
	pinnedAt := make([]bool, len(works)) // the settlement's decision had pinned reads
	if len(pinned) > 0 {
		disagreed := func() { e.cfg.Observer.Disagreement(n.net.ID) }
		if err := readCorroborated(ctx, n.chain, n.batchOn, fin.Tag, pinned, disagreed); err != nil {
			e.log.Warn("pinned chain reads failed; deciding next round", "network", n.net.ID, "err", err)
			for _, pr := range pinned {
				pr.read = nil
			}
		}
		failed := 0
		toldFinal := false // the reads are one answer (per endpoint): told to the floor once
		for _, pr := range pinned {
			n.saw(pr.told)
			if pr.read != nil {
				n.saw(pr.read.nodeHead)
				if !toldFinal {
					n.sawFinal(pr.read.nodeHead, pr.read.tag)
					toldFinal = true
				}
			}
			if pr.read == nil && !pr.voided && pr.at == n.pinHead {
				failed++
			}
		}
		if failed > 0 {
			n.pinFails++
		} else {
			n.pinFails = 0
		}
		for j, pr := range pinned {
			i := pinnedFor[j]
			w := works[i]
			pinnedAt[i] = true
			if !pr.apply(&w.t, &w.o) {
				decisions[i] = decision{act: actWait, verdict: w.t.verdict, why: "pinned reads failed; trying again next round"}
				continue
			}
			w.o.highest = n.maxSeen.Load() // the pinned reads (other requests too) may have told of more
			w.o.floor = n.finalFloor.Load()
			if pr.read.keyNonce < w.t.txNonce {
				w.o.gap = n.gapAt(ctx, gaps, w.f.sender, pr.read.keyNonce)
			}
			decisions[i] = decide(w.t, w.o, n.policy())
			if decisions[i].act == actReadAt {
				decisions[i] = decision{act: actWait, verdict: decisions[i].verdict}
			}
		}
	}

	// An outcome read from one endpoint (a receipt that makes a settlement mined, the block and tag
	// that make it final or show it gone) is carried out only once a quorum of the network's
	// endpoints agrees with it: one more batch per endpoint, for the round's outcomes together.
	if quorumSize(n.chain) > 1 {
		var qrs []*quorumRead
		var qFor []int
		from := ""
		if names := append(blocksFrom.Names(), roundFrom.Names()...); len(names) > 0 && !slices.ContainsFunc(names, func(s string) bool { return s != names[0] }) {
			from = names[0] // one endpoint answered every read of the round
		}
		for i, w := range works {
			if recordsOutcome(decisions[i]) {
				qr := quorumFor(w.t, w.want)
				if !pinnedAt[i] {
					qr.beside(from, w.o) // (pinned reads are several endpoints' already)
				}
				qrs = append(qrs, qr)
				qFor = append(qFor, i)
			}
		}
		if len(qrs) > 0 {
			err := readQuorum(ctx, n.chain, n.batchOn, fin.Tag, qrs, func() { e.cfg.Observer.Disagreement(n.net.ID) })
			if err != nil {
				e.log.Warn("confirming outcomes with a quorum of providers failed; deciding next round", "network", n.net.ID, "err", err)
			}
			for j, qr := range qrs {
				i := qFor[j]
				if w := works[i]; err != nil || !qr.confirmed(w.t, w.o, n.policy(), decisions[i]) {
					decisions[i] = keep(w.t, "not confirmed by a quorum of providers: "+decisions[i].why)
				}
			}
		}
	}

	var resend []*flight
	var outcomes []outcome
	var finals []*flight
	// A batch's members re-signed this round go as one new batch per old one.
	type batchKey struct {
		s     *sender
		nonce uint64
	}
	resignBatches := map[batchKey][]*flight{}
	// Whether a nonce's transaction is known, by the blocks, to be none of ours: asked once a round
	// per key and nonce (a batch's members all decide the same re-sign).
	foreign := map[batchKey]bool{}
	var resignOrder []batchKey
	for i, w := range works {
		f, d := w.f, decisions[i]
		f.setVerdict(d.verdict)
		if d.act != actWait && d.act != actSend {
			e.log.Debug("settlement decision", f.logAttrs("action", d.act, "why", d.why, "head", uint64(head))...)
		}
		switch d.act {
		case actSend:
			resend = append(resend, f)
		case actBump:
			if w.o.chain != nil && n.maxSeen.Load() > w.o.chain.at {
				// Told of a later head since the reads (by another step of this round): the nonce
				// may be mined there; the next round reads again.
				resend = append(resend, f)
				continue
			}
			if err := n.bump(ctx, f, w.t.variants[len(w.t.variants)-1].hash); err != nil {
				e.log.Warn("fee bump failed; resending the current transaction", f.logAttrs("err", err)...)
			}
			resend = append(resend, f)
		case actResign:
			if d.why != whyGap {
				k := batchKey{f.sender, w.t.txNonce}
				taken, asked := foreign[k]
				if !asked {
					taken = w.o.chain != nil && n.takenByForeign(ctx, f, w.t, w.t.txNonce, w.o.chain.at)
					foreign[k] = taken
				}
				if !taken {
					continue // a null receipt is not a foreign transaction: the blocks must say so
				}
			}
			if w.t.batched {
				k := batchKey{f.sender, w.t.txNonce}
				if _, ok := resignBatches[k]; !ok {
					resignOrder = append(resignOrder, k)
				}
				resignBatches[k] = append(resignBatches[k], f)
				continue
			}
			var gap *uint64
			if w.o.gap && w.o.chain != nil && w.o.chain.keyNonce < w.t.txNonce {
				g := w.o.chain.keyNonce
				gap = &g
			}
			if err := n.resign(ctx, f, w.t.txNonce, d.why, gap); err != nil {
				e.log.Warn("re-signing a settlement at a new nonce; will retry", f.logAttrs("tx_nonce", w.t.txNonce, "why", d.why, "err", err)...)
			}
		case actResettle:
			if err := n.resettle(ctx, f, w.t.txNonce, d.why); err != nil {
				e.log.Warn("settling a batch's member again alone; will retry", f.logAttrs("tx_nonce", w.t.txNonce, "err", err)...)
			}
		case actResolve:
			o := outcome{f: f, res: d.res}
			o.res.ID = f.id
			outcomes = append(outcomes, o)
		case actFinalize:
			finals = append(finals, f)
		case actMove:
			n.move(ctx, f, d)
		case actReopen:
			n.reopen(ctx, f, d)
		case actRelease:
			e.log.Info("closed settlement's nonce is used; no longer watched", f.logAttrs("tx_nonce", w.t.txNonce)...)
			e.untrack(f)
		}
	}
	for _, k := range resignOrder {
		if err := n.resignBatch(ctx, resignBatches[k], k.nonce, "a foreign transaction took the batch's nonce"); err != nil {
			e.log.Warn("re-signing a batch's settlements at a new nonce; will retry", "network", n.net.ID, "signer", k.s.addr,
				"tx_nonce", k.nonce, "members", len(resignBatches[k]), "err", err)
		}
	}
	n.recordAsync(ctx, outcomes)
	n.finalize(ctx, finals)
	if len(resend) > 0 {
		n.send(ctx, resend)
	}
}

type gapKey struct {
	s     *sender
	nonce uint64
}

// gapAt reports whether no settlement of the ledger holds the sender's nonce (cached per round
// in gaps; a ledger that does not answer says no gap).
func (n *chainEngine) gapAt(ctx context.Context, gaps map[gapKey]bool, s *sender, nonce uint64) bool {
	k := gapKey{s, nonce}
	if g, ok := gaps[k]; ok {
		return g
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.engine.cfg.RPCTimeout)
	held, err := n.engine.store.NoncesHeld(rctx, n.net.ID, s.addr, nonce)
	cancel()
	gaps[k] = err == nil && (len(held) == 0 || held[0] != nonce)
	return gaps[k]
}

// policy is the network's decision policy (sendstate.go).
func (n *chainEngine) policy() policy {
	c := n.engine.cfg
	return policy{finality: n.net.Finality, retryInterval: c.RetryInterval, rebroadcastAfter: c.RebroadcastAfter, bumpAfter: c.BumpAfter, resignMargin: resignMargin}
}

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

type outcome struct {
	f   *flight
	res facilitator.Resolution
}

// recordAsync records a round's outcomes while the next round reads the chain: the ledger write
// (a commit) and the next receipts overlap, so a receipt does not wait for the previous round's
// write to be noticed. Writes stay one at a time, in round order; the flights being written are
// marked resolving, and rounds leave them alone until the write is done.
func (n *chainEngine) recordAsync(ctx context.Context, outcomes []outcome) {
	if len(outcomes) == 0 {
		return
	}
	for i := range outcomes {
		f := outcomes[i].f
		f.mu.Lock()
		f.resolving = true
		f.attachClaimLocked(&outcomes[i].res, n.engine.cfg.ClaimLease, n.engine.now())
		f.mu.Unlock()
	}
	n.recording.Wait()
	n.recording.Add(1)
	// Off the round's path (a stepped engine writes in line): Stop awaits the write.
	n.engine.run.write(func() {
		defer n.recording.Done()
		n.record(ctx, outcomes)
	})
}

// record writes a round's outcomes to the ledger in one statement, then tells the waiters. If the
// write fails nothing is told: the next round finds the same receipts and tries again.
func (n *chainEngine) record(ctx context.Context, outcomes []outcome) {
	if len(outcomes) == 0 {
		return
	}
	e := n.engine
	e.fault(FaultAfterReceipt)
	res := make([]facilitator.Resolution, len(outcomes))
	for i, o := range outcomes {
		res[i] = o.res
	}
	moved, claimed, err := e.store.Resolve(ctx, res)
	if err != nil {
		e.log.Warn("recording outcomes; will retry", "network", n.net.ID, "count", len(res), "err", err)
		for _, o := range outcomes {
			o.f.mu.Lock()
			o.f.resolving = false
			if o.res.Claim != nil {
				o.f.claimWrittenLocked(o.res.Claim.Token, false)
			}
			o.f.mu.Unlock()
			if o.res.Claim != nil {
				// The write may have committed the claim: released by its token, which is never
				// carried again (its caller claims afresh when it is answered).
				e.release(ctx, o.f.id, o.res.Claim.Token)
			}
		}
		// The receipts' blocks are behind the watcher now: sweep them all again next round.
		n.resweep.Store(true)
		return
	}
	done, got := idSet(moved), idSet(claimed)
	for _, o := range outcomes {
		f, r := o.f, o.res
		release := false
		if r.Claim != nil {
			f.mu.Lock()
			release = f.claimWrittenLocked(r.Claim.Token, got[f.id])
			f.mu.Unlock()
		}
		if release {
			// Its caller left while the write carried its claim: the success goes to the next.
			e.release(ctx, f.id, r.Claim.Token)
		}
		if !done[f.id] {
			// Someone else (a reconcile job, the key's previous holder) moved the row first: the
			// ledger is the truth.
			f.setResolving(false)
			n.sync(ctx, f)
			continue
		}
		// A failure keeps the flight until reads show its nonce used (closing): if it is not, the
		// signer's later transactions wait behind it.
		closing := !r.State.Succeeded()
		f.update(func(f *flight) {
			f.resolving, f.verdict, f.closing = false, nil, closing
			f.state, f.minedHash, f.block, f.blockHash = r.State, r.TxHash, r.BlockNumber, r.BlockHash
			f.reason, f.message = r.ErrorReason, r.ErrorMessage
		})
		f.count(false)
		e.log.Info("settlement resolved", f.logAttrs("state", r.State, "tx", r.TxHash, "block", r.BlockNumber, "reason", r.ErrorReason, "closing", closing)...)
	}
}

func idSet(ids []int64) map[int64]bool {
	m := make(map[int64]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// sync makes f the ledger's row again, after a write of ours matched nothing: another writer
// moved the settlement. A settlement no longer open is no longer the watcher's (a mined one is
// watched to finality).
func (n *chainEngine) sync(ctx context.Context, f *flight) {
	e := n.engine
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RPCTimeout)
	row, err := e.store.SettlementByID(rctx, f.id)
	cancel()
	if err != nil {
		e.log.Warn("re-reading a settlement another writer moved; will retry", f.logAttrs("err", err)...)
		return
	}
	now := e.now()
	f.update(func(f *flight) {
		f.verdict = nil
		if f.state.Succeeded() && !row.State.Succeeded() {
			f.unmine(now) // reopened by another writer
		}
		f.state, f.reason, f.message = row.State, row.ErrorReason, row.ErrorMessage
		if row.State.Succeeded() {
			f.minedHash, f.block, f.blockHash = row.TxHash, row.BlockNumber, row.BlockHash
		} else {
			f.minedHash, f.block, f.blockHash = common.Hash{}, 0, common.Hash{}
		}
	})
	e.log.Info("settlement moved by another writer; following the ledger", f.logAttrs("state", row.State)...)
	switch {
	case row.State.Open():
		f.count(true)
	case row.State.Succeeded():
		f.count(false)
	default:
		f.count(false)
		// Its nonce may still be unused: watch it until it is.
		f.update(func(f *flight) { f.closing = true })
	}
	if row.State == facilitator.StateFinal {
		e.untrack(f)
	}
}

// finalize marks a round's settlements final in one statement.
func (n *chainEngine) finalize(ctx context.Context, finals []*flight) {
	if len(finals) == 0 {
		return
	}
	e := n.engine
	ids := make([]int64, len(finals))
	for i, f := range finals {
		ids[i] = f.id
	}
	moved, err := e.store.MarkFinal(ctx, ids)
	if err != nil {
		e.log.Warn("marking settlements final; will retry", "network", n.net.ID, "err", err)
		return
	}
	done := idSet(moved)
	for _, f := range finals {
		if !done[f.id] {
			n.sync(ctx, f)
			continue
		}
		f.update(func(f *flight) { f.state, f.verdict = facilitator.StateFinal, nil })
		e.untrack(f)
	}
}

// reopen moves a mined settlement back to broadcast: its block left the chain, or its
// transaction was re-included elsewhere and reverted there (the next rounds explain the revert).
func (n *chainEngine) reopen(ctx context.Context, f *flight, d decision) {
	e := n.engine
	err := e.store.Reopen(ctx, f.id, "reorganised: "+d.why)
	if errors.Is(err, facilitator.ErrNotFound) {
		n.sync(ctx, f)
		return
	}
	if err != nil {
		e.log.Warn("reopening a reorganised settlement", f.logAttrs("err", err)...)
		return
	}
	e.log.Warn("settlement reorganised; watching again", f.logAttrs("why", d.why)...)
	now := e.now()
	f.update(func(f *flight) {
		f.unmine(now)
		f.state, f.reason, f.message = facilitator.StateBroadcast, "", ""
	})
	f.count(true)
	n.resweep.Store(true)
}

// move records that a mined transaction is now in another block (a reorg re-included it):
// reopened, then mined where it is now, so its events tell both steps.
func (n *chainEngine) move(ctx context.Context, f *flight, d decision) {
	n.reopen(ctx, f, decision{why: "moved to block " + fmt.Sprint(d.res.BlockNumber)})
	if f.view().state != facilitator.StateBroadcast {
		return
	}
	res := d.res
	res.ID = f.id
	f.setResolving(true)
	n.recording.Wait()
	n.record(ctx, []outcome{{f: f, res: res}})
}

const (
	// maxBlockGap is the most blocks a round reads one by one; past it, a full sweep is cheaper.
	maxBlockGap = 32
	// fullSweepEvery bounds how long a receipt can go unnoticed if a block read was missed.
	fullSweepEvery = 10 * time.Second
)

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
