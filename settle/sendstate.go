package settle

import (
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The engine's decisions are one pure function, decide: from what the engine knows of a
// settlement (track), what a round just read from the chain (observation) and the policy, to one
// action. The watcher's loops only gather observations and carry actions out, the way op-service
// txmgr keeps its SendState apart from its I/O; here decide is table-tested transition by
// transition (sendstate_test.go) and driven by the simulator (sim_test.go).
//
// The rules it keeps are invariants 3 and 8 of ARCHITECTURE.md. A read that failed, or came from a node
// that lacks the block in question, means "not known yet", never "no". A null receipt alone proves
// nothing: nodes behind a load balancer answer null for receipts they have not indexed. A
// terminal answer (reverted, expired, settled elsewhere, canceled, final) and every reversing
// step (reopen, move, re-sign at a new nonce) is taken only when two separate reads, each pinned
// at a block the answering node had, say the same: the first read records a verdict, the second
// carries it out.

// track is what the engine knows of one settlement between rounds.
type track struct {
	state    facilitator.State
	txNonce  uint64 // the nonce of the newest variant (it moves when a foreign transaction took the old one)
	variants []variant
	// unsure are transactions of ours signed for the settlement whose ledger write answered an
	// error (it may have committed): never sent by this process, but ours if the chain shows them
	// (the ledger's copy can be sent by another, the reconcile job's resend).
	unsure      []common.Hash
	mined       minedAt  // where it was mined, while state is mined
	validBefore *big.Int // unix seconds, by the chain's clock
	// verdict is a conclusion one read supported, waiting for a second read to act on.
	verdict *verdict
	// closing: the settlement has its outcome (a failure) while its tx nonce may still be unused on
	// chain. Its last variant is resent until the nonce is used (it can only revert now), or the
	// signer's later transactions would wait behind the gap forever.
	closing bool
	// batched: the settlement's transaction is a batch's (Multicall3), shared with other
	// settlements: it is re-signed at another nonce only on final evidence, as a new batch of the
	// members still valid, and never moved into a nonce gap; and if the batch is mined without
	// transferring for it while its authorization stays valid, it is settled again alone, once
	// (actResettle: its new transaction is not a batch's, so never again).
	batched bool
	// value is what the authorization moves: a payer's balance short of it at the pinned block
	// makes a failed batch call the payment's own failure.
	value *big.Int
}

// variant is one signed transaction of a settlement.
type variant struct {
	hash     common.Hash
	nonce    uint64
	signedAt time.Time
	sentAt   time.Time // zero until a node accepted it
	tried    time.Time // the last send attempt (zero: still in the broadcaster's queue)
}

type minedAt struct {
	tx        common.Hash
	block     uint64
	blockHash common.Hash // zero for rows recorded before block hashes were kept
}

// receipt is what a receipt says, reduced to what decisions need.
type receipt struct {
	tx       common.Hash
	success  bool
	transfer bool // the expected Transfer log is in it
	// batchFailed: a batch's receipt that succeeded without this member's transfer (its call
	// reverted inside the batch); success is false.
	batchFailed bool
	block       uint64
	blockHash   common.Hash
}

// receiptRead is one receipt read: ok false when the read failed (it says nothing); r nil when the
// node answered null.
type receiptRead struct {
	ok bool
	r  *receipt
}

// observation is what one round read about one settlement.
type observation struct {
	now time.Time
	// head is the round's head block number.
	head uint64
	// receipts has an entry for every variant whose receipt the round read.
	receipts map[common.Hash]receiptRead
	// canon is the chain's block at a mined settlement's recorded height, read in the same request
	// as its receipt; nil when not read.
	canon *canonRead
	// nonceLow: a node refused the newest variant as nonce too low since the last round.
	nonceLow bool
	// underpriced: a node refused the newest variant as underpriced since the last round.
	underpriced bool
	// chain is the pinned reads decide asked for (readChain), nil when not made or failed.
	chain *chainRead
	// highest is the highest head the engine has ever seen: a replacement rests on reads at it.
	highest uint64
	// floor is the highest tagged final block the network's nodes answered consistently: a
	// lower answer is a node gone backwards (facilitator.Finality.At).
	floor uint64
	// gap: the signer's nonce at the pinned block (chain.keyNonce) is below the settlement's and
	// no settlement holds it: a transaction that held it (a foreign one, reorganised away) is
	// gone, and every later transaction of the key waits behind it.
	gap bool
}

// canonRead is a block at a height, with the head of the node that answered and its answer for
// the network's finality tag (read in the same request).
type canonRead struct {
	head uint64
	hash common.Hash // zero: the node has no block at that height
	tag  facilitator.TagRead
}

// chainRead is a set of reads made in one request and pinned at one block, which the answering
// node was checked to have: the signer's nonce, the authorization's state and its use log, and
// the receipts of every variant.
type chainRead struct {
	at     uint64
	atHash common.Hash
	time   uint64 // the block's timestamp
	// keyNonce is the signer's nonce at the block: every tx nonce below it is mined.
	keyNonce uint64
	// nodeHead is the answering node's head: finality of the block counts from it (a node still on
	// a branch a reorganisation replaced has a head too short to call that branch's blocks final).
	nodeHead uint64
	// tag is the answering node's block under the network's finality tag, read in the same
	// request (not OK: not read, or not served; finality then counts by depth from nodeHead).
	tag facilitator.TagRead
	// used is the token's authorizationState for the authorization at the block.
	used bool
	// use is the AuthorizationUsed or AuthorizationCanceled log of the authorization up to the
	// block (nil: none found within the look-back window).
	use *authLog
	// receiptsComplete: every variant's receipt was read in the same request (observation.receipts).
	receiptsComplete bool
	// balance is the payer's token balance at the block, read for a batch's member (nil: not read).
	balance *big.Int
}

type authLog struct {
	tx        common.Hash
	canceled  bool
	block     uint64
	blockHash common.Hash
}

// policy is the engine's timing and finality rule.
type policy struct {
	finality         facilitator.Finality // when a block is final (by the chain's tag, or by depth)
	retryInterval    time.Duration
	rebroadcastAfter time.Duration
	bumpAfter        time.Duration
	resignMargin     time.Duration
}

type action int

const (
	actWait     action = iota
	actReadAt          // make the pinned reads at decision.at (0: the round's head), then decide again
	actSend            // resend the newest variant
	actBump            // replace the newest variant with higher fees, same nonce
	actResign          // sign the call again with a new nonce: a foreign transaction took the old one
	actResolve         // record decision.res, the settlement's outcome
	actFinalize        // the mined settlement is final
	actMove            // the mined transaction is now in another block: record decision.res
	actReopen          // the mined transaction left the chain, or reverted where it was re-included
	actRelease         // a closing settlement's nonce is used: stop watching it
	actResettle        // sign a batch member's own call alone at a new nonce: its batch is mined, final, and did not transfer for it
)

var actionNames = [...]string{"wait", "read", "send", "bump", "resign", "resolve", "finalize", "move", "reopen", "release", "resettle"}

func (a action) String() string { return actionNames[a] }

// decision is decide's answer.
type decision struct {
	act action
	res facilitator.Resolution // actResolve, actMove
	at  uint64                 // actReadAt
	why string                 // for logs
	// verdict is what to remember for the next round (nil: nothing).
	verdict *verdict
}

// verdict is a conclusion awaiting its second read.
type verdict struct {
	act   action
	state facilitator.State
	tx    common.Hash
	// at and atHash are the block the reads were pinned at; the second read pins at the same one
	// (and a different block there now voids the verdict).
	at     uint64
	atHash common.Hash
}

// decide is the engine's one decision for a settlement.
func decide(t track, o observation, p policy) decision {
	switch {
	case t.closing:
		return decideClosing(t, o, p)
	case t.state.Succeeded():
		return decideMined(t, o, p)
	case t.state.Open():
		return decideOpen(t, o, p)
	}
	return decision{act: actWait, why: "settled"}
}

// twice carries d out when the previous round reached the same verdict; otherwise it records
// d's verdict and waits for a second read.
func twice(t track, d decision, at uint64, atHash common.Hash) decision {
	v := &verdict{act: d.act, state: d.res.State, tx: d.res.TxHash, at: at, atHash: atHash}
	if t.verdict != nil && *t.verdict == *v {
		return d
	}
	return decision{act: actWait, verdict: v, why: "first read: " + d.why + "; confirming with a second read"}
}

// keep waits without changing the verdict: a read that failed neither confirms nor refutes it.
func keep(t track, why string) decision { return decision{act: actWait, verdict: t.verdict, why: why} }

// waitFor waits, dropping any verdict: reads that were made and do not confirm it refute it.
func waitFor(why string) decision { return decision{act: actWait, why: why} }

func decideMined(t track, o observation, p policy) decision {
	rr, read := o.receipts[t.mined.tx]
	if !read && o.canon != nil && t.mined.blockHash != (common.Hash{}) && o.canon.hash == t.mined.blockHash {
		// Not read this round, and the block at the recorded height is still the recorded one: a
		// block's hash commits to its transactions and their receipts, so the receipt is the one
		// recorded (successful, in that block). The watcher reads it beside the block for the
		// confirming read of a verdict, so a final settlement still rests on a receipt read then;
		// a read that failed or answered null says "not known", as before.
		rr, read = receiptRead{ok: true, r: &receipt{tx: t.mined.tx, success: true, block: t.mined.block, blockHash: t.mined.blockHash}}, true
	}
	if !read || !rr.ok {
		return keep(t, "receipt not read")
	}
	if r := rr.r; r != nil {
		if r.block == t.mined.block && (t.mined.blockHash == (common.Hash{}) || r.blockHash == t.mined.blockHash) && r.success {
			// Still where it was recorded: final once the answering node's finality rule covers
			// its block (by its tag, or its head's depth; a node cannot show a receipt in a block
			// it does not have).
			if o.canon == nil || o.canon.hash != r.blockHash {
				return keep(t, "the block at the recorded height was not read with the receipt")
			}
			if fp := p.finality.At(o.canon.head, o.canon.tag, o.floor); fp.Covers(r.block) {
				return twice(t, decision{act: actFinalize, why: "final by " + fp.Rule}, r.block, r.blockHash)
			}
			return decision{act: actWait, why: "not final yet"}
		}
		if r.success {
			return twice(t, decision{act: actMove, res: minedResolution(r), why: "re-included in another block"}, r.block, r.blockHash)
		}
		return twice(t, decision{act: actReopen, res: facilitator.Resolution{TxHash: r.tx}, why: "re-included in another block, where it reverted"}, r.block, r.blockHash)
	}
	// A null receipt is evidence only beside the block at the recorded height, read in the same
	// request: a different block there means the recorded one was reorganised away.
	if o.canon != nil && o.canon.hash != (common.Hash{}) && t.mined.blockHash != (common.Hash{}) && o.canon.hash != t.mined.blockHash {
		return twice(t, decision{act: actReopen, why: "its block was reorganised away"}, t.mined.block, o.canon.hash)
	}
	return keep(t, "null receipt from a node that may lag")
}

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
	case o.nonceLow, bumpDue, expiring:
		return decision{act: actReadAt, why: "nonce called too low, bump due or validBefore passed: read the chain first"}
	}
	return resendTiming(t, o, p, t.verdict)
}

