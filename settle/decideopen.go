package settle

// The pure core's decisions for a settlement not mined yet (decide, sendstate.go, calls
// decideOpen): a receipt that proves it mined, the pinned reads that show who used the
// authorization, an expiry, a revert, a nonce taken by another transaction, or what an unmined
// transaction needs (resend, bump, wait). Pure, like the rest of the core: no I/O, no clock.

import (
	"fmt"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// decideOpen decides for a settlement not mined yet, in steps: a receipt that proves it mined;
// without the pinned reads, whether to make them; with them, who used the authorization, whether
// it expired, whether ours reverted, whether a transaction that is not ours took the nonce, and
// otherwise what an unmined transaction needs.
func decideOpen(t track, o observation, p policy) decision {
	// Any variant that succeeded is the settlement's transfer, whatever another says: EIP-3009's
	// nonce lets at most one of them transfer.
	if r := t.succeeded(o); r != nil {
		return decision{act: actResolve, res: minedResolution(r), why: "mined"}
	}
	reverted := t.newestReverted(o)
	bumpDue := dueForBump(t, o, p)
	c := o.chain
	if c == nil {
		return beforeReads(t, o, p, reverted, bumpDue)
	}
	// From here on the reads are in: a verdict they do not confirm is dropped (twice compares).

	if reverted != nil && reverted.block > c.at {
		// The reads predate the revert they must explain: read at its block next round.
		return decision{act: actWait, verdict: &verdict{act: actReadAt, at: reverted.block, atHash: reverted.blockHash},
			why: "a variant reverted after the block read; reading at its block"}
	}
	if d, ok := decideUse(t, o, p); ok {
		return d
	}
	// Unused at c.at.
	if t.validBefore != nil && new(big.Int).SetUint64(c.time).Cmp(t.validBefore) >= 0 {
		return decideExpired(t, o, p, reverted)
	}
	if reverted != nil {
		return decideReverted(t, o, p, reverted)
	}
	if c.keyNonce > t.txNonce {
		return decideNonceTaken(t, o, p)
	}
	return decideUnmined(t, o, p, bumpDue)
}

// succeeded is the receipt of a variant that succeeded, nil when none was read.
func (t track) succeeded(o observation) *receipt {
	for _, v := range t.variants {
		if rr := o.receipts[v.hash]; rr.ok && rr.r != nil && rr.r.success {
			return rr.r
		}
	}
	return nil
}

// newestReverted is the receipt of the newest variant that reverted (nil: none read): a member
// settled again alone after its batch failed may carry the batch's variant too (recovered from the
// ledger), and its own outcome is the newer.
func (t track) newestReverted(o observation) *receipt {
	for i := len(t.variants) - 1; i >= 0; i-- {
		if rr := o.receipts[t.variants[i].hash]; rr.ok && rr.r != nil && !rr.r.success {
			return rr.r
		}
	}
	return nil
}

// minedResolution is the outcome a successful receipt records; one without the expected Transfer
// log is mined with its error.
func minedResolution(r *receipt) facilitator.Resolution {
	res := facilitator.Resolution{State: facilitator.StateMined, TxHash: r.tx, BlockNumber: r.block, BlockHash: r.blockHash}
	if !r.transfer {
		res.ErrorReason, res.ErrorMessage = facilitator.ReasonTransferEventMismatch, "the transaction succeeded without the expected Transfer event"
	}
	return res
}

// beforeReads decides for an open settlement without the pinned reads: what would need them asks
// for them (at the block a verdict or a revert names), and otherwise resends are timed.
func beforeReads(t track, o observation, p policy, reverted *receipt, bumpDue bool) decision {
	expiring := t.validBefore != nil && big.NewInt(o.now.Unix()).Cmp(t.validBefore) >= 0
	switch {
	case t.verdict != nil:
		return decision{act: actReadAt, at: t.verdict.at, verdict: t.verdict, why: "second read of a verdict"}
	case reverted != nil:
		return decision{act: actReadAt, at: reverted.block, why: "a variant reverted: who used the authorization?"}
	case o.nonceLow, bumpDue, expiring, unsentBump(t):
		return decision{act: actReadAt, why: "nonce called too low, bump due or not sent yet, or validBefore passed: read the chain first"}
	}
	return resendTiming(t, o, p, t.verdict)
}

// decideUse decides on the authorization's use at the pinned block: the use log names who used
// it. ok is false when it is unused there.
func decideUse(t track, o observation, p policy) (d decision, ok bool) {
	c := o.chain
	if u := c.use; u != nil {
		mined := facilitator.Resolution{State: facilitator.StateMined, TxHash: u.tx, BlockNumber: u.block, BlockHash: u.blockHash}
		if !u.canceled && t.has(u.tx) {
			// Ours: the log is the proof (its receipt may not have been read yet).
			return decision{act: actResolve, res: mined, why: "the authorization's use log names our transaction"}, true
		}
		if !u.canceled && u.ours {
			// Sent from our key, and no variant the ledger holds: a variant whose record the
			// ledger lost (a failover, a restore) mined. It is the settlement's transfer.
			return decision{act: actAdopt, res: mined, why: "the authorization's use log names a transaction of our key the ledger lost"}, true
		}
		if !u.canceled && u.senderUnknown {
			return waitFor("the authorization's use log names a transaction that could not be read: whose it is is not known yet"), true
		}
		if u.canceled {
			return t.terminal(o, p, c.at, c.atHash, facilitator.Resolution{State: facilitator.StateCanceled, TxHash: u.tx, BlockNumber: u.block, BlockHash: u.blockHash,
				ErrorReason: facilitator.ReasonNonceAlreadyUsed, ErrorMessage: "the authorizer canceled the authorization"}, "canceled by the authorizer"), true
		}
		return t.terminal(o, p, c.at, c.atHash, facilitator.Resolution{State: facilitator.StateSettledElsewhere, TxHash: u.tx, BlockNumber: u.block, BlockHash: u.blockHash,
			ErrorReason: facilitator.ReasonNonceAlreadyUsed, ErrorMessage: "the authorization was used by a transaction that is not ours"}, "used by another transaction"), true
	}
	if c.used {
		// Used, but no log says by whom within the look-back window (or the node's logs lag its
		// state): nothing is decided; the index answers reconcile later.
		return waitFor("the authorization is used and no log in the window says by whom"), true
	}
	return decision{}, false
}

// decideExpired decides for an authorization unused at a pinned block past its validBefore: every
// later block is later than validBefore, so nothing, ours or anyone's, can use it now.
func decideExpired(t track, o observation, p policy, reverted *receipt) decision {
	c := o.chain
	msg := "validBefore passed with the authorization unused"
	if c.keyNonce > t.txNonce && c.receiptsComplete && !t.mayHaveReceipt(o) {
		msg += fmt.Sprintf("; the signer's tx nonce %d was taken by a transaction that is not ours", t.txNonce)
	}
	res := facilitator.Resolution{State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore, ErrorMessage: msg}
	if reverted != nil {
		// Ours was mined too late, and reverted: the record names it.
		res.TxHash, res.BlockNumber, res.BlockHash = reverted.tx, reverted.block, reverted.blockHash
		res.ErrorMessage = "the authorization expired before the transaction was mined"
	}
	return t.terminal(o, p, c.at, c.atHash, res, "expired unused")
}

// decideReverted decides for a variant of ours that reverted with the authorization unused and
// valid (the payer's balance, a bad signature): a plain failure, once no other variant of ours can
// still land.
func decideReverted(t track, o observation, p policy, reverted *receipt) decision {
	c := o.chain
	if !t.allNoncesUsed(c.keyNonce) {
		return waitFor("a variant reverted; another nonce of ours may still land")
	}
	res := facilitator.Resolution{State: facilitator.StateReverted, TxHash: reverted.tx, BlockNumber: reverted.block, BlockHash: reverted.blockHash,
		ErrorReason: facilitator.ReasonTransactionFailed, ErrorMessage: "the transaction reverted"}
	if reverted.batchFailed {
		res.ErrorReason, res.ErrorMessage = facilitator.ReasonBatchCallFailed, "the settlement's call reverted inside the batch transaction (the batch's other settlements stand)"
	}
	if t.batched {
		return t.batchReverted(o, p, res)
	}
	return t.terminal(o, p, c.at, c.atHash, res, "reverted")
}

// decideNonceTaken decides for a settlement whose nonce something holds, mined, with the
// authorization unused and valid. If it is ours its receipt is there.
func decideNonceTaken(t track, o observation, p policy) decision {
	c := o.chain
	if !c.receiptsComplete || t.mayHaveReceipt(o) {
		return waitFor("the nonce is used; reading our receipts again")
	}
	// None of ours: a foreign transaction took the nonce, and the authorization is unused.
	if t.tooLateToResign(c, p) {
		return waitFor("a foreign transaction took the nonce; too close to validBefore to re-sign")
	}
	if t.batched {
		// The batch can never mine: its members still valid are signed again as a new batch
		// at a new nonce (a new family for each of them, foreign.go's resignBatch). The
		// ledger hands the old batch's variants to the members left behind, so the evidence
		// must be final: the nonce used in a final block, the authorization unused there,
		// read twice.
		if !final(c.at, o, p) {
			return notFinal(o, p, "a foreign transaction took the batch's nonce")
		}
		return twice(t, decision{act: actResign, why: "a foreign transaction took the batch's nonce"}, c.at, c.atHash)
	}
	return twice(t, decision{act: actResign, why: "a foreign transaction took the nonce"}, c.at, c.atHash)
}

// decideUnmined decides for a settlement whose nonce is unused at the pinned block: fill a nonce
// gap below it, bump it, or time its resend.
func decideUnmined(t track, o observation, p policy, bumpDue bool) decision {
	if d, ok := fillGap(t, o, p, bumpDue); ok {
		return d
	}
	if bumpDue {
		// The nonce is unused at the pinned block (the bump rule: fees.go).
		d, _ := bumpOnReads(t, o, "unmined past the bump interval, or underpriced")
		return d
	}
	if unsentBump(t) {
		return sendBumpOnReads(o)
	}
	return resendTiming(t, o, p, nil)
}

// tooLateToResign reports whether a transaction signed now could not land before validBefore, by
// the pinned block's clock and the re-sign margin.
func (t track) tooLateToResign(c *chainRead, p policy) bool {
	return t.validBefore != nil && new(big.Int).SetUint64(c.time+uint64(p.resignMargin/time.Second)).Cmp(t.validBefore) >= 0
}

// terminal is a failure outcome, resting on the block at (with hash atHash): carried out only
// once that block is final by the network's rule, as the node that answered the evidence says
// (a reorg above it could take the evidence away
// and let ours land), and on the second read there. Until then the verdict says where to read.
func (t track) terminal(o observation, p policy, at uint64, atHash common.Hash, res facilitator.Resolution, why string) decision {
	if !final(at, o, p) {
		return notFinal(o, p, why)
	}
	return twice(t, decision{act: actResolve, res: res, why: why}, at, atHash)
}

// batchReverted decides for a batch's member whose call did not transfer (the batch reverted, or
// its call reverted inside it) with the authorization unused and valid at the pinned block, and
// every variant's nonce used: the batch can never transfer for it. Unless the failure is the
// payment's own (the payer's balance short of the value there: answered res, as before), the
// member is settled again alone
// (once: the new transaction is not a batch's), on the evidence a terminal answer would need
// (final, read twice); a batch another payer sank, or a chain without Multicall3, must not fail
// payments that can still settle. res is the answer it gets when it is not settled again.
func (t track) batchReverted(o observation, p policy, res facilitator.Resolution) decision {
	c := o.chain
	switch {
	case c.balance == nil:
		// Not read (a reader that does not know the settlement is a batch's): as before.
		return t.terminal(o, p, c.at, c.atHash, res, "reverted")
	case t.value != nil && c.balance.Cmp(t.value) < 0:
		// Answered as before (batch_call_failed, or transaction_failed for a batch that reverted),
		// the message naming the shortfall.
		res.ErrorMessage = fmt.Sprintf("%s; the payer's balance at block %d (%s) is short of the payment (%s)", res.ErrorMessage, c.at, c.balance, t.value)
		return t.terminal(o, p, c.at, c.atHash, res, "reverted inside the batch: the payer's balance is short")
	case t.tooLateToResign(c, p):
		return t.terminal(o, p, c.at, c.atHash, res, "reverted inside the batch, too close to validBefore to settle again")
	case !final(c.at, o, p):
		return notFinal(o, p, "the batch did not transfer for it")
	}
	return twice(t, decision{act: actResettle, why: "the batch did not transfer for it; settling it again alone"}, c.at, c.atHash)
}
