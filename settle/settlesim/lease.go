package settlesim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// ErrLeaseLost is a write through a lease whose session ended, as facilitator/postgres answers
// it: not one of the Store's sentinels, so that the engine reads it as the ledger unavailable to
// this process, and nothing was written.
var ErrLeaseLost = errors.New("settlesim: the signer lease's session ended: this process no longer holds the key")

// Leaser is the simulated signer leases of several processes sharing one Ledger, with the
// semantics of facilitator/postgres's session advisory locks: one holder per (network, signer)
// at a time, a queue a holder can see (Wanted), a lease lost when its session ends (the process
// died or was cut off: End, Cut), and writes through a lost lease that fail and write nothing.
// A lease's write and the lease's end are ordered under one lock, as a commit on the session
// that holds the advisory lock is ordered with the lock's release in Postgres.
//
// What a real waiter does while blocked in pg_advisory_lock, the simulated one cannot (a call
// returns at once, on the simulator's goroutine): a LeaseSigner with wait > 0 on a held key
// queues the process until the clock passes the wait, and answers nil. The holder sees it Wanted
// meanwhile, and a key given up while the queue stands goes to the process queued first, at
// its next LeaseSigner (Postgres grants it to the waiter as the holder's session ends).
//
// Every grant and every write through a lease is journaled, for the simulator's oracle (Grants,
// Writes).
type Leaser struct {
	mu     sync.Mutex
	ledger *Ledger
	clock  *Clock
	held   map[leaseKey]*Lease
	queue  map[leaseKey][]queued
	epoch  map[leaseKey]int64
	grants []LeaseGrant
	writes []LeaseWrite
}

type leaseKey struct {
	network string
	signer  common.Address
}

type queued struct {
	p     *Process
	until time.Time
}

// LeaseGrant is one lease's life: Process held Signer's lease on Network from Taken to Ended
// (zero while held), under Epoch (1, 2, … per key, like signer_leases.epoch).
type LeaseGrant struct {
	Network string
	Signer  common.Address
	Process string
	Epoch   int64
	Taken   time.Time
	Ended   time.Time
	// Cut: the lease was lost (its session ended under a live process, or the process died),
	// not released.
	Cut bool
}

// LeaseWrite is one write through a lease: Op ("insert", "add-tx", "move-nonce", "move-batch")
// of the transactions Txs at TxNonce (per row for an insert), and its error ("" when it
// answered nil; a write that answered an error may have committed all the same).
type LeaseWrite struct {
	Network string
	Signer  common.Address
	Process string
	Epoch   int64
	At      time.Time
	Op      string
	Nonces  []uint64
	Txs     []common.Hash
	Err     string
	// Lost: refused because the lease had ended (nothing was written).
	Lost bool
}

// NewLeaser returns the leases of processes sharing ledger, stamped by clock.
func NewLeaser(ledger *Ledger, clock *Clock) *Leaser {
	return &Leaser{ledger: ledger, clock: clock, held: map[leaseKey]*Lease{}, queue: map[leaseKey][]queued{}, epoch: map[leaseKey]int64{}}
}

// Process is one process's sessions: its settle.Leaser.
type Process struct {
	l    *Leaser
	name string
}

// Process returns the sessions of the process named name (a new process: none held).
func (l *Leaser) Process(name string) *Process { return &Process{l: l, name: name} }

// Name is the process's name.
func (p *Process) Name() string { return p.name }

// LeaseSigner implements settle.Leaser.
func (p *Process) LeaseSigner(ctx context.Context, network string, signer common.Address, wait time.Duration) (facilitator.SignerLease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	k := leaseKey{network, signer}
	now := l.clock.Now()
	q := l.queueLocked(k, now)
	if h := l.held[k]; h != nil {
		if wait > 0 && !slices.ContainsFunc(q, func(x queued) bool { return x.p == p }) {
			l.queue[k] = append(q, queued{p: p, until: now.Add(wait)})
		}
		return nil, nil
	}
	if len(q) > 0 && q[0].p != p {
		return nil, nil // granted to the process queued first as the holder let go
	}
	if len(q) > 0 {
		l.queue[k] = q[1:]
	}
	l.epoch[k]++
	lease := &Lease{l: l, p: p, key: k, epoch: l.epoch[k], lost: make(chan struct{}), grant: len(l.grants)}
	l.held[k] = lease
	l.grants = append(l.grants, LeaseGrant{Network: network, Signer: signer, Process: p.name, Epoch: lease.epoch, Taken: now})
	return lease, nil
}

// queueLocked is k's queue without the processes whose wait ended by now.
func (l *Leaser) queueLocked(k leaseKey, now time.Time) []queued {
	q := slices.DeleteFunc(l.queue[k], func(x queued) bool { return now.After(x.until) })
	if len(q) == 0 {
		delete(l.queue, k)
		return nil
	}
	l.queue[k] = q
	return q
}

// End ends every session of the process: its leases are lost (the process died, or its
// connection to the database did), and the keys are free for the others at once.
func (p *Process) End() {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.heldKeysLocked() {
		if h := l.held[k]; h.p == p {
			h.endLocked(true)
		}
		l.queue[k] = slices.DeleteFunc(l.queue[k], func(x queued) bool { return x.p == p })
	}
}

