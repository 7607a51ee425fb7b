package settle

import (
	"context"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Leaser leases signer keys to one process at a time (ARCHITECTURE.md invariant 7: across replicas a
// signer key is leased, never shared). facilitator/postgres implements it with a session advisory
// lock per key, held on a connection of its own.
type Leaser interface {
	// LeaseSigner takes the key's lease. With wait zero it returns (nil, nil) at once when another
	// process holds it; with wait > 0 it queues behind the holder for up to wait, which tells a
	// holder of several keys that someone wants one (facilitator.SignerLease.Wanted). An error means the
	// lease store is unavailable.
	LeaseSigner(ctx context.Context, network string, signer common.Address, wait time.Duration) (facilitator.SignerLease, error)
}

// ownLease is the lease of an engine without a Leaser: every key is its own, for good (one
// process per database).
type ownLease struct{ store Store }

func (ownLease) Lost() <-chan struct{} { return nil }
func (ownLease) Wanted() bool          { return false }
func (ownLease) Release()              {}
func (o ownLease) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	return o.store.InsertSettlement(ctx, s)
}
func (o ownLease) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	return o.store.InsertSettlements(ctx, rows)
}
func (o ownLease) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	return o.store.AddTx(ctx, id, tx)
}
func (o ownLease) MoveNonce(ctx context.Context, id int64, txNonce uint64, tx facilitator.TxRecord) error {
	return o.store.MoveNonce(ctx, id, txNonce, tx)
}
func (o ownLease) MoveBatch(ctx context.Context, ids []int64, txNonce uint64, tx facilitator.TxRecord) error {
	return o.store.MoveBatch(ctx, ids, txNonce, tx)
}

// leaseBox holds a facilitator.SignerLease in an atomic.Pointer.
type leaseBox struct{ l facilitator.SignerLease }

// errNotLeased: the sender's key is not (or no longer) leased by this process; nothing was sent.
var errNotLeased = facilitator.Unavailable(facilitator.ReasonSettlerBusy,
	"the settlement signer was handed to another instance; nothing was sent, retry", nil)

// leaseWriteTimeout bounds a write through a lease. The write does not follow the caller's
// context: a caller that hangs up mid-commit must not cut the lease's session (a cancelled
// statement closes its connection, and with it the lock).
const leaseWriteTimeout = 5 * time.Second

// leaseWait is how long a process that holds no key of a network queues for one.
const leaseWait = 3 * time.Second

// held is the sender's lease, nil when this process does not hold the key.
func (s *sender) held() facilitator.SignerLease {
	if b := s.lease.Load(); b != nil {
		return b.l
	}
	return nil
}

// takeKey makes l the sender's lease and runs the key's recovery: its next nonce from the chain
// and the ledger, and every settlement the ledger holds open for it resumed (rebroadcast, watched).
// On failure the key is not used.
func (e *Engine) takeKey(ctx context.Context, s *sender, l facilitator.SignerLease) error {
	s.mu.Lock()
	s.nonces.reset()
	s.lease.Store(&leaseBox{l})
	err := e.recoverLocked(ctx, s)
	if err != nil {
		s.lease.Store(nil)
		s.nonces.reset()
	}
	s.mu.Unlock()
	if err != nil {
		e.dropFlights(s)
	}
	return err
}

// dropKey stops the sender using l at once: it takes no new settlement, signs nothing, and its
// flights leave this process (the key's next holder resumes them from the ledger; their waiters
// read the ledger). It returns how many flights were dropped.
func (e *Engine) dropKey(s *sender, l facilitator.SignerLease) int {
	s.mu.Lock() // waits for a commit in progress: it either landed (and is in the ledger) or failed
	if b := s.lease.Load(); b != nil && b.l == l {
		s.lease.Store(nil)
	}
	s.nonces.reset()
	s.mu.Unlock()
	return e.dropFlights(s)
}

// dropFlights forgets the sender's flights and wakes their waiters.
func (e *Engine) dropFlights(s *sender) int {
	e.mu.Lock()
	var dropped []*flight
	for id, f := range e.flights {
		if f.sender == s {
			delete(e.flights, id)
			dropped = append(dropped, f)
		}
	}
	e.mu.Unlock()
	for _, f := range dropped {
		f.update(func(f *flight) { f.dropped, f.counted = true, false })
		s.net.takeBump(f)
	}
	s.inFlight.Store(0)
	return len(dropped)
}

// keeper is one sender's lease loop: the lease this process holds for the key, nil while it
// holds none. leaseLoop runs it on a ticker; a stepped engine runs it at the start of each step
// (keeper.step), so that a simulated take-over happens on the simulator's goroutine, in order.
type keeper struct {
	e *Engine
	s *sender
	l facilitator.SignerLease
}

// retry tries to take the key when another process holds it: at once, or, when this process
// settles nothing on the network, queued for a while, so that a holder of several hands one over.
// A retiring key is only ever taken at once: it settles nothing new here either, and its holder
// (the one that drains it) keeps it.
func (k *keeper) retry(ctx context.Context) {
	n := k.s.net
	k.l = k.e.lease(ctx, k.s, 0)
	if k.l == nil && n.usable() == 0 && n.waitTurn(k.s) {
		k.l = k.e.lease(ctx, k.s, leaseWait)
		n.waitDone()
	}
}

