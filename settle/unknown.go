package settle

import (
	"context"
	"errors"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A settlement write whose outcome is unknown (it timed out or lost its connection, and the
// ledger could not be read to tell): its callers are answered pending with the hash, and the
// watcher asks the ledger each round until it knows whether the rows committed (invariant 2: a
// write whose outcome is unknown is never answered "nothing was sent").

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
