package settle

import (
	"context"
	"errors"
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// sender owns one signer key on one network: it is the only allocator of that key's nonces
// (ARCHITECTURE.md invariant 7), and it broadcasts that key's transactions in nonce order, in batches.
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
// hands it to the broadcaster. Nothing leaves the process before the commit.
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
		s.commitLocked(context.WithoutCancel(ctx), []*submission{sub}, false)
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
		s.commitLocked(context.WithoutCancel(ctx), batch, false)
	}
	return sub.f, sub.err
}

// submitBatched is submit on a network with a batch policy: the submission waits for its batch
// to close (p.CloseBatch: full, or its first has waited p.Wait), and whoever finds it closed
// signs it as one Multicall3 transaction at one nonce and commits every member's row with it, in
// one transaction, before anything is broadcast (commitLocked).
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
			s.commitBatchLocked(ctx, batch)
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		if e.stepped {
			// The simulator's clock does not move while a submission waits: its batch closes when
			// it fills, or in a step once the clock has moved past its wait (closeDue).
			<-moved
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-moved:
		}
		t.Stop()
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

// commitBatchLocked commits a closed batch and wakes the submissions waiting for theirs. Caller
// holds mu.
func (s *sender) commitBatchLocked(ctx context.Context, batch []*submission) {
	s.commitLocked(context.WithoutCancel(ctx), batch, true)
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
		s.commitBatchLocked(ctx, batch)
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

// template is the transaction a submission's row records: its own, or its batch's.
type template struct {
	to   common.Address
	data []byte
	gas  uint64
	fees Fees
	raw  []byte
}

// commitLocked signs and commits subs, in order, with the key's next nonces, and hands what was
// committed to the broadcaster; it sets every submission's outcome. Caller holds mu. ctx carries no
// cancellation: the submissions are several callers'.
func (s *sender) commitLocked(ctx context.Context, subs []*submission, batched bool) {
	e := s.net.engine
	finish := func(err error) {
		for _, sub := range subs {
			if !sub.done {
				sub.done, sub.err = true, err
			}
		}
	}
	for attempt := 0; ; attempt++ {
		l := s.held()
		if l == nil {
			finish(errNotLeased)
			return
		}
		if !s.nonces.loaded {
			lctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
			err := s.load(lctx)
			cancel()
			if err != nil {
				finish(err)
				return
			}
		}
		var (
			rows   []*facilitator.NewSettlement
			signed []*submission
			raws   []template
		)
		if open := undone(subs); batched && len(open) > 1 {
			rows, signed, raws = s.signBatch(ctx, open)
		}
		for i, sub := range subs {
			if sub.done || batched && len(undone(subs)) > 1 {
				continue
			}
			nonce := s.next + uint64(len(rows))
			st, err := s.sign(ctx, nonce, sub.to, sub.data, sub.gas, sub.fees)
			if err != nil {
				// No row for it (no row, no broadcast), and its nonce goes to the next one. A
				// signer that failed one is down or refusing: the rest of the group would only
				// wait out the same timeout each, so they are answered alike.
				e.log.Warn("signing failed; nothing was sent", "network", s.net.net.ID, "signer", s.addr, "err", errors.Unwrap(err))
				for _, rest := range subs[i:] {
					if !rest.done {
						rest.done, rest.err = true, err
					}
				}
				break
			}
			tx, raw := st.tx, st.raw
			sub.row.Signer, sub.row.TxNonce, sub.row.BatchSlot = s.addr, nonce, 0
			sub.row.Tx = facilitator.TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: sub.fees.TipCap, FeeCap: sub.fees.FeeCap, Gas: sub.gas}
			sub.row.GasReserved = new(big.Int).Mul(new(big.Int).SetUint64(sub.gas), sub.fees.FeeCap)
			rows, signed = append(rows, sub.row), append(signed, sub)
			raws = append(raws, template{to: sub.to, data: sub.data, gas: sub.gas, fees: sub.fees, raw: raw})
		}
		if len(rows) == 0 {
			return
		}
		e.fault(FaultBeforeCommit)
		// The commit goes through the key's lease: it fails if this process no longer holds the key.
		wctx, cancel := context.WithTimeout(ctx, leaseWriteTimeout)
		var ids []int64
		var err error
		if len(rows) == 1 {
			var id int64
			id, err = l.InsertSettlement(wctx, rows[0])
			ids = []int64{id}
		} else {
			ids, err = l.InsertSettlements(wctx, rows)
		}
		cancel()
		if errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3 {
			// Our view of the key is stale (a commit whose answer was lost, another process on the
			// key): re-derive it and take the next free nonces.
			e.cfg.Observer.NonceGap(s.net.net.ID, s.addr.Hex(), NonceTaken)
			s.nonces.reset()
			continue
		}
		if len(rows) > 1 && (errors.Is(err, facilitator.ErrDuplicate) || errors.Is(err, facilitator.ErrPaymentIDTaken) ||
			errors.Is(err, facilitator.ErrGroupRefused)) {
			// One of the group collides with a row committed meanwhile (a concurrent request for the
			// same authorization or payment id), or a limit refused one: nothing of the group was
			// written. Commit them one by one, so that only that one fails, and the others take
			// consecutive nonces (a refused row takes none).
			for _, sub := range signed {
				s.commitLocked(ctx, []*submission{sub}, false) // a batch falls back to lone settlements
			}
			return
		}
		if facilitator.ErrorCode(err) == facilitator.ELimited {
			// A limit refused the row (a group's rows are refused only one by one, above): nothing
			// was written, and the nonce is not taken (s.next stays), so the signed transaction is
			// simply dropped.
			finish(err)
			return
		}
		if err != nil && !errors.Is(err, facilitator.ErrDuplicate) && !errors.Is(err, facilitator.ErrNonceTaken) && !errors.Is(err, facilitator.ErrPaymentIDTaken) {
			// A write that timed out or lost its connection may have committed all the same: then
			// the transactions are the ledger's and must go out (an answer "nothing was sent" would
			// be false: a client that believed it would sign again and pay twice, and the nonces
			// would be a gap holding back the key's later transactions).
			switch committed, known := s.commitOutcome(ctx, rows); {
			case known && committed != nil:
				e.log.Warn("a settlement write reported an error but had committed; sending", "network", s.net.net.ID, "signer", s.addr, "count", len(rows))
				ids, err = committed, nil
			case known:
				s.nonces.reset() // re-derive the key's next nonce from the ledger next time
				err = ledgerDown(err)
			default:
				// Not known either way: the callers are answered pending with the hash they may
				// land under, and the outcome is settled in the background.
				s.nonces.reset()
				e.log.Warn("a settlement write's outcome is unknown; answering pending and finding out", "network", s.net.net.ID,
					"signer", s.addr, "count", len(rows), "err", err)
				flights := make([]*flight, len(signed))
				for i, sub := range signed {
					flights[i] = s.newFlight(0, sub, raws[i])
					sub.done, sub.f = true, flights[i]
				}
				if len(rows) > 1 && rows[1].BatchSlot > 0 {
					linkFamily(flights)
				}
				s.resolveUnknown(rows, flights)
				return
			}
		}
		if err != nil {
			finish(err)
			return
		}
		s.nonces.take(noncesHeld(rows))
		e.fault(FaultAfterCommit)

		flights := make([]*flight, len(signed))
		for i, sub := range signed {
			flights[i] = s.newFlight(ids[i], sub, raws[i])
		}
		if len(rows) > 1 && rows[1].BatchSlot > 0 {
			linkFamily(flights)
		}
		for i, sub := range signed {
			f := flights[i]
			f.count(true)
			e.track(f)
			s.enqueue(f)
			sub.done, sub.f = true, f
		}
		return
	}
}

