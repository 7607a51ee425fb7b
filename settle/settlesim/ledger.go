package settlesim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// LedgerFaults are the ledger's fault rates, drawn per call.
type LedgerFaults struct {
	// Fail: the call fails and writes nothing (the connection was lost before the statement ran).
	Fail float64
	// Ambiguous: a write commits and the call returns an error all the same (the connection was
	// lost before the answer came back). Reads ignore it.
	Ambiguous float64
	// Slow: the call takes SlowBy, by the clock, before it runs.
	Slow   float64
	SlowBy time.Duration
}

// The errors the ledger's faults return. Neither is one of the Store's sentinels: to the engine
// they read as an unavailable ledger, which is what they are meant to look like.
var (
	ErrLedgerDown      = errors.New("settlesim: the ledger is unavailable (injected): nothing was written")
	ErrLedgerAmbiguous = errors.New("settlesim: the connection was lost after the commit (injected): the write is in")
)

// Ledger is an in-memory settlement ledger with the semantics of facilitator/postgres's
// settlements.go: the same unique keys (the authorization; the signer's tx nonce per network; a
// transaction hash; a payment id per scope), the same state transitions and the same event rows,
// in one lock instead of one transaction. The Guard's limits are not enforced: every row fits.
type Ledger struct {
	mu     sync.Mutex
	clock  *Clock
	r      *rand.Rand
	faults LedgerFaults
	trace  *Trace

	lastID   int64 // the id sequence: like bigserial, a failed insert still uses its ids
	eventSeq int64
	rows     map[int64]*ledgerRow
	byKey    map[facilitator.AuthorizationKey]*ledgerRow
	byNonce  map[nonceKey]*ledgerRow
	byTx     map[common.Hash]*ledgerRow
	pids     map[pidKey]*ledgerRow
}

type nonceKey struct {
	network string
	signer  common.Address
	nonce   uint64
	slot    int // the place in a batch (migration 0017: unique with the nonce)
}

type pidKey struct{ scope, id string }

type ledgerRow struct {
	s           facilitator.Settlement // TxHash here is the tx_hash column: the mined variant, once known
	blockHash   common.Hash
	validAfter  *big.Int
	x402Version int
	request     []byte
	keyID       string
	gasReserved *big.Int
	paymentID   *facilitator.PaymentIDBinding
	delivered   bool // success_delivered_at IS NOT NULL
	deliveredAt time.Time
	claim       []byte    // success_claim
	leaseUntil  time.Time // success_lease_until; zero: NULL (no claim, or a confirmed one)
	takeovers   int       // success_takeovers
	updatedAt   time.Time
	txs         []LedgerTx
	// family is the batch's slot-0 row, for a member past slot 0: a batch's transactions are
	// recorded once, under slot 0, and read by every member (as settlement_txs is in Postgres).
	family *ledgerRow
	events []LedgerEvent
	// adopted: recorded from the chain after the ledger lost the row (adopted_at IS NOT NULL).
	adopted bool
}

// LedgerTx is one row of settlement_txs.
type LedgerTx struct {
	facilitator.TxRecord
	CreatedAt time.Time
}

// LedgerEvent is one row of settlement_events. Detail "" stands for NULL as well.
type LedgerEvent struct {
	Seq    int64
	State  string
	Detail string
	At     time.Time
}

// LedgerRow is everything the ledger holds about a settlement, for the oracle.
type LedgerRow struct {
	// Settlement is the row as SettlementByID answers it.
	Settlement facilitator.Settlement
	// MinedTxHash and BlockHash are the tx_hash and block_hash columns (zero while NULL).
	MinedTxHash common.Hash
	BlockHash   common.Hash
	ValidAfter  *big.Int
	X402Version int
	Request     []byte
	KeyID       string
	GasReserved *big.Int
	PaymentID   *facilitator.PaymentIDBinding
	Delivered   bool // a caller has been told success, at DeliveredAt
	DeliveredAt time.Time
	UpdatedAt   time.Time
	Txs         []LedgerTx
	Events      []LedgerEvent
}