// Cut ends the session of the lease of signer on network, whoever holds it (a connection cut
// under a live process); it reports the holder's name, "" when nobody held it.
func (l *Leaser) Cut(network string, signer common.Address) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.held[leaseKey{network, signer}]
	if h == nil {
		return ""
	}
	h.endLocked(true)
	return h.p.name
}

// Holder names the process holding signer's lease on network, "" when none does.
func (l *Leaser) Holder(network string, signer common.Address) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.held[leaseKey{network, signer}]; h != nil {
		return h.p.name
	}
	return ""
}

// heldKeysLocked lists the held keys in a fixed order (the grants' order), so that ending them
// does not depend on map order.
func (l *Leaser) heldKeysLocked() []leaseKey {
	var out []leaseKey
	for _, g := range l.grants {
		k := leaseKey{g.Network, g.Signer}
		if h := l.held[k]; h != nil && h.epoch == g.Epoch {
			out = append(out, k)
		}
	}
	return out
}

// Grants is every lease granted so far, in order.
func (l *Leaser) Grants() []LeaseGrant {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.grants)
}

// Writes is every write through a lease so far, in order.
func (l *Leaser) Writes() []LeaseWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

// Lease is a held simulated lease: a facilitator.SignerLease.
type Lease struct {
	l     *Leaser
	p     *Process
	key   leaseKey
	epoch int64
	lost  chan struct{}
	ended bool // under l.mu
	grant int  // its LeaseGrant's index
}

// Lost implements facilitator.SignerLease.
func (h *Lease) Lost() <-chan struct{} { return h.lost }

// Wanted implements facilitator.SignerLease: another process queues for the key now.
func (h *Lease) Wanted() bool {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	return !h.ended && len(h.l.queueLocked(h.key, h.l.clock.Now())) > 0
}

// Release implements facilitator.SignerLease.
func (h *Lease) Release() {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	h.endLocked(false)
}

// Epoch is the lease's epoch (1, 2, … per key).
func (h *Lease) Epoch() int64 { return h.epoch }

func (h *Lease) endLocked(cut bool) {
	if h.ended {
		return
	}
	h.ended = true
	close(h.lost)
	if h.l.held[h.key] == h {
		delete(h.l.held, h.key)
	}
	g := &h.l.grants[h.grant]
	g.Ended, g.Cut = h.l.clock.Now(), cut
}

// write runs a write through the lease: refused once the lease ended, journaled either way.
func (h *Lease) write(op string, nonces []uint64, txs []common.Hash, f func() error) error {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	w := LeaseWrite{Network: h.key.network, Signer: h.key.signer, Process: h.p.name, Epoch: h.epoch, At: h.l.clock.Now(),
		Op: op, Nonces: nonces, Txs: txs}
	var err error
	if h.ended {
		w.Lost, err = true, fmt.Errorf("%s: %w", op, ErrLeaseLost)
	} else {
		err = f()
	}
	if err != nil {
		w.Err = err.Error()
	}
	h.l.writes = append(h.l.writes, w)
	return err
}

// InsertSettlement implements facilitator.SignerLease.
func (h *Lease) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	var id int64
	err := h.write("insert", []uint64{s.TxNonce}, []common.Hash{s.Tx.Hash}, func() (err error) {
		id, err = h.l.ledger.InsertSettlement(ctx, s)
		return err
	})
	return id, err
}

// InsertSettlements implements facilitator.SignerLease.
func (h *Lease) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	var nonces []uint64
	var txs []common.Hash
	for _, r := range rows {
		nonces, txs = append(nonces, r.TxNonce), append(txs, r.Tx.Hash)
	}
	var ids []int64
	err := h.write("insert", nonces, txs, func() (err error) {
		ids, err = h.l.ledger.InsertSettlements(ctx, rows)
		return err
	})
	return ids, err
}

// AddTx implements facilitator.SignerLease.
func (h *Lease) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	return h.write("add-tx", []uint64{rawNonce(tx.Raw)}, []common.Hash{tx.Hash}, func() error { return h.l.ledger.AddTx(ctx, id, tx) })
}

// MoveNonce implements facilitator.SignerLease.
func (h *Lease) MoveNonce(ctx context.Context, id int64, txNonce uint64, tx facilitator.TxRecord) error {
	return h.write("move-nonce", []uint64{txNonce}, []common.Hash{tx.Hash}, func() error { return h.l.ledger.MoveNonce(ctx, id, txNonce, tx) })
}

// MoveBatch implements facilitator.SignerLease.
func (h *Lease) MoveBatch(ctx context.Context, ids []int64, txNonce uint64, tx facilitator.TxRecord) error {
	return h.write("move-batch", []uint64{txNonce}, []common.Hash{tx.Hash}, func() error { return h.l.ledger.MoveBatch(ctx, ids, txNonce, tx) })
}

// rawNonce is the tx nonce of a signed transaction's bytes (0 when they do not decode: the
// journal's nonce of a bump is the transaction's own, which the write does not name).
func rawNonce(raw []byte) uint64 {
	var tx types.Transaction
	if tx.UnmarshalBinary(raw) != nil {
		return 0
	}
	return tx.Nonce()
}

var _ facilitator.SignerLease = (*Lease)(nil)