// newFlight is the flight of a submission whose row was committed (or may have been) as id.
func (s *sender) newFlight(id int64, sub *submission, tx template) *flight {
	row := sub.row
	f := newFlight(id, facilitator.StateSigned)
	f.key, f.fingerprint, f.payTo, f.value, f.validBefore = row.Key, row.Fingerprint, row.PayTo, row.Value, row.ValidBefore
	f.sender, f.nonce, f.gas, f.data, f.to = s, row.TxNonce, tx.gas, tx.data, tx.to
	f.estimate = sub.estimate
	f.batched = tx.to == multicall3.Address
	if row.PaymentID != nil {
		f.paymentID = row.PaymentID.ID
	}
	f.txs = []*sentTx{{hash: row.Tx.Hash, nonce: row.TxNonce, raw: tx.raw, fees: tx.fees, signedAt: s.net.engine.now()}}
	return f
}

// noncesHeld is how many of the key's nonces committed rows hold: one per lone settlement, one
// for a whole batch (its members share its nonce). Rows hold consecutive nonces, in order.
func noncesHeld(rows []*facilitator.NewSettlement) int {
	return int(rows[len(rows)-1].TxNonce-rows[0].TxNonce) + 1
}

func undone(subs []*submission) []*submission {
	var out []*submission
	for _, sub := range subs {
		if !sub.done {
			out = append(out, sub)
		}
	}
	return out
}

