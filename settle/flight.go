package settle

import (
	"bytes"
	"context"
	"math/big"
	"slices"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// flight is a settlement this process is working: its transactions, and everyone waiting for
// its outcome. The ledger row is the truth; a flight is the engine's working copy of it.
type flight struct {
	id          int64
	key         facilitator.AuthorizationKey
	fingerprint facilitator.Fingerprint
	payTo       common.Address
	value       *big.Int
	validBefore *big.Int
	sender      *sender
	nonce       uint64
	gas         uint64
	// estimate is the gas estimate of the flight's own call sent alone, before any margin (0 when
	// the flight was recovered from the ledger, which keeps only transactions' limits): a batch
	// re-signed with some of its calls is sized from its members' (resignGas).
	estimate uint64
	data     []byte
	// to is what the transaction calls: the token, or Multicall3 for a batch's (batched).
	to      common.Address
	batched bool
	// family is the batch the flight's transaction is shared with (nil: a lone settlement): its
	// family-level steps (a fee bump) are taken once for every member.
	family *family
	// paymentID is the payment-identifier id the settlement came with, for logs ("" when none, or
	// when the flight was recovered from the ledger).
	paymentID string

	mu        sync.Mutex
	state     facilitator.State
	minedHash common.Hash
	block     uint64
	blockHash common.Hash
	reason    string
	message   string
	txs       []*sentTx     // in the order signed; the last is the one to (re)send
	unsure    []common.Hash // signed variants whose ledger write answered an error (track.unsure)
	changed   chan struct{}
	// counted: the flight is in its sender's in-flight count (signed, not yet resolved).
	counted bool
	// dropped: this process lost the flight's key; the key's next holder works the settlement.
	dropped bool
	// resolving: the flight's outcome is being written to the ledger; the watcher leaves it alone.
	resolving bool
	// nonceLow: a node refused the latest variant as nonce too low; the watcher checks whether a
	// foreign transaction took the nonce (foreign.go).
	nonceLow bool
	// verdict: a conclusion one read supported, awaiting its second read (sendstate.go).
	verdict *verdict
	// closing: resolved as a failure while its tx nonce may be unused; resent until it is used.
	closing bool
	// move: a re-sign at a new nonce whose ledger write's outcome is unknown (foreign.go).
	move *pendingMove
	// claim: the success claim of the first caller waiting here, written with a mined outcome
	// (facilitator.Resolution.Claim) so that the caller's success costs no statement of its own.
	claim *waitClaim
}

// waitClaim is a waiting caller's claim of a flight's success, from offer to answer.
type waitClaim struct {
	keyID string
	token []byte
	// sent: an outcome write carries it, its result not known yet; recorded: the ledger has it,
	// and it is the caller's to answer with; gone: the caller left while it was sent, so the
	// writer releases it if it was recorded.
	sent, recorded, gone bool
	// at is when the write carrying it began: its lease runs from a moment after.
	at time.Time
}

// offerClaim registers a waiting caller's claim (with API key keyID and a token no other claim
// has) to be written with the flight's mined outcome. Only one caller's is carried, and only
// while the outcome is not known: false when it is not registered (the caller claims itself).
func (f *flight) offerClaim(keyID string, token []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claim != nil || !f.state.Open() || f.resolving || f.dropped {
		return false
	}
	f.claim = &waitClaim{keyID: keyID, token: token}
	return true
}

// attachClaimLocked puts the waiting caller's claim on a success about to be written, under the same
// lock that marks the flight resolving: a caller leaving after it knows the write carries it.
func (f *flight) attachClaimLocked(res *facilitator.Resolution, lease time.Duration, now time.Time) {
	c := f.claim
	if c == nil || c.sent || c.recorded || !res.State.Succeeded() || res.ErrorReason != "" {
		return
	}
	c.sent, c.at = true, now
	res.Claim = &facilitator.SuccessClaim{KeyID: c.keyID, Token: c.token, Lease: lease}
}

// claimWrittenLocked settles the carried claim once its write returned (recorded: the ledger has
// it); it reports whether the claim must be released (its caller is gone). A claim whose write
// failed or was not recorded is dropped, and its token is never carried again: a write whose
// outcome is unknown may still commit it, and its release must not undo a later claim.
func (f *flight) claimWrittenLocked(token []byte, recorded bool) (release bool) {
	c := f.claim
	if c == nil || !c.sent || !bytes.Equal(c.token, token) {
		return false
	}
	if recorded && !c.gone {
		c.sent, c.recorded = false, true
		return false
	}
	f.claim = nil
	return recorded
}

// takeClaim ends a caller's wait: true when its claim was recorded (its success is claimed), with
// when the write recording it began. A caller that leaves while a write carries its claim leaves
// it to the writer to release.
func (f *flight) takeClaim(token []byte) (bool, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.claim
	if c == nil || !bytes.Equal(c.token, token) {
		return false, time.Time{}
	}
	if c.sent {
		c.gone = true
		return false, time.Time{}
	}
	f.claim = nil
	return c.recorded, c.at
}

// logAttrs are the fields every log line about f starts with: the settlement, its payer and
// authorization nonce, and its payment id when known; more follow.
func (f *flight) logAttrs(more ...any) []any {
	attrs := []any{"settlement", f.id, "payer", f.key.Payer, "nonce", hexutil.Encode(f.key.Nonce[:])}
	if f.paymentID != "" {
		attrs = append(attrs, "payment_id", f.paymentID)
	}
	return append(attrs, more...)
}

// sentTx is one signed variant of a flight's transaction.
type sentTx struct {
	hash     common.Hash
	nonce    uint64
	raw      []byte
	fees     Fees
	signedAt time.Time
	sentAt   time.Time // zero until a node accepted it
	tried    time.Time // last send attempt
}

// view is a consistent snapshot of a flight.
type view struct {
	id        int64
	state     facilitator.State
	hash      common.Hash // the mined variant, else the latest signed
	block     uint64
	reason    string
	message   string
	delivered bool
	dropped   bool // the process no longer works the flight: read the ledger instead
	resolving bool
	closing   bool // failed, and its transaction is resent until its nonce is used
}

func newFlight(id int64, state facilitator.State) *flight {
	return &flight{id: id, state: state, changed: make(chan struct{})}
}

func (f *flight) view() view {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.viewLocked()
}

func (f *flight) viewLocked() view {
	v := view{id: f.id, state: f.state, block: f.block, reason: f.reason, message: f.message, hash: f.minedHash, dropped: f.dropped, resolving: f.resolving, closing: f.closing}
	if v.hash == (common.Hash{}) && len(f.txs) > 0 {
		v.hash = f.txs[len(f.txs)-1].hash
	}
	return v
}

// update changes the flight under its lock and wakes its waiters.
func (f *flight) update(change func(f *flight)) {
	f.mu.Lock()
	change(f)
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// wait returns the flight's view once done(view) holds, or the latest view when ctx ends.
func (f *flight) wait(ctx context.Context, done func(view) bool) view {
	for {
		f.mu.Lock()
		v, ch := f.viewLocked(), f.changed
		f.mu.Unlock()
		if done(v) {
			return v
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return v
		}
	}
}

// count puts the flight in its sender's in-flight count (on) or takes it out; a dropped flight
// no longer counts (its sender's count was reset when it was dropped).
func (f *flight) count(on bool) {
	f.mu.Lock()
	change := f.counted != on && !f.dropped
	if change {
		f.counted = on
	}
	f.mu.Unlock()
	switch {
	case change && on:
		f.sender.inFlight.Add(1)
	case change:
		f.sender.inFlight.Add(-1)
	}
}

func (f *flight) setResolving(on bool) {
	f.mu.Lock()
	f.resolving = on
	f.mu.Unlock()
}

// txNonce is the settlement's current tx nonce (it changes when a foreign transaction took the
// previous one).
func (f *flight) txNonce() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nonce
}

func (f *flight) setVerdict(v *verdict) {
	f.mu.Lock()
	f.verdict = v
	f.mu.Unlock()
}

// want is what the settlement's transactions must do.
func (f *flight) want() Expected {
	return Expected{ID: f.id, Key: f.key, PayTo: f.payTo, Value: f.value, ValidBefore: f.validBefore, Batched: f.batched}
}

// takeNonceLow reports, and clears, whether a node called the flight's nonce too low.
func (f *flight) takeNonceLow() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.nonceLow
	f.nonceLow = false
	return was
}

