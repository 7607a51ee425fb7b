package settlesim

import (
	"maps"
	"slices"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// LedgerSnapshot is the ledger as it stood at one moment: what a backup taken then, or an
// asynchronous standby that far behind, holds.
type LedgerSnapshot struct {
	rows     map[int64]*ledgerRow
	eventSeq int64
}

// Snapshot copies the ledger as it stands.
func (l *Ledger) Snapshot() *LedgerSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &LedgerSnapshot{rows: copyRows(l.rows), eventSeq: l.eventSeq}
}

// Restore puts the ledger back to s, losing every commit made since (a failover to a standby
// behind, a restore from a backup). The id sequence does not go back (a promoted standby's
// sequences run ahead of what it has; a restore's are set past the ids the chain may name), so
// no id names two settlements.
func (l *Ledger) Restore(s *LedgerSnapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rows, l.eventSeq = copyRows(s.rows), max(l.eventSeq, s.eventSeq)
	l.byKey = map[facilitator.AuthorizationKey]*ledgerRow{}
	l.byNonce = map[nonceKey]*ledgerRow{}
	l.byTx = map[common.Hash]*ledgerRow{}
	l.pids = map[pidKey]*ledgerRow{}
	for _, r := range l.rows {
		l.byKey[r.s.Key] = r
		l.byNonce[nonceKey{r.s.Key.Network, r.s.Signer, r.s.TxNonce, r.s.BatchSlot}] = r
		for _, t := range r.txs {
			l.byTx[t.Hash] = r
		}
		if r.paymentID != nil {
			l.pids[pidKey{r.paymentID.Scope, r.paymentID.ID}] = r
		}
	}
}

// copyRows deep-copies rows, their batch families pointing into the copy.
func copyRows(rows map[int64]*ledgerRow) map[int64]*ledgerRow {
	out := make(map[int64]*ledgerRow, len(rows))
	for id, r := range rows {
		c := *r
		c.s.Value, c.s.ValidBefore = cloneBig(r.s.Value), cloneBig(r.s.ValidBefore)
		c.validAfter, c.gasReserved = cloneBig(r.validAfter), cloneBig(r.gasReserved)
		c.request, c.claim = slices.Clone(r.request), slices.Clone(r.claim)
		c.events = slices.Clone(r.events)
		c.txs = make([]LedgerTx, len(r.txs))
		for i, t := range r.txs {
			c.txs[i] = LedgerTx{TxRecord: cloneTx(t.TxRecord), CreatedAt: t.CreatedAt}
		}
		if r.paymentID != nil {
			p := *r.paymentID
			p.Summary = maps.Clone(p.Summary)
			c.paymentID = &p
		}
		out[id] = &c
	}
	for _, c := range out {
		if c.family != nil {
			c.family = out[c.family.s.ID]
		}
	}
	return out
}