// signBatch signs subs as one Multicall3 aggregate3 transaction at the key's next nonce, every
// call allowed to fail on its own, and makes their rows its members, slots 0..n-1. Its gas is
// what the members need by their own estimates, with Multicall3's measured cost per call
// (multicall3.NeededGas), plus the usual margin; its fees are the latest submission's. A signing that fails answers every member: nothing is committed or sent.
// Caller holds mu, with the nonces loaded.
func (s *sender) signBatch(ctx context.Context, subs []*submission) ([]*facilitator.NewSettlement, []*submission, []template) {
	calls := make([]multicall3.Call, len(subs))
	estimates := make([]uint64, len(subs))
	for i, sub := range subs {
		calls[i] = multicall3.Call{Target: sub.to, AllowFailure: true, CallData: sub.data}
		estimates[i] = sub.estimate
	}
	gas := eip3009.GasLimit(multicall3.NeededGas(estimates))
	share := (gas + uint64(len(subs)) - 1) / uint64(len(subs))
	data := multicall3.Aggregate3Calldata(calls)
	fees := subs[len(subs)-1].fees
	nonce := s.next
	st, err := s.sign(ctx, nonce, multicall3.Address, data, gas, fees)
	if err != nil {
		s.net.engine.log.Warn("signing a batch failed; nothing was sent", "network", s.net.net.ID, "signer", s.addr, "count", len(subs), "err", errors.Unwrap(err))
		for _, sub := range subs {
			sub.done, sub.err = true, err
		}
		return nil, nil, nil
	}
	tx := template{to: multicall3.Address, data: data, gas: gas, fees: fees, raw: st.raw}
	rows := make([]*facilitator.NewSettlement, len(subs))
	txs := make([]template, len(subs))
	for i, sub := range subs {
		sub.row.Signer, sub.row.TxNonce, sub.row.BatchSlot = s.addr, nonce, i
		sub.row.Tx = facilitator.TxRecord{Hash: st.tx.Hash(), Raw: st.raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: gas}
		// Each member reserves its share of the batch's gas against its key's budget.
		sub.row.GasReserved = new(big.Int).Mul(new(big.Int).SetUint64(share), fees.FeeCap)
		rows[i], txs[i] = sub.row, tx
	}
	return rows, subs, txs
}

// unknownCommit is a write whose outcome is unknown: its rows and the flights their callers wait on.
type unknownCommit struct {
	s       *sender
	rows    []*facilitator.NewSettlement
	flights []*flight
	next    time.Time // when to ask the ledger again
	wait    time.Duration
}

// resolveUnknown hands a write whose outcome is unknown to the watcher, which reads the ledger
// each round (backing off) until it tells whether the rows were committed: if they were, their
// flights are tracked and sent like any others; if not, they are dropped (nothing was sent, and a
// retry of the same payload settles it afresh). Until then the callers wait on the flights and
// are answered pending with the hash.
func (s *sender) resolveUnknown(rows []*facilitator.NewSettlement, flights []*flight) {
	n := s.net
	n.unknownMu.Lock()
	n.unknown = append(n.unknown, &unknownCommit{s: s, rows: rows, flights: flights, wait: n.engine.cfg.RetryInterval})
	n.unknownMu.Unlock()
	n.wake()
}

