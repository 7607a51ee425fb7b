package settlesim

import (
	"context"
	"fmt"
	"math/big"
	"slices"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// AdoptSettlements records a mined transaction of our key the ledger lost, as the Postgres
// ledger's AdoptSettlements: all members or none, each a new mined row marked adopted, an open
// row resolved mined onto the transaction, or a row already mined by it left alone; fresh when
// this call wrote a member.
func (l *Ledger) AdoptSettlements(ctx context.Context, a facilitator.Adoption) (ids []int64, fresh bool, err error) {
	err = l.call(ctx, fmt.Sprintf("adopt %s nonce=%d", a.Tx.Hash.Hex(), a.TxNonce), true, func() error {
		var err error
		ids, fresh, err = l.adoptLocked(a)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return ids, fresh, nil
}

func (l *Ledger) adoptLocked(a facilitator.Adoption) ([]int64, bool, error) {
	// Checked first, written after: the Postgres transaction rolls back on the first failure.
	taken := map[nonceKey]bool{} // the members' new places
	stay := map[int]bool{}       // open rows resolved where they are: another settlement holds the place
	for i, m := range a.Members {
		nk := nonceKey{a.Network, a.Signer, a.TxNonce, m.Slot}
		r := l.byKey[m.Key]
		switch {
		case r != nil && r.s.State.Succeeded() && r.s.TxHash == a.Tx.Hash:
			continue
		case r != nil && r.s.State == facilitator.StateSettledElsewhere && r.s.TxHash == a.Tx.Hash:
			// Taken for another's use by a writer that did not know every key: corrected.
		case r != nil && !r.s.State.Open():
			return nil, false, facilitator.ErrDuplicate
		}
		if h := l.byNonce[nk]; (h != nil && h != r) || taken[nk] {
			if r == nil || !a.MayStay {
				return nil, false, facilitator.ErrNonceTaken
			}
			stay[i] = true
			continue
		}
		taken[nk] = true
	}
	now := l.now()
	detail := fmt.Sprintf("adopted: tx %s nonce %d block %d (the ledger had lost its record)", a.Tx.Hash.Hex(), a.TxNonce, a.BlockNumber)
	ids := make([]int64, len(a.Members))
	fresh := false
	var home *ledgerRow
	var placed []*ledgerRow
	for i, m := range a.Members {
		r := l.byKey[m.Key]
		nk := nonceKey{a.Network, a.Signer, a.TxNonce, m.Slot}
		switch {
		case r == nil:
			l.lastID++
			request := slices.Clone(m.Request)
			if request == nil {
				request = []byte("{}")
			}
			r = &ledgerRow{
				s: facilitator.Settlement{ID: l.lastID, Key: m.Key, Fingerprint: m.Fingerprint, PayTo: m.PayTo, Value: cloneBig(orZero(m.Value)),
					ValidBefore: cloneBig(orZero(m.ValidBefore)), Signer: a.Signer, TxNonce: a.TxNonce, BatchSlot: m.Slot, CreatedAt: now},
				validAfter: cloneBig(orZero(m.ValidAfter)), x402Version: m.X402Version, request: request, keyID: m.KeyID,
				gasReserved: new(big.Int),
			}
			l.rows[r.s.ID] = r
			l.byKey[m.Key] = r
			if b := m.PaymentID; b != nil && l.pids[pidKey{b.Scope, b.ID}] == nil {
				p := *b
				p.Summary = cloneSummary(p.Summary)
				r.paymentID = &p
				l.pids[pidKey{p.Scope, p.ID}] = r
			}
		case r.s.State.Succeeded():
			ids[i] = r.s.ID
			if r.s.Signer == a.Signer && r.s.TxNonce == a.TxNonce && r.s.BatchSlot == m.Slot && (home == nil || m.Slot < home.s.BatchSlot) {
				home = r
			}
			continue
		case stay[i]:
			// Resolved where it is, the transaction among its family's variants.
			r.s.State, r.s.TxHash, r.s.BlockNumber, r.blockHash = facilitator.StateMined, a.Tx.Hash, a.BlockNumber, a.BlockHash
			r.s.ErrorReason, r.s.ErrorMessage = "", ""
			r.adopted, r.updatedAt = true, now
			l.event(r, string(facilitator.StateMined), detail)
			if l.byTx[a.Tx.Hash] == nil {
				l.addTxLocked(r, a.Tx)
			}
			ids[i], fresh = r.s.ID, true
			continue
		default:
			delete(l.byNonce, nonceKey{r.s.Key.Network, r.s.Signer, r.s.TxNonce, r.s.BatchSlot})
		}
		r.s.Signer, r.s.TxNonce, r.s.BatchSlot = a.Signer, a.TxNonce, m.Slot
		r.s.State, r.s.TxHash, r.s.BlockNumber, r.blockHash = facilitator.StateMined, a.Tx.Hash, a.BlockNumber, a.BlockHash
		r.s.ErrorReason, r.s.ErrorMessage = "", ""
		r.adopted, r.updatedAt = true, now
		l.byNonce[nk] = r
		l.event(r, string(facilitator.StateMined), detail)
		ids[i], fresh = r.s.ID, true
		placed = append(placed, r)
		if home == nil || m.Slot < home.s.BatchSlot {
			home = r
		}
	}
	// A member past slot 0 reads its batch's transactions at the slot-0 row of its nonce.
	for _, r := range placed {
		r.family = nil
		if r.s.BatchSlot > 0 {
			r.family = l.byNonce[nonceKey{a.Network, a.Signer, a.TxNonce, 0}]
		}
	}
	// The transaction once, under the lowest slot placed at its nonce.
	if home != nil && l.byTx[a.Tx.Hash] == nil {
		rec := cloneTx(a.Tx)
		rec.Gas = 0
		home.txs = append(home.txs, LedgerTx{TxRecord: rec, CreatedAt: now})
		l.byTx[a.Tx.Hash] = home
	}
	return ids, fresh, nil
}

// BindAdopted gives an adopted row no request made the request now asking for it, as the
// Postgres ledger's BindAdopted.
func (l *Ledger) BindAdopted(ctx context.Context, id int64, fp facilitator.Fingerprint, keyID string, x402Version int, request []byte) (bool, error) {
	var ok bool
	err := l.call(ctx, fmt.Sprintf("bind-adopted %d", id), true, func() error {
		r := l.rows[id]
		ok = r != nil && r.adopted && r.s.Fingerprint == facilitator.Fingerprint{}
		if ok {
			r.s.Fingerprint, r.keyID, r.x402Version, r.request = fp, keyID, x402Version, slices.Clone(request)
			r.updatedAt = l.now()
		}
		return nil
	})
	return ok, err
}

func orZero(b *big.Int) *big.Int {
	if b == nil {
		return new(big.Int)
	}
	return b
}

// MinedBlockBelow is the highest block the ledger has one of the signer's settlements at a tx
// nonce below nonce mined in, as the Postgres ledger's.
func (l *Ledger) MinedBlockBelow(ctx context.Context, network string, signer common.Address, nonce uint64) (uint64, bool, error) {
	var (
		top uint64
		ok  bool
	)
	err := l.call(ctx, fmt.Sprintf("mined-below %s %d", signer.Hex(), nonce), false, func() error {
		top, ok = 0, false
		for _, r := range l.rows {
			if r.s.Key.Network == network && r.s.Signer == signer && r.s.TxNonce < nonce && r.s.State.Succeeded() && (!ok || r.s.BlockNumber > top) {
				top, ok = r.s.BlockNumber, true
			}
		}
		return nil
	})
	return top, ok, err
}