// isDropped reports whether this process has let go of the flight.
func (f *flight) isDropped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped
}

// latest is the variant to (re)send.
func (f *flight) latest() *sentTx {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.txs) == 0 {
		return nil
	}
	return f.txs[len(f.txs)-1]
}

// track is the flight as the decision core sees it.
func (f *flight) track() track {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := track{state: f.state, txNonce: f.nonce, validBefore: f.validBefore, verdict: f.verdict, closing: f.closing,
		batched: f.batched && f.to == multicall3.Address, value: f.value,
		mined: minedAt{tx: f.minedHash, block: f.block, blockHash: f.blockHash}}
	t.unsure = slices.Clone(f.unsure)
	for _, x := range f.txs {
		t.variants = append(t.variants, variant{hash: x.hash, nonce: x.nonce, signedAt: x.signedAt, sentAt: x.sentAt, tried: x.tried})
	}
	return t
}

// unmine forgets where f was mined (its block left the chain) and makes the variant that was
// mined the newest, to go out again first with its bump timer restarted: a caller may have been
// told success with its hash, and the same bytes land under the same hash. Caller holds f.mu.
func (f *flight) unmine(now time.Time) {
	for i, t := range f.txs {
		if t.hash == f.minedHash && i != len(f.txs)-1 {
			f.txs = append(append(f.txs[:i:i], f.txs[i+1:]...), t)
			break
		}
	}
	if last := f.txs[len(f.txs)-1]; last.hash == f.minedHash {
		last.signedAt, last.sentAt, last.tried = now, time.Time{}, time.Time{}
	}
	f.minedHash, f.block, f.blockHash, f.verdict = common.Hash{}, 0, common.Hash{}, nil
}

