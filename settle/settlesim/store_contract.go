package settlesim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// The settle.Store methods whose contract is changing in parallel with this package, kept
// together so that they are easy to adjust. They implement the new signatures:
//
//	Resolve(ctx, rs) (moved, claimed []int64, error)   only open rows move; claims as ClaimDelivery's
//	MarkFinal(ctx, finals) ([]int64, error) the ids that moved: only rows mined in the block judged
//	Reopen(ctx, mined, detail) error        facilitator.ErrNotFound when no row is mined in that block
//	AddTx(ctx, id, tx) error                facilitator.ErrNotFound unless signed or broadcast
//	ClaimDelivery(ctx, id, keyID, claim, lease) (bool, error)   only when the row's key id is keyID;
//	                                        facilitator.ErrClaimUndecided while another's claim is leased
//
// and ClosedFrom (the failed rows whose tx nonce may be unused on chain).
var _ settle.Store = (*Ledger)(nil)

// ClosedFrom implements settle.Store: the signer's failed rows at tx nonces from on, in tx nonce
// order, each with its transactions.
func (l *Ledger) ClosedFrom(ctx context.Context, network string, signer common.Address, from uint64) ([]facilitator.OpenSettlement, error) {
	var out []facilitator.OpenSettlement
	err := l.call(ctx, fmt.Sprintf("closed-from %s %d", signer.Hex(), from), false, func() error {
		for _, id := range l.idsLocked() {
			r := l.rows[id]
			st := r.s.State
			if r.s.Key.Network != network || r.s.Signer != signer || r.s.TxNonce < from || st.Open() || st.Succeeded() {
				continue
			}
			o := facilitator.OpenSettlement{Settlement: *r.settlement()}
			for _, t := range r.txs {
				o.Txs = append(o.Txs, cloneTx(t.TxRecord))
			}
			out = append(out, o)
		}
		slices.SortStableFunc(out, func(a, b facilitator.OpenSettlement) int { return cmp.Compare(a.TxNonce, b.TxNonce) })
		return nil
	})
	return out, err
}

