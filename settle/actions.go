package settle

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The watcher's apply step: what a round decided for each settlement (sendstate.go's decide) is
// carried out here, the ledger written before anything is sent: resends and fee bumps go to the
// broadcaster, re-signs at a new nonce are recorded and queued, outcomes recorded, mined
// settlements finalized, reopened or moved, closed settlements whose nonce is used let go.

// carryOut carries out the round's decisions, one settlement at a time, then what is done for
// many at once: the batches re-signed, the outcomes recorded, the finals marked, the resends sent.
func (n *chainEngine) carryOut(ctx context.Context, r *round) {
	e := n.engine
	var resend []*flight
	var outcomes []outcome
	var finals []judgedFinal
	bumpedOn := map[*flight]observation{}
	rs := resigns{batches: map[senderNonce][]*flight{}, foreign: map[senderNonce]bool{}}
	for i, w := range r.works {
		f, d := w.f, r.decisions[i]
		f.setVerdict(d.verdict)
		if d.act != actWait && d.act != actSend {
			e.log.Debug("settlement decision", f.logAttrs("action", d.act, "why", d.why, "head", r.head)...)
		}
		if d.act == actAdopt {
			d = decision{act: actWait}
			if n.adoptVariant(ctx, f, r.decisions[i]) && w.o.chain != nil && w.o.chain.keyNonce <= w.t.txNonce {
				// The adoption waits for this settlement's own nonce to be used: its own
				// transaction (which can only revert now) keeps going out until it is, resent
				// and bumped as any unmined one (a bump on two reads), or the nonce would be a gap.
				d = decideUnmined(w.t, w.o, n.policy(), dueForBump(w.t, w.o, n.policy()))
				f.setVerdict(d.verdict)
				if d.act != actSend && d.act != actBump {
					d = decision{act: actWait}
				}
			}
		}
		switch d.act {
		case actSend:
			resend = append(resend, f)
		case actBump:
			n.carryBump(ctx, f, w.t, w.o)
			resend = append(resend, f)
			bumpedOn[f] = w.o
		case actResign:
			n.resignAfter(ctx, &rs, w, d)
		case actResettle:
			if err := n.resettle(ctx, f, w.t.txNonce, d.why); err != nil {
				e.log.Warn("settling a batch's member again alone; will retry", f.logAttrs("tx_nonce", w.t.txNonce, "err", err)...)
			}
		case actResolve:
			o := outcome{f: f, res: d.res}
			o.res.ID = f.id
			outcomes = append(outcomes, o)
		case actFinalize:
			finals = append(finals, judgedFinal{f: f, at: w.t.mined.blockHash})
		case actMove:
			n.move(ctx, f, w.t.mined.blockHash, d)
		case actReopen:
			n.reopen(ctx, f, w.t.mined.blockHash, d)
		case actRelease:
			e.log.Info("closed settlement's nonce is used; no longer watched", f.logAttrs("tx_nonce", w.t.txNonce)...)
			e.untrack(f)
		}
	}
	n.resignBatches(ctx, &rs)
	n.recordAsync(ctx, outcomes)
	n.finalize(ctx, finals)
	// A bump signed on reads a later head has overtaken since (another step of this round told
	// of it) waits for the next round's reads: the nonce may be mined there (seed 20495).
	resend = slices.DeleteFunc(resend, func(f *flight) bool {
		o, bumped := bumpedOn[f]
		return bumped && bumpVetoed(o, n.maxSeen.Load())
	})
	if len(resend) > 0 {
		n.send(ctx, resend)
	}
}

// senderNonce is one nonce of one signer key.
type senderNonce struct {
	s     *sender
	nonce uint64
}

// resigns are a round's re-signs at a new nonce that wait for the round's end.
type resigns struct {
	// batches are a batch's members re-signed this round, by the old batch's nonce: they go as
	// one new batch per old one, in order.
	batches map[senderNonce][]*flight
	order   []senderNonce
	// foreign is whether a nonce's transaction is known, by the blocks, to be none of ours: asked
	// once a round per key and nonce (a batch's members all decide the same re-sign).
	foreign map[senderNonce]bool
}