// checkUnknown asks the ledger about each write whose outcome is unknown and is due.
func (n *chainEngine) checkUnknown(ctx context.Context) {
	e := n.engine
	n.unknownMu.Lock()
	pending := n.unknown
	n.unknown = nil
	n.unknownMu.Unlock()
	var still []*unknownCommit
	for _, u := range pending {
		now := e.now()
		if now.Before(u.next) {
			still = append(still, u)
			continue
		}
		ids, known := u.s.commitOutcome(ctx, u.rows)
		switch {
		case !known:
			u.next, u.wait = now.Add(u.wait), min(2*u.wait, 10*time.Second)
			still = append(still, u)
		case ids == nil:
			e.log.Info("the unknown settlement write did not commit; nothing was sent", "network", n.net.ID, "signer", u.s.addr, "count", len(u.rows))
			for _, f := range u.flights {
				f.update(func(f *flight) { f.dropped = true })
			}
		default:
			e.log.Warn("the unknown settlement write had committed; sending", "network", n.net.ID, "signer", u.s.addr, "count", len(u.rows))
			for i, f := range u.flights {
				id := ids[i]
				f.update(func(f *flight) { f.id = id })
				f.count(true)
				e.track(f)
				u.s.enqueue(f)
			}
		}
	}
	n.unknownMu.Lock()
	n.unknown = append(still, n.unknown...)
	n.unknownMu.Unlock()
}

// commitOutcome tells whether rows, written in one transaction whose outcome is unknown, are in
// the ledger: their ids if so, nil if not; known is false when the ledger could not be read.
func (s *sender) commitOutcome(ctx context.Context, rows []*facilitator.NewSettlement) (ids []int64, known bool) {
	e := s.net.engine
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
	defer cancel()
	ids = make([]int64, len(rows))
	for i, row := range rows {
		got, err := e.store.SettlementByKey(ctx, row.Key)
		switch {
		case errors.Is(err, facilitator.ErrNotFound):
			return nil, true // all or none: the transaction did not commit
		case err != nil:
			return nil, false
		case got.Signer != row.Signer || got.TxNonce != row.TxNonce || got.TxHash != row.Tx.Hash:
			return nil, true // another request's row for the authorization; ours did not commit
		}
		ids[i] = got.ID
	}
	return ids, true
}

// enqueue hands f to the network's broadcaster: the one hand-off between a committed row and the
// chain, picked up by broadcastLoop (drainQueue in the stepped engine), which sends it with every
// other queued transaction in one batch (send). The queue is sized to the in-flight limits, so
// this only blocks when recovery hands over more than a queue's worth at once. One queue for all
// of the network's keys keeps each key's transactions in nonce order (a key enqueues under its mu).
func (s *sender) enqueue(f *flight) {
	select {
	case s.net.queue <- f:
	default:
		go func() { s.net.queue <- f }()
	}
}

// drainQueue sends what is queued now, in batches (the stepped engine's broadcastLoop).
func (n *chainEngine) drainQueue(ctx context.Context) {
	for {
		var batch []*flight
	drain:
		for len(batch) < 200 {
			select {
			case f := <-n.queue:
				batch = append(batch, f)
			default:
				break drain
			}
		}
		if len(batch) == 0 {
			return
		}
		n.send(ctx, batch)
		n.beat(LoopBroadcast)
	}
}

// broadcastLoop sends queued transactions in JSON-RPC batches, every key's together: a burst of
// settlements reaches the node in one request instead of one per key or per transaction, and a
// node that mines on arrival (anvil) packs them in fewer, fuller blocks.
func (n *chainEngine) broadcastLoop(ctx context.Context) {
	const maxBatch = 200
	// The loop waits for work, so it beats on a tick too: an idle broadcaster is alive, a stuck
	// send is not.
	tick := time.NewTicker(n.engine.cfg.PollInterval)
	defer tick.Stop()
	for {
		var batch []*flight
		select {
		case f := <-n.queue:
			batch = append(batch, f)
		case <-tick.C:
			n.beat(LoopBroadcast)
			continue
		case <-ctx.Done():
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case f := <-n.queue:
				batch = append(batch, f)
			default:
				break drain
			}
		}
		n.send(ctx, batch)
	}
}

