package settle

import (
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
	// ours: the transaction that used it was signed by one of the network's signer keys, though
	// it is none of the settlement's variants (the ledger lost the one that mined: a failover,
	// a restore). Read, from the transaction's own signature, only for a use by a transaction
	// that is not a variant.
	ours bool
	// senderUnknown: the transaction, none of the variants, could not be read (the node did not
	// give it, or gave another): whose it is is not known, so nothing is decided on it (a node
	// withholding one of ours must not make it another's).
	senderUnknown bool
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
	actAdopt           // a transaction of our key the ledger lost used the authorization: record it as the settlement's, mined (decision.res)
)

var actionNames = [...]string{"wait", "read", "send", "bump", "resign", "resolve", "finalize", "move", "reopen", "release", "resettle", "adopt"}

func (a action) String() string { return actionNames[a] }

// decision is decide's answer.
type decision struct {
	act action
	res facilitator.Resolution // actResolve, actMove, actAdopt
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
	if unsentBump(t) {
		return sendBumpOnReads(o)
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