// NewLedger returns an empty ledger that stamps its rows with clock (which may be nil: then
// every time is zero) and draws its faults from a generator forked from r.
func NewLedger(clock *Clock, faults LedgerFaults, r *rand.Rand) *Ledger {
	return &Ledger{clock: clock, r: Fork(r), faults: faults, rows: map[int64]*ledgerRow{},
		byKey: map[facilitator.AuthorizationKey]*ledgerRow{}, byNonce: map[nonceKey]*ledgerRow{},
		byTx: map[common.Hash]*ledgerRow{}, pids: map[pidKey]*ledgerRow{}}
}

// SetFaults changes the fault rates; LedgerFaults{} switches them off (for the end-of-run checks).
func (l *Ledger) SetFaults(f LedgerFaults) {
	l.mu.Lock()
	l.faults = f
	l.mu.Unlock()
}

// SetTrace makes the ledger record every call and its outcome in t.
func (l *Ledger) SetTrace(t *Trace) {
	l.mu.Lock()
	l.trace = t
	l.mu.Unlock()
}

func (l *Ledger) now() time.Time {
	if l.clock == nil {
		return time.Time{}
	}
	return l.clock.Now()
}

// call runs f under the ledger's lock with the call's faults, drawn always in the same number so
// that one call's outcome never shifts the next one's draws.
func (l *Ledger) call(ctx context.Context, op string, write bool, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if faultless(ctx) {
		err := f()
		l.trace.Record("ledger %s (no faults): %v", op, err)
		return err
	}
	slow, u := l.r.Float64() < l.faults.Slow, l.r.Float64()
	if slow && l.clock != nil {
		l.clock.Advance(l.faults.SlowBy)
	}
	if u < l.faults.Fail {
		l.trace.Record("ledger %s: %v", op, ErrLedgerDown)
		return fmt.Errorf("%s: %w", op, ErrLedgerDown)
	}
	err := f()
	if write && u < l.faults.Fail+l.faults.Ambiguous {
		// The answer is lost whatever it was; a write that failed on a key wrote nothing, and the
		// caller cannot tell that either.
		l.trace.Record("ledger %s: %v (was %v)", op, ErrLedgerAmbiguous, err)
		return fmt.Errorf("%s: %w", op, ErrLedgerAmbiguous)
	}
	l.trace.Record("ledger %s: %v", op, err)
	return err
}

func (l *Ledger) event(r *ledgerRow, state, detail string) {
	l.eventSeq++
	r.events = append(r.events, LedgerEvent{Seq: l.eventSeq, State: state, Detail: detail, At: l.now()})
}

// settlement is r as the Store answers it: tx_hash falls back to the latest variant while
// nothing is mined, and nothing is shared with the ledger.
func (r *ledgerRow) settlement() *facilitator.Settlement {
	s := r.s
	s.Value, s.ValidBefore = cloneBig(s.Value), cloneBig(s.ValidBefore)
	if txs := r.familyTxs(); s.TxHash == (common.Hash{}) && len(txs) > 0 {
		s.TxHash = txs[len(txs)-1].Hash
	}
	s.Delivered, s.BlockHash, s.ClaimTakeovers, s.Adopted = r.delivered, r.blockHash, r.takeovers, r.adopted
	return &s
}

// familyTxs are the row's transactions: its own, or its batch's.
func (r *ledgerRow) familyTxs() []LedgerTx {
	if r.family != nil {
		return r.family.txs
	}
	return r.txs
}

func cloneBig(b *big.Int) *big.Int {
	if b == nil {
		return nil
	}
	return new(big.Int).Set(b)
}

func cloneTx(t facilitator.TxRecord) facilitator.TxRecord {
	return facilitator.TxRecord{Hash: t.Hash, Raw: slices.Clone(t.Raw), TipCap: cloneBig(t.TipCap), FeeCap: cloneBig(t.FeeCap), Gas: t.Gas}
}