// send broadcasts the latest variant of each flight and records which the node took. Flights
// whose key this process no longer holds are left to the key's holder.
func (n *chainEngine) send(ctx context.Context, flights []*flight) {
	e := n.engine
	elems := make([]rpc.BatchElem, 0, len(flights))
	txs := make([]*sentTx, 0, len(flights))
	var sendable []*flight
	// A batch's members share their transaction: it goes out once, and its answer is each one's.
	var elemOf []int
	sent := map[common.Hash]int{}
	for _, f := range flights {
		if f.sender.held() == nil {
			continue // the key's holder sends it
		}
		t := f.latest()
		if v := f.view(); t == nil || (!v.state.Open() && !v.closing) || v.dropped {
			continue
		}
		sendable = append(sendable, f)
		txs = append(txs, t)
		i, ok := sent[t.hash]
		if !ok {
			i = len(elems)
			sent[t.hash] = i
			elems = append(elems, ethrpc.SendRawTransaction(t.raw, new(common.Hash)))
		}
		elemOf = append(elemOf, i)
	}
	if len(elems) == 0 {
		return
	}
	now := e.now()
	cctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	err := n.chain.BatchCallContext(cctx, elems)
	cancel()
	if err != nil {
		// The node may or may not have them: the watcher resends after RetryInterval.
		e.log.Warn("broadcast failed; will resend", "network", n.net.ID, "txs", len(elems), "err", err)
		for i, f := range sendable {
			f.mu.Lock()
			txs[i].tried = now
			f.mu.Unlock()
		}
		return
	}
	var accepted []int64
	for i, f := range sendable {
		elemErr := elems[elemOf[i]].Error
		res := classifySend(elemErr)
		f.mu.Lock()
		txs[i].tried = now
		if res == sentOK {
			txs[i].sentAt = now
		}
		f.mu.Unlock()
		switch res {
		case sentOK:
			accepted = append(accepted, f.id)
		case sendUnderpriced:
			n.wantBump(f)
		case sendNonceUsed:
			// Possibly our own earlier variant, mined: the watcher checks receipts and the authorization,
			// and whether a transaction that is not ours took the nonce (foreign.go).
			f.mu.Lock()
			f.nonceLow = true
			nonce := f.nonce
			f.mu.Unlock()
			e.log.Info("node says nonce used; watching receipts", f.logAttrs("tx_nonce", nonce, "signer", f.sender.addr, "tx", txs[i].hash)...)
			e.cfg.Observer.NonceGap(n.net.ID, f.sender.addr.Hex(), NonceUsed)
		case sendNoFunds:
			e.log.Error("signer cannot pay for gas: fund it", f.logAttrs("network", n.net.ID, "signer", f.sender.addr, "tx", txs[i].hash, "err", elemErr)...)
		default:
			e.log.Warn("node refused transaction; will resend", f.logAttrs("tx", txs[i].hash, "err", elemErr)...)
		}
	}
	if len(accepted) == 0 {
		return
	}
	// A node that mines on arrival has the receipts already: look now rather than at the next tick.
	n.wake()
	e.fault(FaultAfterBroadcast)
	// Recording the broadcast is only bookkeeping (recovery treats signed and broadcast alike, and
	// Resolve records the step if it is still missing): it is written off the broadcaster's path,
	// so the next batch does not wait for a ledger round trip.
	n.markBroadcast(ctx, accepted)
	for _, f := range sendable {
		f.update(func(f *flight) {
			if f.state == facilitator.StateSigned && f.txs[len(f.txs)-1].sentAt.Equal(now) {
				f.state = facilitator.StateBroadcast
			}
		})
	}
}

func ledgerDown(err error) error {
	return facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "the settlement ledger is unavailable; nothing was sent, retry", err)
}