// settled reports whether the flight has its outcome (success or proven failure).
func settled(v view) bool { return !v.state.Open() }

// restoreTemplate recovers each variant's nonce, and gas and calldata from the latest signed
// transaction, so a recovered flight can be fee-bumped like a new one. A flight any of whose
// transactions is a batch's is judged as a batch's member (a member settled again alone may
// still have the batch's transaction).
func (f *flight) restoreTemplate() error {
	for _, t := range f.txs {
		var tx types.Transaction
		if err := tx.UnmarshalBinary(t.raw); err != nil {
			return err
		}
		t.nonce = tx.Nonce()
		f.gas, f.data = tx.Gas(), tx.Data()
		if tx.To() != nil {
			f.to = *tx.To()
		}
		f.batched = f.batched || f.to == multicall3.Address
	}
	return nil
}

// target is what the flight's transaction calls: the token, or Multicall3 for a batch (a flight
// built before to was known calls the token).
func (f *flight) target() common.Address {
	if f.to == (common.Address{}) {
		return f.key.Asset
	}
	return f.to
}

// family is the flights of one batch transaction: sibling settlements sharing its variants, its
// nonce, gas and calldata. mu makes a family-level step (a fee bump) one step for all of them.
type family struct {
	mu      sync.Mutex
	members []*flight
}

// linkFamily makes flights, which share one batch transaction, one family.
func linkFamily(flights []*flight) {
	if len(flights) < 2 {
		return
	}
	fam := &family{members: flights}
	for _, f := range flights {
		f.family = fam
	}
}