// Resolve moves open settlements to their outcomes, at once, and returns the ids that moved (in
// the order given; a row no longer open is left alone and not returned). Each moved row gets its
// outcome's event, preceded by a broadcast event when a receipt arrived before the broadcast was
// recorded, as the Postgres ledger writes them. A resolution's claim is recorded with it under
// ClaimDelivery's rules; claimed lists the moved ids whose claim was.
func (l *Ledger) Resolve(ctx context.Context, rs []facilitator.Resolution) ([]int64, []int64, error) {
	var moved, claimed []int64
	err := l.call(ctx, fmt.Sprintf("resolve %s", resolutions(rs)), true, func() error {
		moved, claimed = nil, nil
		seen := map[int64]bool{}
		type step struct {
			r   *ledgerRow
			was facilitator.State
		}
		var steps []step
		for _, res := range rs {
			if seen[res.ID] {
				continue // as UPDATE ... FROM unnest(...): one update per row
			}
			seen[res.ID] = true
			r := l.rows[res.ID]
			if r == nil || !r.s.State.Open() {
				continue
			}
			steps = append(steps, step{r, r.s.State})
			r.s.State, r.s.TxHash, r.s.BlockNumber, r.blockHash = res.State, res.TxHash, res.BlockNumber, res.BlockHash
			r.s.ErrorReason, r.s.ErrorMessage = res.ErrorReason, res.ErrorMessage
			r.updatedAt = l.now()
			moved = append(moved, res.ID)
			if c := res.Claim; c != nil && len(c.Token) > 0 && l.claimFree(r) && res.State.Succeeded() && res.ErrorReason == "" && r.keyID == c.KeyID {
				l.take(r, c.Token, c.Lease)
				claimed = append(claimed, res.ID)
			}
		}
		// The events go in id order, as the statement's ORDER BY id, step writes them.
		slices.SortStableFunc(steps, func(a, b step) int { return cmp.Compare(a.r.s.ID, b.r.s.ID) })
		for _, st := range steps {
			r := st.r
			if st.was == facilitator.StateSigned && (r.s.State == facilitator.StateMined || r.s.State == facilitator.StateReverted) {
				l.event(r, string(facilitator.StateBroadcast), "")
			}
			detail := "no transaction of ours landed"
			if r.s.TxHash != (common.Hash{}) && r.s.BlockNumber != 0 {
				detail = fmt.Sprintf("tx %s block %d", r.s.TxHash.Hex(), r.s.BlockNumber)
			}
			if r.s.ErrorReason != "" {
				detail += " " + r.s.ErrorReason
			}
			l.event(r, string(r.s.State), detail)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err // a lost answer says nothing of what moved
	}
	return moved, claimed, nil
}

func resolutions(rs []facilitator.Resolution) string {
	out := ""
	for i, r := range rs {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprintf("%d:%s:%s:%d", r.ID, r.State, r.TxHash.Hex(), r.BlockNumber)
		if r.Claim != nil {
			out += fmt.Sprintf(":claim%q", r.Claim.KeyID) // not the token: it is random
		}
	}
	return out
}

// MarkFinal moves mined settlements to final, each only while it is still in the block judged
// final, and returns the ids that moved.
func (l *Ledger) MarkFinal(ctx context.Context, finals []facilitator.MinedIn) ([]int64, error) {
	var moved []int64
	ids := make([]int64, len(finals))
	in := map[int64]common.Hash{}
	for i, m := range finals {
		ids[i], in[m.ID] = m.ID, m.BlockHash
	}
	err := l.call(ctx, fmt.Sprintf("mark-final %v", ids), true, func() error {
		moved = nil
		for _, id := range dedupe(ids) {
			if r := l.rows[id]; r != nil && r.s.State == facilitator.StateMined && r.blockHash == in[id] {
				r.s.State, r.updatedAt = facilitator.StateFinal, l.now()
				l.event(r, string(facilitator.StateFinal), "")
				moved = append(moved, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return moved, nil
}

// Reopen moves a mined settlement back to broadcast (its block left the canonical chain),
// forgetting its outcome; facilitator.ErrNotFound when no row is mined in that block.
func (l *Ledger) Reopen(ctx context.Context, m facilitator.MinedIn, detail string) error {
	return l.call(ctx, fmt.Sprintf("reopen %d", m.ID), true, func() error {
		r := l.rows[m.ID]
		if r == nil || r.s.State != facilitator.StateMined || r.blockHash != m.BlockHash {
			return facilitator.ErrNotFound
		}
		r.s.State, r.s.TxHash, r.s.BlockNumber, r.blockHash = facilitator.StateBroadcast, common.Hash{}, 0, common.Hash{}
		r.s.ErrorReason, r.s.ErrorMessage, r.updatedAt = "", "", l.now()
		l.event(r, string(facilitator.StateBroadcast), detail)
		return nil
	})
}

// AddTx records a fee-bumped replacement before it is sent, and raises the settlement's reserved
// gas cost to the replacement's when that is higher; facilitator.ErrNotFound when the
// settlement is mined or final (a failed one still takes one: its nonce may need filling).
func (l *Ledger) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	return l.call(ctx, fmt.Sprintf("add-tx %d %s", id, tx.Hash.Hex()), true, func() error {
		r := l.rows[id]
		if r == nil || r.s.State.Succeeded() {
			return facilitator.ErrNotFound
		}
		if l.byTx[tx.Hash] != nil {
			return fmt.Errorf("settlesim: duplicate key value violates unique constraint \"settlement_txs_pkey\": %w", facilitator.ErrDuplicate)
		}
		if reserved := reservedGas(tx); reserved.Sign() > 0 && reserved.Cmp(r.gasReserved) > 0 {
			r.gasReserved = reserved
		}
		l.addTxLocked(r, tx)
		l.event(r, "bumped", "replacement "+tx.Hash.Hex())
		return nil
	})
}

// ClaimDelivery records that a caller is being told success: true. Only one ever is, only for a
// settlement that succeeded without a mismatch, and only a caller with the row's key id ("" for
// a row settled in open mode).
func (l *Ledger) ClaimDelivery(ctx context.Context, id int64, keyID string, claim []byte, lease time.Duration) (bool, error) {
	claimed := false
	err := l.call(ctx, fmt.Sprintf("claim-delivery %d %q", id, keyID), true, func() error {
		claimed = false
		r := l.rows[id]
		if r == nil || !r.s.State.Succeeded() || r.s.ErrorReason != "" || r.keyID != keyID {
			return nil
		}
		if !l.claimFree(r) {
			if l.claimHeld(r) {
				return facilitator.ErrClaimUndecided
			}
			return nil
		}
		l.take(r, claim, lease)
		claimed = true
		return nil
	})
	if err != nil {
		return false, err
	}
	return claimed, nil
}