// resignAfter carries out a decision to re-sign w's settlement at a new nonce: once the blocks
// show a foreign transaction took its nonce (a gap below it needs no such proof), a lone
// settlement at once, a batch's member with the others of its batch at the round's end.
func (n *chainEngine) resignAfter(ctx context.Context, rs *resigns, w *work, d decision) {
	f := w.f
	k := senderNonce{f.sender, w.t.txNonce}
	if d.why != whyGap {
		taken, asked := rs.foreign[k]
		if !asked {
			taken = w.o.chain != nil && n.takenByForeign(ctx, f, w.t, w.t.txNonce, w.o.chain.at)
			rs.foreign[k] = taken
		}
		if !taken {
			return // a null receipt is not a foreign transaction: the blocks must say so
		}
	}
	if w.t.batched {
		if _, ok := rs.batches[k]; !ok {
			rs.order = append(rs.order, k)
		}
		rs.batches[k] = append(rs.batches[k], f)
		return
	}
	var gap *uint64
	if w.o.gap && w.o.chain != nil && w.o.chain.keyNonce < w.t.txNonce {
		g := w.o.chain.keyNonce
		gap = &g
	}
	if err := n.resign(ctx, f, w.t.txNonce, d.why, gap); err != nil {
		n.engine.log.Warn("re-signing a settlement at a new nonce; will retry", f.logAttrs("tx_nonce", w.t.txNonce, "why", d.why, "err", err)...)
	}
}

// resignBatches re-signs each batch's members gathered this round as one new batch.
func (n *chainEngine) resignBatches(ctx context.Context, rs *resigns) {
	for _, k := range rs.order {
		if err := n.resignBatch(ctx, rs.batches[k], k.nonce, "a foreign transaction took the batch's nonce"); err != nil {
			n.engine.log.Warn("re-signing a batch's settlements at a new nonce; will retry", "network", n.net.ID, "signer", k.s.addr,
				"tx_nonce", k.nonce, "members", len(rs.batches[k]), "err", err)
		}
	}
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

// judgedFinal is a settlement the round judged final, and the block it judged (the one the
// ledger had when the round began).
type judgedFinal struct {
	f  *flight
	at common.Hash
}

// finalize marks a round's settlements final in one statement. A row the ledger no longer has in
// the block judged (another writer moved it meanwhile) stays as it is, and is read back.
func (n *chainEngine) finalize(ctx context.Context, finals []judgedFinal) {
	if len(finals) == 0 {
		return
	}
	e := n.engine
	in := make([]facilitator.MinedIn, len(finals))
	for i, j := range finals {
		in[i] = facilitator.MinedIn{ID: j.f.id, BlockHash: j.at}
	}
	moved, err := e.store.MarkFinal(ctx, in)
	if err != nil {
		e.log.Warn("marking settlements final; will retry", "network", n.net.ID, "err", err)
		return
	}
	done := idSet(moved)
	for _, j := range finals {
		f := j.f
		if !done[f.id] {
			n.sync(ctx, f)
			continue
		}
		f.update(func(f *flight) { f.state, f.verdict = facilitator.StateFinal, nil })
		e.untrack(f)
	}
}

// reopen moves a mined settlement back to broadcast: its block (at, as the round began) left the
// chain, or its transaction was re-included elsewhere and reverted there (the next rounds explain
// the revert).
func (n *chainEngine) reopen(ctx context.Context, f *flight, at common.Hash, d decision) {
	e := n.engine
	err := e.store.Reopen(ctx, facilitator.MinedIn{ID: f.id, BlockHash: at}, "reorganised: "+d.why)
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
func (n *chainEngine) move(ctx context.Context, f *flight, at common.Hash, d decision) {
	n.reopen(ctx, f, at, decision{why: "moved to block " + fmt.Sprint(d.res.BlockNumber)})
	if f.view().state != facilitator.StateBroadcast {
		return
	}
	res := d.res
	res.ID = f.id
	f.setResolving(true)
	n.recording.Wait()
	n.record(ctx, []outcome{{f: f, res: res}})
}