// settlementBy is a read of one row, the one find gives (facilitator.ErrNotFound: none), as the
// call op, with the ledger's faults.
func (l *Ledger) settlementBy(ctx context.Context, op string, find func() *ledgerRow) (*facilitator.Settlement, error) {
	var out *facilitator.Settlement
	err := l.call(ctx, op, false, func() error {
		r := find()
		if r == nil {
			return facilitator.ErrNotFound
		}
		out = r.settlement()
		return nil
	})
	return out, err
}

// SettlementByKey implements settle.Store.
func (l *Ledger) SettlementByKey(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	return l.settlementBy(ctx, fmt.Sprintf("by-key %x", key.Nonce[:4]), func() *ledgerRow { return l.byKey[key] })
}

// SettlementByID implements settle.Store.
func (l *Ledger) SettlementByID(ctx context.Context, id int64) (*facilitator.Settlement, error) {
	return l.settlementBy(ctx, fmt.Sprintf("by-id %d", id), func() *ledgerRow { return l.rows[id] })
}

// SettlementByTx returns the settlement one of whose transactions has hash h (as the Postgres
// ledger's, which reconcile uses).
func (l *Ledger) SettlementByTx(ctx context.Context, h common.Hash) (*facilitator.Settlement, error) {
	return l.settlementBy(ctx, "by-tx "+h.Hex(), func() *ledgerRow { return l.byTx[h] })
}

