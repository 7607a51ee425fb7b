package settle

import (
	"bytes"
	"context"
	"encoding/binary"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Claim delivery (invariant 4): a mined success is told to one caller. A caller's claim holds
// the success for ClaimLease; it counts once the caller's answer was written and the claim
// confirmed (ConfirmDelivery, confirmLoop); one never answered is given back (ReleaseDelivery,
// release). The claims here are this process's: held (handed to a caller, the answer not yet
// written), answered (written, the confirmation on its way) and to be released.

// claimTimeout bounds recording that a caller is told success.
const claimTimeout = 5 * time.Second

// claimToken is a token no other claim has: this process's salt, a count, and the settlement.
func (e *Engine) claimToken(id int64) []byte {
	n := e.claims.Add(1)
	return crypto.Keccak256(e.salt[:], binary.BigEndian.AppendUint64(nil, n), binary.BigEndian.AppendUint64(nil, uint64(id)))[:16]
}

// ReleaseDelivery undoes out's claimed success, whose answer never reached the caller.
func (e *Engine) ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	defer e.decide(out.SettlementID, out.Claim)
	return e.store.ReleaseDelivery(ctx, out.SettlementID, out.Claim)
}

// release undoes a claim whose write's outcome is unknown; while the ledger refuses, it is
// retried by the watcher (retryReleases), or the success would stay claimed by nobody.
func (e *Engine) release(ctx context.Context, id int64, claim []byte) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	err := e.store.ReleaseDelivery(rctx, id, claim)
	cancel()
	if err != nil {
		e.relMu.Lock()
		e.releases = append(e.releases, pendingRelease{id: id, claim: claim})
		e.relMu.Unlock()
	}
}

type pendingRelease struct {
	id    int64
	claim []byte
}

// retryReleases releases the claims release could not.
func (e *Engine) retryReleases(ctx context.Context) {
	e.relMu.Lock()
	todo := e.releases
	e.releases = nil
	e.relMu.Unlock()
	for _, r := range todo {
		e.release(ctx, r.id, r.claim)
	}
}

type heldClaim struct {
	token []byte
	until time.Time // out.ClaimBy: past it the claim is not written
	done  chan struct{}
}

// hold registers out's claimed success as handed to its caller, its answer not yet written.
func (e *Engine) hold(out facilitator.SettleOutcome) {
	e.confMu.Lock()
	now := e.now()
	for id, h := range e.held {
		if now.After(h.until) {
			// Never written nor given back in time (a caller of Settle that does neither): its
			// lease decides.
			close(h.done)
			delete(e.held, id)
		}
	}
	if h := e.held[out.SettlementID]; h != nil {
		close(h.done) // a claim that lapsed unanswered: the new one is the settlement's
	}
	e.held[out.SettlementID] = &heldClaim{token: out.Claim, until: out.ClaimBy, done: make(chan struct{})}
	e.confMu.Unlock()
}

// decide ends the hold of claim on settlement id: its answer was written, or it was given back.
func (e *Engine) decide(id int64, claim []byte) {
	e.confMu.Lock()
	if h := e.held[id]; h != nil && bytes.Equal(h.token, claim) {
		close(h.done)
		delete(e.held, id)
	}
	e.confMu.Unlock()
}

// awaitHeld waits for this process's undecided claim of settlement id, if it holds one, to be
// decided, within the caller's context and the claim's own deadline; it reports whether it was.
func (e *Engine) awaitHeld(ctx context.Context, id int64) bool {
	e.confMu.Lock()
	h := e.held[id]
	e.confMu.Unlock()
	if h == nil {
		return false
	}
	return e.run.waitClosed(ctx, h.done, h.until.Sub(e.now()))
}

// answeredHere reports whether this process wrote settlement id's success to a caller whose claim
// is not confirmed yet.
func (e *Engine) answeredHere(id int64) bool {
	e.confMu.Lock()
	defer e.confMu.Unlock()
	return e.answered[id] != nil
}

