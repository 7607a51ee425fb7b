package settle

import (
	"context"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The broadcaster: what the ledger committed leaves the process here, and only here (ARCHITECTURE.md
// invariant 2: commit, then hand-off, then send). commit.go's committedLocked hands each committed
// flight over (enqueue); broadcastLoop takes what is queued and sends it (send), every key's in
// one JSON-RPC batch; what a node took is marked broadcast in the ledger off the loop's path
// (markBroadcast, markLoop). The watcher resends through send too (watcher.go).

// maxSendBatch bounds the transactions of one JSON-RPC batch of sends.
const maxSendBatch = 200

// enqueue hands f, whose row the ledger committed, to its network's broadcaster: the one hand-off
// between a committed row and the chain. It is picked up by broadcastLoop (below; a stepped
// engine's step drains the queue itself: drainQueue), which sends it with every other queued
// transaction in one batch (send). The queue is sized to the in-flight limits, so this only
// blocks when recovery hands over more than a queue's worth at once. One queue for all of the
// network's keys keeps each key's transactions in nonce order (a key enqueues under its mu).
func (s *sender) enqueue(f *flight) {
	select {
	case s.net.queue <- f:
	default:
		go func() { s.net.queue <- f }()
	}
}

// broadcastLoop sends queued transactions in JSON-RPC batches, every key's together: a burst of
// settlements reaches the node in one request instead of one per key or per transaction, and a
// node that mines on arrival (anvil) packs them in fewer, fuller blocks.
func (n *chainEngine) broadcastLoop(ctx context.Context) {
	// The loop waits for work, so it beats on a tick too: an idle broadcaster is alive, a stuck
	// send is not.
	tick := time.NewTicker(n.engine.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case f := <-n.queue:
			n.send(ctx, n.takeQueued([]*flight{f}))
		case <-tick.C:
			n.beat(LoopBroadcast)
		case <-ctx.Done():
			return
		}
	}
}

// drainQueue sends what is queued now, in batches: a stepped engine's broadcastLoop.
func (n *chainEngine) drainQueue(ctx context.Context) {
	for {
		batch := n.takeQueued(nil)
		if len(batch) == 0 {
			return
		}
		n.send(ctx, batch)
		n.beat(LoopBroadcast)
	}
}

// takeQueued adds to batch what is queued now, up to maxSendBatch.
func (n *chainEngine) takeQueued(batch []*flight) []*flight {
	for len(batch) < maxSendBatch {
		select {
		case f := <-n.queue:
			batch = append(batch, f)
		default:
			return batch
		}
	}
	return batch
}

// send broadcasts the latest variant of each flight and records which the node took. Flights
// whose key this process no longer holds are left to the key's holder.
func (n *chainEngine) send(ctx context.Context, flights []*flight) {
	e := n.engine
	out := outgoingOf(flights)
	if len(out.elems) == 0 {
		return
	}
	now := e.now()
	cctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	err := n.chain.BatchCallContext(cctx, out.elems)
	cancel()
	if err != nil {
		// The node may or may not have them: the watcher resends after RetryInterval.
		e.log.Warn("broadcast failed; will resend", "network", n.net.ID, "txs", len(out.elems), "err", err)
		for i, f := range out.flights {
			f.mu.Lock()
			out.txs[i].tried = now
			f.mu.Unlock()
		}
		return
	}
	var accepted []int64
	for i, f := range out.flights {
		if n.heard(f, out.txs[i], out.elems[out.elemOf[i]].Error, now) {
			accepted = append(accepted, f.id)
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
	for _, f := range out.flights {
		f.update(func(f *flight) {
			if f.state == facilitator.StateSigned && f.txs[len(f.txs)-1].sentAt.Equal(now) {
				f.state = facilitator.StateBroadcast
			}
		})
	}
}

// outgoing is one JSON-RPC batch of sends: flights[i]'s latest variant, txs[i], goes out as
// elems[elemOf[i]]. A batch's members share their transaction: it goes out once, and its answer
// is each one's.
type outgoing struct {
	flights []*flight
	txs     []*sentTx
	elems   []rpc.BatchElem
	elemOf  []int
}

// outgoingOf is what of flights goes out: the latest variant of each one still open (or closing:
// resent until its nonce is used) and not dropped, whose key this process holds.
func outgoingOf(flights []*flight) outgoing {
	out := outgoing{elems: make([]rpc.BatchElem, 0, len(flights)), txs: make([]*sentTx, 0, len(flights))}
	sent := map[common.Hash]int{}
	for _, f := range flights {
		if f.sender.held() == nil {
			continue // the key's holder sends it
		}
		t := f.latest()
		if v := f.view(); t == nil || (!v.state.Open() && !v.closing) || v.dropped {
			continue
		}
		out.flights = append(out.flights, f)
		out.txs = append(out.txs, t)
		i, ok := sent[t.hash]
		if !ok {
			i = len(out.elems)
			sent[t.hash] = i
			out.elems = append(out.elems, ethrpc.SendRawTransaction(t.raw, new(common.Hash)))
		}
		out.elemOf = append(out.elemOf, i)
	}
	return out
}

// heard records a node's answer (elemErr) to the send of f's variant t at now, and acts on a
// refusal; it reports whether the node took it.
func (n *chainEngine) heard(f *flight, t *sentTx, elemErr error, now time.Time) bool {
	e := n.engine
	res := classifySend(elemErr)
	f.mu.Lock()
	t.tried = now
	if res == sentOK {
		t.sentAt = now
	}
	f.mu.Unlock()
	switch res {
	case sentOK:
		return true
	case sendUnderpriced:
		n.wantBump(f)
	case sendNonceUsed:
		// Possibly our own earlier variant, mined: the watcher checks receipts and the authorization,
		// and whether a transaction that is not ours took the nonce (foreign.go).
		f.mu.Lock()
		f.nonceLow = true
		nonce := f.nonce
		f.mu.Unlock()
		e.log.Info("node says nonce used; watching receipts", f.logAttrs("tx_nonce", nonce, "signer", f.sender.addr, "tx", t.hash)...)
		e.cfg.Observer.NonceGap(n.net.ID, f.sender.addr.Hex(), NonceUsed)
	case sendNoFunds:
		e.log.Error("signer cannot pay for gas: fund it", f.logAttrs("network", n.net.ID, "signer", f.sender.addr, "tx", t.hash, "err", elemErr)...)
	default:
		e.log.Warn("node refused transaction; will resend", f.logAttrs("tx", t.hash, "err", elemErr)...)
	}
	return false
}

// markBroadcast has the accepted broadcasts ids recorded: handed to markLoop (a stepped engine
// records them in line: run.go's mark).
func (n *chainEngine) markBroadcast(ctx context.Context, ids []int64) {
	n.engine.run.mark(ctx, n, ids)
}

// broadcastMarkDelay is how long an accepted broadcast waits before its mark is written. The mark
// is bookkeeping (recovery treats signed and broadcast alike), and a settlement whose outcome is
// written meanwhile has the broadcast step written with it (Resolve adds it): on a chain that
// mines within the delay, the step costs no row update of its own. It is short beside any wait a
// caller or a subscriber makes (a pending answer comes after the settle deadline, seconds): the
// step is late by at most this much, never missing.
const broadcastMarkDelay = 250 * time.Millisecond

// markLoop records accepted broadcasts: everything that arrives within broadcastMarkDelay of the
// first goes in one statement, less the settlements resolved (or being resolved) meanwhile.
func (n *chainEngine) markLoop(ctx context.Context) {
	var (
		pending []int64
		due     <-chan time.Time
	)
	for {
		select {
		case <-ctx.Done():
			// Stopping: what waits is written now (recordBroadcasts has a bound of its own).
			if ids := n.unresolved(pending); len(ids) > 0 {
				n.recordBroadcasts(ctx, ids)
			}
			return
		case ids := <-n.marks:
			if len(pending) == 0 {
				due = time.After(broadcastMarkDelay)
			}
			pending = append(pending, ids...)
		case <-due:
			if ids := n.unresolved(pending); len(ids) > 0 {
				n.recordBroadcasts(ctx, ids)
			}
			pending, due = nil, nil
		}
	}
}

// unresolved keeps the ids whose outcome is not written or being written: a resolved settlement's
// outcome write recorded its broadcast step. One this process no longer works is kept (the mark
// moves only a row still signed).
func (n *chainEngine) unresolved(ids []int64) []int64 {
	out := ids[:0]
	for _, id := range ids {
		if f := n.engine.flight(id); f != nil {
			f.mu.Lock()
			done := !f.state.Open() || f.resolving
			f.mu.Unlock()
			if done {
				continue
			}
		}
		out = append(out, id)
	}
	return out
}

func (n *chainEngine) recordBroadcasts(ctx context.Context, ids []int64) {
	e := n.engine
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RPCTimeout)
	defer cancel()
	if err := e.store.MarkBroadcast(ctx, ids); err != nil {
		// Only bookkeeping: recovery treats signed and broadcast alike.
		e.log.Warn("recording broadcasts", "network", n.net.ID, "err", err)
	}
}