// InsertSettlement implements settle.Store: the row, its first transaction, its "signed" event
// and its payment id, at once.
func (l *Ledger) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	var id int64
	err := l.call(ctx, fmt.Sprintf("insert nonce=%d", s.TxNonce), true, func() error {
		ids, err := l.insertLocked([]*facilitator.NewSettlement{s})
		if err == nil {
			id = ids[0]
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	return id, nil
}

// InsertSettlements implements settle.Store: all rows or none; the error is the first failing
// row's. Guards never refuse here, so it never answers facilitator.ErrGroupRefused.
func (l *Ledger) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	var ids []int64
	err := l.call(ctx, fmt.Sprintf("insert-group n=%d", len(rows)), true, func() error {
		var err error
		ids, err = l.insertLocked(rows)
		return err
	})
	if err != nil {
		return nil, err // a lost answer carries no ids, whatever was written
	}
	return ids, nil
}

// insertLocked checks every row, in order, against the ledger and the group's earlier rows,
// with the unique keys in the order Postgres checks them, then writes them all.
func (l *Ledger) insertLocked(news []*facilitator.NewSettlement) ([]int64, error) {
	keys := map[facilitator.AuthorizationKey]bool{}
	nonces := map[nonceKey]bool{}
	hashes := map[common.Hash]bool{}
	pids := map[pidKey]bool{}
	ids := make([]int64, len(news))
	for i, s := range news {
		l.lastID++
		ids[i] = l.lastID
		switch {
		case s.Value == nil || s.ValidAfter == nil || s.ValidBefore == nil || s.Request == nil || s.Tx.TipCap == nil || s.Tx.FeeCap == nil || s.Tx.Raw == nil:
			return nil, errors.New(`settlesim: null value violates a not-null constraint of "settlements"`)
		case l.byKey[s.Key] != nil || keys[s.Key]:
			return nil, facilitator.ErrDuplicate
		}
		nk := nonceKey{s.Key.Network, s.Signer, s.TxNonce, s.BatchSlot}
		if l.byNonce[nk] != nil || nonces[nk] {
			return nil, facilitator.ErrNonceTaken
		}
		if slot0 := (nonceKey{s.Key.Network, s.Signer, s.TxNonce, 0}); s.BatchSlot > 0 && l.byNonce[slot0] == nil && !nonces[slot0] {
			return nil, errors.New("settlesim: a batch member past slot 0 with no slot 0 at its tx nonce")
		}
		if s.BatchSlot == 0 && (l.byTx[s.Tx.Hash] != nil || hashes[s.Tx.Hash]) {
			return nil, facilitator.ErrDuplicate // settlement_txs_pkey, translated as any other key
		}
		if s.PaymentID != nil {
			pk := pidKey{s.PaymentID.Scope, s.PaymentID.ID}
			if l.pids[pk] != nil || pids[pk] {
				return nil, facilitator.ErrPaymentIDTaken
			}
			pids[pk] = true
		}
		keys[s.Key], nonces[nk], hashes[s.Tx.Hash] = true, true, true
	}
	now := l.now()
	for i, s := range news {
		r := &ledgerRow{
			s: facilitator.Settlement{ID: ids[i], Key: s.Key, Fingerprint: s.Fingerprint, PayTo: s.PayTo, Value: cloneBig(s.Value),
				ValidBefore: cloneBig(s.ValidBefore), Signer: s.Signer, TxNonce: s.TxNonce, BatchSlot: s.BatchSlot, State: facilitator.StateSigned, CreatedAt: now},
			validAfter: cloneBig(s.ValidAfter), x402Version: s.X402Version, request: slices.Clone(s.Request), keyID: s.KeyID,
			gasReserved: new(big.Int), updatedAt: now,
		}
		if s.GasReserved != nil {
			r.gasReserved.Set(s.GasReserved)
		}
		tx := cloneTx(s.Tx)
		tx.Gas = 0 // the ledger keeps no gas limit: records read back leave it 0
		if s.BatchSlot == 0 {
			r.txs = []LedgerTx{{TxRecord: tx, CreatedAt: now}}
			l.event(r, string(facilitator.StateSigned), fmt.Sprintf("tx %s nonce %d", s.Tx.Hash.Hex(), s.TxNonce))
		} else {
			r.family = l.byNonce[nonceKey{s.Key.Network, s.Signer, s.TxNonce, 0}] // checked above
			l.event(r, string(facilitator.StateSigned), fmt.Sprintf("tx %s nonce %d slot %d", s.Tx.Hash.Hex(), s.TxNonce, s.BatchSlot))
		}
		if s.PaymentID != nil {
			p := *s.PaymentID
			p.Summary = cloneSummary(p.Summary)
			r.paymentID = &p
			l.pids[pidKey{p.Scope, p.ID}] = r
		}
		l.rows[r.s.ID] = r
		l.byKey[s.Key] = r
		l.byNonce[nonceKey{s.Key.Network, s.Signer, s.TxNonce, s.BatchSlot}] = r
		if s.BatchSlot == 0 {
			l.byTx[s.Tx.Hash] = r
		}
	}
	return ids, nil
}

func cloneSummary(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// MoveNonce implements settle.Store: the re-signed transaction and the new tx nonce, at once,
// for a settlement still signed or broadcast.
func (l *Ledger) MoveNonce(ctx context.Context, id int64, txNonce uint64, tx facilitator.TxRecord) error {
	return l.call(ctx, fmt.Sprintf("move-nonce %d to %d", id, txNonce), true, func() error {
		r := l.rows[id]
		if r == nil || r.s.State.Succeeded() {
			return facilitator.ErrNotFound
		}
		nk := nonceKey{r.s.Key.Network, r.s.Signer, txNonce, 0}
		if other := l.byNonce[nk]; other != nil && other != r {
			return facilitator.ErrNonceTaken
		}
		if l.byTx[tx.Hash] != nil {
			return facilitator.ErrDuplicate
		}
		was := r.s.TxNonce
		delete(l.byNonce, nonceKey{r.s.Key.Network, r.s.Signer, was, 0})
		r.s.TxNonce = txNonce
		l.byNonce[nk] = r
		if reserved := reservedGas(tx); reserved.Sign() > 0 && reserved.Cmp(r.gasReserved) > 0 {
			r.gasReserved = reserved
		}
		r.updatedAt = l.now()
		l.addTxLocked(r, tx)
		l.event(r, "renonced", fmt.Sprintf("tx nonce %d left for tx %s nonce %d", was, tx.Hash.Hex(), txNonce))
		return nil
	})
}

// MoveBatch implements settle.Store: members of one batch, still signed or broadcast, move to
// txNonce in slots 0..n-1 (in the order of ids) with the new batch's transaction under the new
// slot 0, at once; the members left at the old nonce keep its transactions under their lowest
// slot, made slot 0 (facilitator/postgres's MoveBatch).
func (l *Ledger) MoveBatch(ctx context.Context, ids []int64, txNonce uint64, tx facilitator.TxRecord) error {
	return l.call(ctx, fmt.Sprintf("move-batch %v to %d", ids, txNonce), true, func() error {
		if len(ids) == 0 || len(ids) > 100 {
			return fmt.Errorf("settlesim: a batch moves 1..100 settlements, not %d", len(ids))
		}
		rows := make([]*ledgerRow, len(ids))
		for i, id := range ids {
			r := l.rows[id]
			if r == nil || (r.s.State != facilitator.StateSigned && r.s.State != facilitator.StateBroadcast) ||
				r.s.Key.Network != l.rows[ids[0]].s.Key.Network || r.s.Signer != l.rows[ids[0]].s.Signer || r.s.TxNonce != l.rows[ids[0]].s.TxNonce {
				return facilitator.ErrNotFound
			}
			rows[i] = r
		}
		network, signer, old := rows[0].s.Key.Network, rows[0].s.Signer, rows[0].s.TxNonce
		if old == txNonce {
			return facilitator.ErrNonceTaken
		}
		for i := range rows {
			if l.byNonce[nonceKey{network, signer, txNonce, i}] != nil {
				return facilitator.ErrNonceTaken
			}
		}
		if l.byTx[tx.Hash] != nil {
			return facilitator.ErrDuplicate
		}
		slot0 := l.byNonce[nonceKey{network, signer, old, 0}]
		moving := map[*ledgerRow]bool{}
		for _, r := range rows {
			moving[r] = true
		}
		// The members left behind, in slot order.
		var left []*ledgerRow
		for slot := range 100 {
			if r := l.byNonce[nonceKey{network, signer, old, slot}]; r != nil && !moving[r] {
				left = append(left, r)
			}
		}
		share := new(big.Int).SetUint64((tx.Gas + uint64(len(ids)) - 1) / uint64(len(ids)))
		if tx.FeeCap != nil {
			share.Mul(share, tx.FeeCap)
		} else {
			share.SetInt64(0)
		}
		now := l.now()
		for _, r := range rows {
			delete(l.byNonce, nonceKey{network, signer, old, r.s.BatchSlot})
		}
		if moving[slot0] && len(left) > 0 {
			heir := left[0]
			delete(l.byNonce, nonceKey{network, signer, old, heir.s.BatchSlot})
			heir.s.BatchSlot, heir.family, heir.txs = 0, nil, slot0.txs
			l.byNonce[nonceKey{network, signer, old, 0}] = heir
			for _, t := range heir.txs {
				l.byTx[t.Hash] = heir
			}
			for _, r := range left[1:] {
				r.family = heir
			}
			slot0.txs = nil
		}
		for i, r := range rows {
			r.s.TxNonce, r.s.BatchSlot, r.family, r.updatedAt = txNonce, i, nil, now
			if i > 0 {
				r.family = rows[0]
			}
			if share.Cmp(r.gasReserved) > 0 {
				r.gasReserved = new(big.Int).Set(share)
			}
			l.byNonce[nonceKey{network, signer, txNonce, i}] = r
		}
		l.addTxLocked(rows[0], tx)
		for i, r := range rows {
			l.event(r, "renonced", fmt.Sprintf("tx nonce %d left for batch tx %s nonce %d slot %d", old, tx.Hash.Hex(), txNonce, i))
		}
		return nil
	})
}

func reservedGas(tx facilitator.TxRecord) *big.Int {
	if tx.FeeCap == nil {
		return new(big.Int)
	}
	return new(big.Int).Mul(new(big.Int).SetUint64(tx.Gas), tx.FeeCap)
}

func (l *Ledger) addTxLocked(r *ledgerRow, tx facilitator.TxRecord) {
	rec := cloneTx(tx)
	rec.Gas = 0
	// A batch's variants are recorded under its slot 0, whichever member's bump it is.
	if r.family != nil {
		r = r.family
	}
	r.txs = append(r.txs, LedgerTx{TxRecord: rec, CreatedAt: l.now()})
	l.byTx[tx.Hash] = r
}

// MarkBroadcast implements settle.Store: signed rows move to broadcast; others are left alone.
func (l *Ledger) MarkBroadcast(ctx context.Context, ids []int64) error {
	return l.call(ctx, fmt.Sprintf("mark-broadcast %v", ids), true, func() error {
		for _, id := range dedupe(ids) {
			if r := l.rows[id]; r != nil && r.s.State == facilitator.StateSigned {
				r.s.State, r.updatedAt = facilitator.StateBroadcast, l.now()
				l.event(r, string(facilitator.StateBroadcast), "")
			}
		}
		return nil
	})
}

// ReleaseDelivery implements settle.Store.
func (l *Ledger) ReleaseDelivery(ctx context.Context, id int64, claim []byte) error {
	return l.call(ctx, fmt.Sprintf("release-delivery %d", id), true, func() error {
		// Only the claim made with this token (the token is not in the trace: it is random).
		if r := l.rows[id]; r != nil && r.delivered && bytes.Equal(r.claim, claim) {
			r.delivered, r.deliveredAt, r.claim, r.leaseUntil = false, time.Time{}, nil, time.Time{}
		}
		return nil
	})
}

// ConfirmDeliveries implements settle.Store.
func (l *Ledger) ConfirmDeliveries(ctx context.Context, ds []facilitator.Delivery) ([]int64, error) {
	var lapsed []int64
	ids := make([]int64, len(ds))
	for i, d := range ds {
		ids[i] = d.ID
	}
	err := l.call(ctx, fmt.Sprintf("confirm-deliveries %v", ids), true, func() error {
		lapsed = nil
		for _, d := range ds {
			if r := l.rows[d.ID]; r != nil && r.delivered && bytes.Equal(r.claim, d.Claim) {
				r.leaseUntil = time.Time{}
				continue
			}
			lapsed = append(lapsed, d.ID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return lapsed, nil
}

// claimFree reports whether r's success can be claimed now: unclaimed, or its claim's lease over
// unconfirmed (as success_delivered_at IS NULL OR success_lease_until < now()).
func (l *Ledger) claimFree(r *ledgerRow) bool {
	return !r.delivered || (!r.leaseUntil.IsZero() && r.leaseUntil.Before(l.now()))
}

// take records claim as r's success claim for lease, counting a takeover of a lapsed one.
func (l *Ledger) take(r *ledgerRow, claim []byte, lease time.Duration) {
	if r.delivered {
		r.takeovers++
	}
	r.delivered, r.deliveredAt, r.claim, r.leaseUntil = true, l.now(), slices.Clone(claim), l.now().Add(lease)
}

// claimHeld reports whether r's success is claimed by a caller whose claim is undecided.
func (l *Ledger) claimHeld(r *ledgerRow) bool {
	return r.delivered && !r.leaseUntil.IsZero() && !r.leaseUntil.Before(l.now())
}

// OpenSettlements implements settle.Store: the signer's signed, broadcast and mined rows, in tx
// nonce order, each with every transaction it signed, oldest first.
func (l *Ledger) OpenSettlements(ctx context.Context, network string, signer common.Address) ([]facilitator.OpenSettlement, error) {
	var out []facilitator.OpenSettlement
	err := l.call(ctx, "open "+signer.Hex(), false, func() error {
		for _, id := range l.idsLocked() {
			r := l.rows[id]
			if r.s.Key.Network != network || r.s.Signer != signer || !(r.s.State.Open() || r.s.State == facilitator.StateMined) {
				continue
			}
			o := facilitator.OpenSettlement{Settlement: *r.settlement()}
			for _, t := range r.familyTxs() {
				o.Txs = append(o.Txs, cloneTx(t.TxRecord))
			}
			out = append(out, o)
		}
		slices.SortStableFunc(out, func(a, b facilitator.OpenSettlement) int {
			switch {
			case a.TxNonce < b.TxNonce:
				return -1
			case a.TxNonce > b.TxNonce:
				return 1
			}
			return 0
		})
		return nil
	})
	return out, err
}

// NoncesHeld implements settle.Store.
func (l *Ledger) NoncesHeld(ctx context.Context, network string, signer common.Address, from uint64) ([]uint64, error) {
	var out []uint64
	err := l.call(ctx, fmt.Sprintf("nonces-held %s %d", signer.Hex(), from), false, func() error {
		out = nil
		for _, r := range l.rows {
			if r.s.Key.Network == network && r.s.Signer == signer && r.s.TxNonce >= from {
				out = append(out, r.s.TxNonce)
			}
		}
		slices.Sort(out)
		return nil
	})
	return out, err
}

// MaxTxNonce implements settle.Store.
func (l *Ledger) MaxTxNonce(ctx context.Context, network string, signer common.Address) (uint64, bool, error) {
	var (
		top uint64
		ok  bool
	)
	err := l.call(ctx, "max-nonce "+signer.Hex(), false, func() error {
		for _, r := range l.rows {
			if r.s.Key.Network == network && r.s.Signer == signer && (!ok || r.s.TxNonce > top) {
				top, ok = r.s.TxNonce, true
			}
		}
		return nil
	})
	return top, ok, err
}

// WalletCapWait implements settle.Store. The simulated ledger enforces no limit, so every
// settlement fits now.
func (l *Ledger) WalletCapWait(ctx context.Context, network string, asset, payer common.Address, value *big.Int, g facilitator.Limits) (time.Duration, error) {
	var wait time.Duration
	err := l.call(ctx, "wallet-cap-wait", false, func() error { return nil })
	return wait, err
}

func (l *Ledger) idsLocked() []int64 {
	ids := make([]int64, 0, len(l.rows))
	for id := range l.rows {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func dedupe(ids []int64) []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// Rows is the oracle's view of the ledger: every row with its transactions and events, by id,
// read without faults.
func (l *Ledger) Rows() []LedgerRow {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LedgerRow
	for _, id := range l.idsLocked() {
		out = append(out, l.rowLocked(l.rows[id]))
	}
	return out
}

// Row is the oracle's view of one row, read without faults.
func (l *Ledger) Row(id int64) (LedgerRow, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rows[id]
	if r == nil {
		return LedgerRow{}, false
	}
	return l.rowLocked(r), true
}

func (l *Ledger) rowLocked(r *ledgerRow) LedgerRow {
	out := LedgerRow{Settlement: *r.settlement(), MinedTxHash: r.s.TxHash, BlockHash: r.blockHash, ValidAfter: cloneBig(r.validAfter),
		X402Version: r.x402Version, Request: slices.Clone(r.request), KeyID: r.keyID, GasReserved: cloneBig(r.gasReserved),
		Delivered: r.delivered, DeliveredAt: r.deliveredAt, UpdatedAt: r.updatedAt, Events: slices.Clone(r.events)}
	if r.paymentID != nil {
		p := *r.paymentID
		p.Summary = cloneSummary(p.Summary)
		out.PaymentID = &p
	}
	for _, t := range r.familyTxs() {
		out.Txs = append(out.Txs, LedgerTx{TxRecord: cloneTx(t.TxRecord), CreatedAt: t.CreatedAt})
	}
	return out
}
