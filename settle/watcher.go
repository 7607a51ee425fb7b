package settle

import (
	"context"
	"errors"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

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
// A round reads, decides, then carries out: the head and the new blocks, then every flight's
// receipts (readBlocks, readReceipts); what was read goes to decide (sendstate.go), one settlement
// at a time, with the pinned reads a decision asks for (decideRound); an outcome read from one
// endpoint is confirmed on a quorum of them (confirmOutcomes); then what was decided is done
// (carryOut, actions.go). polled is a round of the ticker's (not one woken by a broadcast or a
// head).
func (n *chainEngine) watch(ctx context.Context, polled bool) {
	e := n.engine
	n.checkUnknown(ctx)
	e.retryReleases(ctx)
	if len(e.flightsOf(n)) == 0 {
		return
	}
	head, ok := n.roundHead(ctx, polled)
	if !ok {
		return
	}
	// The flights are read after the head: a flight tracked later was broadcast later, so it lands
	// in a block past head, which the next round reads. (Read before the head, a flight signed in
	// between could be mined at or below head, in a block this round marks as read without
	// asking for its receipt; only the next full sweep would find it.)
	r := &round{head: head, flights: e.flightsOf(n), now: e.now()}
	if !n.readBlocks(ctx, r) || !n.readReceipts(ctx, r) {
		return
	}
	n.decideRound(ctx, r)
	n.confirmOutcomes(ctx, r)
	n.carryOut(ctx, r)
}

// round is what one round of the watcher read and decided, step by step.
type round struct {
	head    uint64
	flights []*flight
	now     time.Time
	// candidates are the transactions of the blocks read since the last round (nil: every
	// transaction is a candidate, a full sweep); blockRcpts their receipts, when the node serves
	// a block's receipts in one call.
	candidates map[common.Hash]bool
	blockRcpts map[common.Hash]*ethrpc.Receipt
	// Which endpoints answered the round's reads: an outcome one endpoint told is confirmed on the
	// others of the quorum, not asked of it again.
	blocksFrom, readsFrom *ethrpc.Answered
	// tagRead is the round's own read of the finality tag, while settlements wait for it.
	tagRead *finalityRead

	works     []*work
	decisions []decision // works[i]'s
	pinnedAt  []bool     // works[i]'s decision had pinned reads
}

// work is one settlement in a round: what the engine knew of it, and what the round read.
type work struct {
	f    *flight
	t    track
	o    observation
	want Expected
}

// roundHead is the head the round reads up to (false: not known; no round).
func (n *chainEngine) roundHead(ctx context.Context, polled bool) (uint64, bool) {
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
			n.engine.log.Warn("reading the head", "network", n.net.ID, "err", err)
			return 0, false
		}
	}
	n.saw(uint64(head))
	return uint64(head), true
}

// readBlocks reads what the blocks since the last round hold (the candidates), or marks the
// round a full sweep (false: the blocks could not be read; no round).
func (n *chainEngine) readBlocks(ctx context.Context, r *round) bool {
	e := n.engine
	blocksCtx, blocksFrom := ethrpc.WithAnswered(ctx)
	r.blocksFrom = blocksFrom
	switch {
	case n.lastBlock == 0, r.head > n.lastBlock+maxBlockGap, r.now.Sub(n.lastSweep) >= fullSweepEvery, n.resweep.Swap(false):
		n.lastSweep = r.now
	case r.head > n.lastBlock:
		var err error
		if !n.noBlockReceipts {
			// Every receipt of the new blocks in one call per block: ours among them need no
			// second round trip.
			if r.blockRcpts, err = n.blockReceipts(blocksCtx, n.lastBlock+1, r.head); errors.Is(err, errNoBlockReceipts) {
				e.log.Info("the node does not serve eth_getBlockReceipts; reading blocks, then receipts", "network", n.net.ID, "err", err)
				n.noBlockReceipts = true
			}
		}
		if n.noBlockReceipts {
			r.candidates, err = n.blockTxs(blocksCtx, n.lastBlock+1, r.head)
		} else if err == nil {
			r.candidates = make(map[common.Hash]bool, len(r.blockRcpts))
			for h := range r.blockRcpts {
				r.candidates[h] = true
			}
		}
		if err != nil {
			// The announced head may be gone (a reorganisation to a shorter chain), or the node
			// answering lags: ask again next time.
			n.headHint.Store(0)
			e.log.Warn("reading new blocks", "network", n.net.ID, "err", err)
			return false
		}
	default:
		r.candidates = map[common.Hash]bool{}
	}
	return true
}

