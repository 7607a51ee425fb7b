package settle

import (
	"context"
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// sender owns one signer key on one network: it is the only allocator of that key's nonces
// (ARCHITECTURE.md invariant 7). Here its submissions queue for the key and wait for their batch
// to close; commit.go signs and commits them, and hands them to the broadcaster (broadcast.go)
// in nonce order.
type sender struct {
	net    *chainEngine
	addr   common.Address
	signer Signer

	// mu makes "take the next nonce, sign, commit the row" one step, so a nonce is used only by a
	// committed row and given back (not incremented) when the commit fails.
	mu     sync.Mutex
	nonces // under mu (nonce.go)

	// pending are the submissions waiting for mu; whoever takes mu commits them all at once.
	pmu     sync.Mutex
	pending []*submission
	// moved is closed (and replaced) under pmu when a batch fills or one is committed: the
	// submissions waiting for their batch to close look again (submitBatched).
	moved chan struct{}

	inFlight atomic.Int64 // flights not yet mined or failed
	// balance is the native balance at the last read (nil before); low: it is below the minimum,
	// so the key takes no new settlement (balance.go).
	balance atomic.Pointer[big.Int]
	low     atomic.Bool
	// balanceAt is when balance was read, in Unix nanoseconds of the engine's clock (0 before).
	balanceAt atomic.Int64

	// lease is this process's hold on the key; nil while another process holds it. Set and
	// cleared under mu, so a commit never straddles a change of holder.
	lease atomic.Pointer[leaseBox]

	// retiring: the key takes no new settlement (pickSender skips it) and works what it has open
	// to the end (NetworkConfig.Retiring). Set in New, never changed.
	retiring bool
}

func newSender(n *chainEngine, signer Signer) *sender {
	return &sender{net: n, addr: signer.Address(), signer: signer}
}

// submission is one settlement waiting for its turn at the key's next nonce.
type submission struct {
	row  *facilitator.NewSettlement
	to   common.Address
	data []byte
	gas  uint64
	// estimate is the lone transaction's gas estimate, before the margin gas has: a batch's limit
	// is computed from its members' (multicall3.NeededGas).
	estimate uint64
	fees     Fees

	// at is when the submission arrived (the engine's clock): a batch closes once its first has
	// waited the batch policy's Wait.
	at time.Time

	done bool // set under the sender's mu
	f    *flight
	err  error
}

// submit signs the settlement's transaction with the next nonce, commits it to the ledger, and
// hands it to the broadcaster (commitGroupLocked, or commitBatchLocked on a batching network:
// commit.go); it returns once that is done, with the flight its caller waits on. Nothing leaves
// the process before the commit.
//
// Settlements arriving while the key's previous commit is running are committed together (a group
// commit): whoever takes the key's lock next signs every waiting settlement with consecutive
// nonces and writes them in one transaction, so the key's rate is not one ledger round trip per
// settlement. Each still leaves only after its row is committed.
//
// A contract wallet's settlement (alone) is never batched, whatever the network's policy: the
// token runs the wallet's code to check the signature, and code that behaves in verify and burns
// the gas inside a batch would sink the batch's other payments (they would be settled again
// alone, a round later, at our cost: resettle.go).
func (s *sender) submit(ctx context.Context, row *facilitator.NewSettlement, to common.Address, data []byte, gas uint64, alone bool) (*flight, error) {
	fees, err := s.net.fees(ctx)
	if err != nil {
		return nil, err
	}
	sub := &submission{row: row, to: to, data: data, gas: eip3009.GasLimit(gas), estimate: gas, fees: fees}
	if p := s.net.net.Batch; p.On() {
		if !alone {
			return s.submitBatched(ctx, sub, p)
		}
		// Its own commit: the pending batch is its members' to close.
		s.mu.Lock()
		defer s.mu.Unlock()
		s.commitGroupLocked(context.WithoutCancel(ctx), []*submission{sub})
		return sub.f, sub.err
	}
	s.pmu.Lock()
	s.pending = append(s.pending, sub)
	s.pmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sub.done {
		s.pmu.Lock()
		batch := s.pending
		s.pending = nil
		s.pmu.Unlock()
		s.commitGroupLocked(context.WithoutCancel(ctx), batch)
	}
	return sub.f, sub.err
}

// submitBatched is submit on a network with a batch policy: the submission waits for its batch
// to close (p.CloseBatch: full, or its first has waited p.Wait), and whoever finds it closed
// signs it as one Multicall3 transaction at one nonce and commits every member's row with it, in
// one transaction, before anything is broadcast (commitBatchLocked). Until it closes, the
// submission waits (run.waitBatch).
func (s *sender) submitBatched(ctx context.Context, sub *submission, p facilitator.BatchPolicy) (*flight, error) {
	e := s.net.engine
	sub.at = e.now()
	s.pmu.Lock()
	s.pending = append(s.pending, sub)
	if len(s.pending) >= p.Max {
		s.movedLocked()
	}
	s.pmu.Unlock()
	for {
		s.mu.Lock()
		if sub.done {
			s.mu.Unlock()
			return sub.f, sub.err
		}
		// Not done under mu: sub is still pending (a batch leaves pending and is answered under mu).
		s.pmu.Lock()
		batch, wait := s.takeClosedLocked(p)
		moved := s.movedCh()
		s.pmu.Unlock()
		if batch != nil {
			s.closeBatchLocked(ctx, batch)
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		e.run.waitBatch(wait, moved)
	}
}

// takeClosedLocked takes the pending batch off the key if the closing rule closes it now (by the
// engine's clock); otherwise wait is how long until it does. Caller holds mu and pmu.
func (s *sender) takeClosedLocked(p facilitator.BatchPolicy) (batch []*submission, wait time.Duration) {
	if len(s.pending) == 0 {
		return nil, p.Wait
	}
	closed, wait := p.CloseBatch(len(s.pending), s.pending[0].at, s.net.engine.now())
	if !closed {
		return nil, wait
	}
	k := min(len(s.pending), p.Max)
	batch, s.pending = s.pending[:k:k], append([]*submission(nil), s.pending[k:]...)
	return batch, 0
}

// closeBatchLocked commits a closed batch and wakes the submissions waiting for theirs. Caller
// holds mu.
func (s *sender) closeBatchLocked(ctx context.Context, batch []*submission) {
	s.commitBatchLocked(context.WithoutCancel(ctx), batch)
	s.pmu.Lock()
	s.movedLocked()
	s.pmu.Unlock()
}

// closeDue commits the key's pending batch if the closing rule closes it now: the stepped
// engine's stand-in for the timers of the submissions waiting for it.
func (s *sender) closeDue(ctx context.Context) {
	p := s.net.net.Batch
	if !p.On() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pmu.Lock()
	batch, _ := s.takeClosedLocked(p)
	s.pmu.Unlock()
	if batch != nil {
		s.closeBatchLocked(ctx, batch)
	}
}

// movedCh is the channel closed at the next change of the pending batch. Caller holds pmu.
func (s *sender) movedCh() chan struct{} {
	if s.moved == nil {
		s.moved = make(chan struct{})
	}
	return s.moved
}

// movedLocked wakes the submissions waiting for their batch. Caller holds pmu.
func (s *sender) movedLocked() {
	if s.moved != nil {
		close(s.moved)
		s.moved = nil
	}
}