// lost drops the key the moment its lease is lost.
func (k *keeper) lost() {
	dropped := k.e.dropKey(k.s, k.l)
	k.l.Release()
	k.l = nil
	k.e.log.Warn("signer lease lost: the key is no longer used by this process", "network", k.s.net.net.ID, "signer", k.s.addr,
		"flights_dropped", dropped)
}

// tick hands the key over to a process queued for it, when this process keeps another.
func (k *keeper) tick() {
	if k.l.Wanted() && k.s.net.handOver(k.s, k.l) {
		k.l.Release()
		// The lock goes straight to the queued process: Postgres grants it to the
		// waiter as the session ends, before this process could ask again.
		k.l = nil
	}
}

// end gives the key back (the engine stops).
func (k *keeper) end() {
	if k.l != nil {
		k.e.dropKey(k.s, k.l)
		k.l.Release()
		k.l = nil
	}
}

// step is one round of the loop, in line: a lost lease is dropped, a free key retried, a wanted
// one handed over.
func (k *keeper) step(ctx context.Context) {
	if k.l == nil {
		k.retry(ctx)
		return
	}
	select {
	case <-k.l.Lost():
		k.lost()
	default:
		k.tick()
	}
}

// leaseLoop keeps the sender's key leased when it can be: it retries every LeaseRetry while
// another process holds it, runs the key's recovery when it gets it, drops the key the moment
// the lease is lost, and hands a key over to a replica that holds none of the network's.
func (e *Engine) leaseLoop(ctx context.Context, k *keeper) {
	t := time.NewTicker(e.cfg.LeaseRetry)
	defer t.Stop()
	for {
		if k.l == nil {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			k.retry(ctx)
			continue
		}
		select {
		case <-ctx.Done():
			k.end()
			return
		case <-k.l.Lost():
			k.lost()
		case <-t.C:
			k.tick()
		}
	}
}

// lease tries to take the sender's key and recover it; nil when it is not this process's.
func (e *Engine) lease(ctx context.Context, s *sender, wait time.Duration) facilitator.SignerLease {
	began := e.now()
	l, err := e.cfg.Leaser.LeaseSigner(ctx, s.net.net.ID, s.addr, wait)
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("taking a signer lease", "network", s.net.net.ID, "signer", s.addr, "err", err)
		}
		return nil
	}
	if l == nil {
		return nil
	}
	if err := e.takeKey(ctx, s, l); err != nil {
		l.Release()
		if ctx.Err() == nil {
			e.log.Warn("recovering a leased signer; gave the lease back", "network", s.net.net.ID, "signer", s.addr, "err", err)
		}
		return nil
	}
	e.log.Info("signer lease taken", "network", s.net.net.ID, "signer", s.addr, "next_nonce", s.nextNonce(),
		"took", e.now().Sub(began).Round(time.Millisecond))
	return l
}

// usable counts the network's keys this process holds that take new settlements (not retiring).
func (n *chainEngine) usable() int {
	c := 0
	for _, s := range n.senders {
		if s.held() != nil && !s.retiring {
			c++
		}
	}
	return c
}

// allRetiring reports whether every key of the network is retiring: no process may take a new
// settlement on it.
func (n *chainEngine) allRetiring() bool {
	for _, s := range n.senders {
		if !s.retiring {
			return false
		}
	}
	return true
}

// handOver gives s's key up to a process queued for it, if this process keeps another key of the
// network that takes new settlements: every replica then settles with at least one key when there
// are enough. A retiring key costs nothing to give up while this process keeps one.
func (n *chainEngine) handOver(s *sender, l facilitator.SignerLease) bool {
	n.leaseMu.Lock()
	defer n.leaseMu.Unlock()
	keep := n.usable()
	if !s.retiring {
		keep--
	}
	if keep < 1 {
		return false
	}
	dropped := n.engine.dropKey(s, l)
	n.engine.log.Info("signer lease handed over to a replica that holds no key of the network", "network", n.net.ID,
		"signer", s.addr, "flights_dropped", dropped)
	return true
}

// waitTurn lets one sender of the network at a time queue for its key, in turn; the turns go
// round the keys that are not retiring (a key that settles nothing new is no use to queue for).
func (n *chainEngine) waitTurn(s *sender) bool {
	n.leaseMu.Lock()
	defer n.leaseMu.Unlock()
	var turns []*sender
	for _, t := range n.senders {
		if !t.retiring {
			turns = append(turns, t)
		}
	}
	if n.waiting || len(turns) == 0 || turns[n.turn%len(turns)] != s {
		return false
	}
	n.waiting = true
	return true
}

func (n *chainEngine) waitDone() {
	n.leaseMu.Lock()
	n.waiting = false
	n.turn++
	n.leaseMu.Unlock()
}

// HeldSigners lists, by network, the signer keys this process holds now (every key without a
// Leaser).
func (e *Engine) HeldSigners() map[string][]common.Address {
	out := map[string][]common.Address{}
	for id, n := range e.networks {
		for _, s := range n.senders {
			if s.held() != nil {
				out[id] = append(out[id], s.addr)
			}
		}
	}
	return out
}
