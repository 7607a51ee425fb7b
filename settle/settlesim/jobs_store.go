package settlesim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The ledger's side of what the reconcile jobs and the status answers read and write, with the
// Postgres ledger's semantics (held to them by the contract suite, settle/ledgertest), so that the
// simulator drives the real jobs and the real status service against it.

type noFaultsKey struct{}

// WithoutFaults is a context whose ledger calls draw no fault: a second process's calls (the
// reconcile job's, the status answers') then leave the engine's fault draws, and so every seed's
// schedule for the engine, as they were.
func WithoutFaults(ctx context.Context) context.Context {
	return context.WithValue(ctx, noFaultsKey{}, true)
}

func faultless(ctx context.Context) bool { v, _ := ctx.Value(noFaultsKey{}).(bool); return v }

// StaleSettlements lists a network's settlements still owed an outcome (signed, broadcast, or
// mined) that nothing has updated since before, oldest first, with their transactions.
func (l *Ledger) StaleSettlements(ctx context.Context, network string, before time.Time, limit int) ([]facilitator.OpenSettlement, error) {
	var out []facilitator.OpenSettlement
	err := l.call(ctx, "stale-settlements", false, func() error {
		out = nil
		var rows []*ledgerRow
		for _, id := range l.idsLocked() {
			r := l.rows[id]
			if st := r.s.State; r.s.Key.Network == network && (st.Open() || st == facilitator.StateMined) && r.updatedAt.Before(before) {
				rows = append(rows, r)
			}
		}
		slices.SortStableFunc(rows, func(a, b *ledgerRow) int { return a.updatedAt.Compare(b.updatedAt) })
		for _, r := range rows[:min(len(rows), limit)] {
			o := facilitator.OpenSettlement{Settlement: *r.settlement()}
			for _, t := range r.familyTxs() {
				o.Txs = append(o.Txs, cloneTx(t.TxRecord))
			}
			out = append(out, o)
		}
		return nil
	})
	return out, err
}

// Touch records that settlements were looked at, so a job does not look again at once.
func (l *Ledger) Touch(ctx context.Context, ids []int64) error {
	return l.call(ctx, fmt.Sprintf("touch %v", ids), true, func() error {
		for _, id := range ids {
			if r := l.rows[id]; r != nil {
				r.updatedAt = l.now()
			}
		}
		return nil
	})
}

// BatchMembers lists the settlements sharing the transaction at a signer's tx nonce, in the
// batch's order.
func (l *Ledger) BatchMembers(ctx context.Context, network string, signer common.Address, txNonce uint64) ([]facilitator.Settlement, error) {
	var out []facilitator.Settlement
	err := l.call(ctx, fmt.Sprintf("batch-members %s %d", signer.Hex(), txNonce), false, func() error {
		out = nil
		for _, id := range l.idsLocked() {
			if r := l.rows[id]; r.s.Key.Network == network && r.s.Signer == signer && r.s.TxNonce == txNonce {
				out = append(out, *r.settlement())
			}
		}
		slices.SortStableFunc(out, func(a, b facilitator.Settlement) int { return cmp.Compare(a.BatchSlot, b.BatchSlot) })
		return nil
	})
	return out, err
}

// SettlementEvents lists a settlement's events after the id after with one of states, oldest first.
func (l *Ledger) SettlementEvents(ctx context.Context, settlementID, after int64, states []string, limit int) ([]facilitator.SettlementEvent, error) {
	var out []facilitator.SettlementEvent
	err := l.call(ctx, fmt.Sprintf("events %d", settlementID), false, func() error {
		out = nil
		r := l.rows[settlementID]
		if r == nil {
			return nil
		}
		for _, e := range r.events {
			if e.Seq > after && slices.Contains(states, e.State) && len(out) < limit {
				out = append(out, facilitator.SettlementEvent{ID: e.Seq, SettlementID: settlementID, State: facilitator.State(e.State), At: e.At})
			}
		}
		return nil
	})
	return out, err
}

// PaymentID answers for a payment-identifier id: what it is bound to (the simulated merchants
// send none; the ledger's contract binds some). No answer is stored under it.
func (l *Ledger) PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error) {
	var out *facilitator.PaymentIDRecord
	err := l.call(ctx, "payment-id "+id, false, func() error {
		r := l.pids[pidKey{scope, id}]
		if r == nil {
			return facilitator.ErrNotFound
		}
		b := r.paymentID
		out = &facilitator.PaymentIDRecord{Scope: b.Scope, ID: b.ID, Fingerprint: b.Fingerprint, Summary: cloneSummary(b.Summary),
			Settlement: r.settlement(), CreatedAt: r.s.CreatedAt}
		return nil
	})
	return out, err
}

// TryLock always succeeds: the simulated jobs run in one process, one at a time.
func (l *Ledger) TryLock(ctx context.Context, name string) (func(), bool, error) {
	return func() {}, true, nil
}

// TryLead always succeeds, as TryLock.
func (l *Ledger) TryLead(ctx context.Context, network string) (func(), bool, error) {
	return func() {}, true, nil
}

// RecordReconcileRun keeps nothing: the oracle reads the jobs' effects off the ledger.
func (l *Ledger) RecordReconcileRun(ctx context.Context, r facilitator.ReconcileRun, keep int, keepFor time.Duration) error {
	return nil
}