// confirmGather is how long the confirm loop waits after a written answer for others, so that a
// burst's confirmations share one statement.
const confirmGather = 10 * time.Millisecond

type pendingConfirm struct {
	d facilitator.Delivery
	// giveUp: past it the claim's lease has surely ended, and a confirmation that still cannot be
	// written is counted as lapsed.
	giveUp time.Time
	// tried is closed once the first write of it returned (nil after).
	tried chan struct{}
}

// ConfirmDelivery records that out's claimed success was written to its caller: from then on it
// counts (invariant 4). The confirmations of a burst share one statement (confirmLoop); it
// returns once its own was written (or failed: then it is retried in the background), within
// ctx and claimTimeout. Until it lands, a retry this process sees is told already_settled, and
// one another process sees is told settlement_pending.
func (e *Engine) ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	if !out.Claimed || len(out.Claim) == 0 {
		return nil
	}
	tried := make(chan struct{})
	e.confMu.Lock()
	if bytes.Equal(e.answered[out.SettlementID], out.Claim) {
		// Confirmed already, or on its way (the payment-identifier service confirms a success
		// it stored before the API writes it).
		e.confMu.Unlock()
		return nil
	}
	e.confirms = append(e.confirms, pendingConfirm{d: facilitator.Delivery{ID: out.SettlementID, Claim: out.Claim},
		giveUp: out.ClaimBy.Add(e.cfg.ClaimLease), tried: tried})
	e.answered[out.SettlementID] = out.Claim
	e.confMu.Unlock()
	e.decide(out.SettlementID, out.Claim)
	e.run.confirm(ctx, tried)
	return nil
}

// LapsedClaims counts the claimed successes whose confirmation did not land before their lease
// could end: each may have been answered to a second caller too (invariant 4's one exception).
func (e *Engine) LapsedClaims() uint64 { return e.lapsed.Load() }

// confirmLoop writes the written answers' confirmations, and retries those the ledger refused.
func (e *Engine) confirmLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			e.flushConfirms(ctx)
			return
		case <-e.confKick:
			select {
			case <-ctx.Done():
			case <-time.After(confirmGather):
			}
		case <-t.C:
		}
		e.flushConfirms(ctx)
	}
}

// flushConfirms writes every pending confirmation in one statement.
func (e *Engine) flushConfirms(ctx context.Context) {
	e.confMu.Lock()
	todo := e.confirms
	e.confirms = nil
	e.confMu.Unlock()
	if len(todo) == 0 {
		return
	}
	ds := make([]facilitator.Delivery, len(todo))
	for i, c := range todo {
		ds[i] = c.d
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	lapsed, err := e.store.ConfirmDeliveries(cctx, ds)
	cancel()
	for i := range todo {
		if todo[i].tried != nil {
			close(todo[i].tried)
			todo[i].tried = nil
		}
	}
	var done []pendingConfirm
	if err != nil {
		e.log.Warn("confirming written successes; will retry", "count", len(ds), "err", err)
		now := e.now()
		var keep []pendingConfirm
		for _, c := range todo {
			if now.Before(c.giveUp) {
				keep = append(keep, c)
				continue
			}
			lapsed = append(lapsed, c.d.ID)
			done = append(done, c)
		}
		e.confMu.Lock()
		e.confirms = append(keep, e.confirms...)
		e.confMu.Unlock()
	} else {
		done = todo
	}
	for _, id := range lapsed {
		e.lapsed.Add(1)
		e.log.Error("a success was answered whose claim lapsed before its confirmation landed: another caller may be told the same success",
			"settlement", id)
	}
	e.confMu.Lock()
	for _, c := range done {
		if bytes.Equal(e.answered[c.d.ID], c.d.Claim) {
			delete(e.answered, c.d.ID)
		}
	}
	e.confMu.Unlock()
}