// decideUse decides on the authorization's use at the pinned block: the use log names who used
// it. ok is false when it is unused there.
func decideUse(t track, o observation, p policy) (d decision, ok bool) {
	c := o.chain
	if u := c.use; u != nil {
		if !u.canceled && t.has(u.tx) {
			// Ours: the log is the proof (its receipt may not have been read yet).
			return decision{act: actResolve, res: facilitator.Resolution{State: facilitator.StateMined, TxHash: u.tx, BlockNumber: u.block, BlockHash: u.blockHash}, why: "the authorization's use log names our transaction"}, true
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

// finalPoint is where finality stands on the node that answered the pinned reads: by its
// answer for the tag, read in the same request, or by depth under its head.
func finalPoint(o observation, p policy) facilitator.FinalPoint {
	return p.finality.At(o.chain.nodeHead, o.chain.tag, o.floor)
}

// final reports whether block at is final on the node that answered the pinned reads.
func final(at uint64, o observation, p policy) bool { return finalPoint(o, p).Covers(at) }

// notFinal waits for evidence read in a block not final yet, and says to read again at the
// answering node's latest final block: once the evidence is there, it is final.
func notFinal(o observation, p policy, why string) decision {
	d := decision{act: actWait, why: why + ", in a block not final yet"}
	if fp := finalPoint(o, p); fp.Known {
		d.verdict = &verdict{act: actReadAt, at: fp.Block}
	}
	return d
}

func decideClosing(t track, o observation, p policy) decision {
	c := o.chain
	if c == nil {
		at := uint64(0)
		if t.verdict != nil {
			at = t.verdict.at
		}
		return decision{act: actReadAt, at: at, verdict: t.verdict, why: "is the closed settlement's nonce used yet?"}
	}
	if c.keyNonce > t.txNonce {
		// Used in a block that must stay: a reorg above it could hand the nonce back.
		if !final(c.at, o, p) {
			return notFinal(o, p, "the nonce is used")
		}
		return twice(t, decision{act: actRelease, why: "the nonce is used"}, c.at, c.atHash)
	}
	bumpDue := dueForBump(t, o, p)
	if d, ok := fillGap(t, o, p, bumpDue); ok {
		return d
	}
	if bumpDue {
		// Priced out (the base fee rose past its cap): the nonce stays a gap unless replaced. On
		// reads behind the highest head seen, the transaction is resent as it is.
		if d, ok := bumpOnReads(t, o, "closing, unmined past the bump interval, or underpriced"); ok {
			return d
		}
	}
	return resendTiming(t, o, p, nil)
}

// fillGap moves a settlement stuck behind a nonce gap down into the gap (a re-sign at the lowest
// free nonce), once the gap is there in a final block and read twice.
func fillGap(t track, o observation, p policy, stuck bool) (decision, bool) {
	c := o.chain
	if !o.gap || !stuck || c == nil || c.keyNonce >= t.txNonce || t.batched {
		return decision{}, false
	}
	if !final(c.at, o, p) {
		return notFinal(o, p, "a nonce gap below ours"), true
	}
	return twice(t, decision{act: actResign, why: whyGap}, c.at, c.atHash), true
}

// resendTiming resends a transaction no node took yet after RetryInterval, and one a node took
// but nobody mined after RebroadcastAfter (a node may have dropped it; resending is harmless).
func resendTiming(t track, o observation, p policy, keep *verdict) decision {
	if len(t.variants) == 0 {
		return decision{act: actWait}
	}
	v := t.variants[len(t.variants)-1]
	switch {
	case v.sentAt.IsZero():
		tried := v.tried
		if tried.IsZero() {
			tried = v.signedAt // still the broadcaster's to send first
		}
		if o.now.Sub(tried) >= p.retryInterval {
			return decision{act: actSend, verdict: keep, why: "no node took it yet"}
		}
	case o.now.Sub(v.tried) >= p.rebroadcastAfter:
		return decision{act: actSend, verdict: keep, why: "unmined; a node may have dropped it"}
	}
	return decision{act: actWait, verdict: keep}
}

func (t track) has(h common.Hash) bool {
	for _, v := range t.variants {
		if v.hash == h {
			return true
		}
	}
	return slices.Contains(t.unsure, h)
}

// allNoncesUsed reports whether every nonce any variant holds is below keyNonce (mined).
func (t track) allNoncesUsed(keyNonce uint64) bool {
	for _, v := range t.variants {
		if v.nonce >= keyNonce {
			return false
		}
	}
	return true
}

// whyGap is the re-sign that fills a nonce gap below ours (no transaction holds the nonce: nothing
// to find in the blocks).
const whyGap = "a nonce gap below ours: no transaction holds it"

// mayHaveReceipt reports whether a variant's receipt was not read, or read and present.
func (t track) mayHaveReceipt(o observation) bool {
	for _, v := range t.variants {
		if rr := o.receipts[v.hash]; !rr.ok || rr.r != nil {
			return true
		}
	}
	return false
}