// readReceipts makes the round's work of each flight and reads, in one batch, the receipts and
// blocks it needs that the new blocks did not already answer (false: the reads failed; the round
// ends there).
func (n *chainEngine) readReceipts(ctx context.Context, r *round) bool {
	reads := receiptReads{tag: n.net.Finality.Tag}
	n.queueReads(ctx, r, &reads)
	roundCtx, readsFrom := ethrpc.WithAnswered(ctx)
	r.readsFrom = readsFrom
	err := reads.run(roundCtx, n)
	// Every head an answer told of counts, whatever else of its request failed: a bump never rests
	// on reads behind it (the simulator's seed 54925: a block read whose element failed told of
	// head 26, and a bump went out on reads at 25 for a nonce mined in block 26).
	n.saw(reads.heads())
	if err != nil {
		n.engine.log.Warn("polling receipts", "network", n.net.ID, "err", err)
		return false
	}
	n.lastBlock = r.head
	if r.tagRead != nil {
		if r.tagRead.ok {
			n.sawFinal(r.tagRead.head, r.tagRead.tag)
		}
		n.tagOK.Store(r.tagRead.ok && r.tagRead.tag.OK)
	}
	for _, w := range r.works {
		if w.o.canon != nil {
			if r.tagRead == nil {
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
	return true
}

// queueReads makes each flight's work of the round, with the receipts the new blocks answered,
// and queues in reads what it must still read: an open settlement's receipts among the
// candidates, a mined one's block at its height when due for its finality read.
func (n *chainEngine) queueReads(ctx context.Context, r *round, reads *receiptReads) {
	fin := n.net.Finality
	// By a tag, a mined settlement is due for its finality read once the tag has reached its block
	// (as last read); by depth (or while the tag goes unanswered), once that deep.
	byTag := fin.Tag != "" && n.tagOK.Load()
	finalFloor := n.finalFloor.Load()
	for _, f := range r.flights {
		if f.view().resolving {
			continue // the previous round's outcome is being written
		}
		if !n.settleMove(ctx, f) {
			continue // which nonce the settlement holds is not known yet
		}
		want := f.want()
		w := &work{f: f, t: f.track(), o: observation{now: r.now, head: r.head, receipts: map[common.Hash]receiptRead{}}, want: want}
		r.works = append(r.works, w)
		for _, v := range w.t.variants {
			if rc := r.blockRcpts[v.hash]; rc != nil {
				w.o.receipts[v.hash] = receiptRead{ok: true, r: summarize(rc, want)}
			}
		}
		switch {
		case w.t.closing:
		case w.t.state.Succeeded():
			// Mined: read again when due for finality (its block is checked to be still the
			// recorded one), when a verdict waits for its second read, and on full sweeps.
			due := finalityDue(fin, byTag, finalFloor, r.head, w.t.mined.block)
			if fin.Tag != "" && r.tagRead == nil {
				r.tagRead = reads.finality()
			}
			if r.candidates == nil || due || w.t.verdict != nil {
				// The block at the recorded height says whether the receipt is still the recorded
				// one (decideMined): the receipt itself is read again for a verdict's confirming
				// read (a final settlement rests on a receipt read beside its block), on full
				// sweeps, where the block was not recorded, or after that block was seen replaced
				// (a resweep): once per settlement, not every round.
				if _, ok := w.o.receipts[w.t.mined.tx]; !ok && (r.candidates == nil || w.t.verdict != nil || w.t.mined.blockHash == (common.Hash{})) {
					reads.receipt(&w.o, w.t.mined.tx, want)
				}
				reads.canon(&w.o, w.t.mined.block)
			}
		default:
			for _, v := range w.t.variants {
				if _, ok := w.o.receipts[v.hash]; !ok && (r.candidates == nil || r.candidates[v.hash] || w.t.verdict != nil) {
					reads.receipt(&w.o, v.hash, want)
				}
			}
		}
		w.o.nonceLow = f.takeNonceLow()
		w.o.underpriced = n.takeBump(f)
	}
}

// finalityDue reports whether a settlement mined in block is due for its finality read: by the
// network's tag (byTag: the tag is answered), once the tag's block as last read (floor) has
// reached it; else once the head is deep enough above it by the network's depth.
func finalityDue(fin facilitator.Finality, byTag bool, floor, head, block uint64) bool {
	if byTag {
		return floor >= block
	}
	return fin.At(head, facilitator.TagRead{}, 0).Covers(block)
}

// decideRound decides for every settlement of the round; a decision that needs the pinned reads
// gets them (all such settlements in one request) and decides again.
func (n *chainEngine) decideRound(ctx context.Context, r *round) {
	r.decisions = make([]decision, len(r.works))
	r.pinnedAt = make([]bool, len(r.works))
	var pinned []*pinnedRead
	var pinnedFor []int
	// Reads "at the head" pin at the highest head seen, not this round's, which a lagging backend
	// may have answered: "the nonce is unused" from a block behind what we know would let a
	// replacement go out for a mined nonce. (After rounds of failing there, a reorg to a shorter
	// chain is likelier than lag: the round's head takes over.)
	seen := r.head
	for _, w := range r.works {
		if w.o.canon != nil {
			seen = max(seen, w.o.canon.head) // a head another read of this round answered
		}
	}
	if seen > n.pinHead || n.pinFails >= 5 {
		n.pinHead, n.pinFails = seen, 0
	}
	n.saw(seen)
	for i, w := range r.works {
		w.o.head = n.pinHead // finality of evidence counts from the highest head seen
		w.o.highest = n.maxSeen.Load()
		w.o.floor = n.finalFloor.Load()
		r.decisions[i] = decide(w.t, w.o, n.policy())
		if d := r.decisions[i]; d.act == actReadAt {
			at := d.at
			if at == 0 {
				at = n.pinHead
			}
			pinned = append(pinned, newPinnedRead(w.f.key, w.f.sender.addr, n.isSigner, w.want, w.t, at))
			pinnedFor = append(pinnedFor, i)
		}
	}
	if len(pinned) > 0 {
		n.decidePinned(ctx, r, pinned, pinnedFor)
	}
}

// decidePinned makes the pinned reads pinned[j] of the settlement r.works[pinnedFor[j]] and
// decides for it again on them.
func (n *chainEngine) decidePinned(ctx context.Context, r *round, pinned []*pinnedRead, pinnedFor []int) {
	e := n.engine
	disagreed := func() { e.cfg.Observer.Disagreement(n.net.ID) }
	if err := readCorroborated(ctx, n.chain, n.batchOn, n.net.Finality.Tag, pinned, disagreed); err != nil {
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
	gaps := map[senderNonce]bool{}
	for j, pr := range pinned {
		i := pinnedFor[j]
		w := r.works[i]
		r.pinnedAt[i] = true
		if !pr.apply(&w.t, &w.o) {
			r.decisions[i] = decision{act: actWait, verdict: w.t.verdict, why: "pinned reads failed; trying again next round"}
			continue
		}
		w.o.highest = n.maxSeen.Load() // the pinned reads (other requests too) may have told of more
		w.o.floor = n.finalFloor.Load()
		if pr.read.keyNonce < w.t.txNonce {
			w.o.gap = n.gapAt(ctx, gaps, w.f.sender, pr.read.keyNonce)
		}
		r.decisions[i] = decide(w.t, w.o, n.policy())
		if r.decisions[i].act == actReadAt {
			r.decisions[i] = decision{act: actWait, verdict: r.decisions[i].verdict}
		}
	}
}

// gapAt reports whether no settlement of the ledger holds the sender's nonce (cached per round
// in gaps; a ledger that does not answer says no gap).
func (n *chainEngine) gapAt(ctx context.Context, gaps map[senderNonce]bool, s *sender, nonce uint64) bool {
	k := senderNonce{s, nonce}
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

const (
	// maxBlockGap is the most blocks a round reads one by one; past it, a full sweep is cheaper.
	maxBlockGap = 32
	// fullSweepEvery bounds how long a receipt can go unnoticed if a block read was missed.
	fullSweepEvery = 10 * time.Second
)
