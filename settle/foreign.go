package settle

import (
	"context"
	"errors"
	"math/big"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A transaction from one of our signer keys that this engine did not sign (an operator using the
// key elsewhere, a second deployment without the lease) can take a nonce a settlement's
// transaction holds while it is not mined yet. Nodes then refuse ours as nonce too low, forever:
// no variant of it can ever land, and the payer's authorization, still valid and unused, would
// wait for validBefore. The decision core (sendstate.go) detects that case from pinned reads, read
// twice, and the watcher re-signs the settlement's call with a new nonce from the key's owner,
// recorded in the ledger before it is sent. The old variants stay watched; EIP-3009's
// authorization nonce guarantees that at most one of them all transfers.

// resignMargin is how long before validBefore (by the chain's clock) a settlement is still
// re-signed: past it, the new transaction would likely be mined too late, and the settlement is
// left to expire.
const resignMargin = 30 * time.Second

// resign signs f's call again (same calldata and gas, current fees) with the key's next nonce,
// records it in the ledger as the settlement's transaction at that nonce, and queues it. old is
// the nonce the foreign transaction took.
func (n *network) resign(ctx context.Context, f *flight, old uint64, why string, gap *uint64) error {
	e := n.engine
	s := f.sender
	fees, err := n.fees(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; ; attempt++ {
		l := s.held()
		if l == nil || f.isDropped() {
			return errNotLeased // the key's holder works it
		}
		if f.txNonce() != old {
			return nil // already moved
		}
		// The key's next nonce is stale too (the foreign transaction used one): read it again
		// from the chain and the ledger.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RPCTimeout)
		err := s.load(lctx)
		cancel()
		if err != nil {
			s.nonces.reset()
			return err
		}
		nonce := s.next
		if gap != nil {
			// Into the gap, and only there (the ledger refuses it as taken if a settlement holds
			// it by now): moving anywhere else would leave the gap.
			if *gap >= old {
				return nil
			}
			nonce = *gap
		}
		// A signer that fails leaves the settlement as it was: the watcher decides the re-sign
		// again next round and tries again.
		st, err := s.sign(ctx, nonce, f.target(), f.data, f.gas, fees)
		if err != nil {
			return err
		}
		tx, raw := st.tx, st.raw
		rec := facilitator.TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: f.gas}
		// Through the lease, before the broadcast: no row, no broadcast.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		err = l.MoveNonce(wctx, f.id, nonce, rec)
		cancel()
		if errors.Is(err, facilitator.ErrDuplicate) {
			// These very bytes are recorded (only this settlement signs this calldata at this nonce
			// and fee): an earlier move committed and its answer was lost, or they are an older
			// variant of the settlement at that nonce (a move back down into a gap). The row says.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
			got, rerr := e.store.SettlementByID(rctx, f.id)
			cancel()
			switch {
			case rerr != nil:
				s.nonces.reset()
				return rerr
			case got.TxNonce != nonce && attempt < 3:
				// New bytes: one wei more of tip and cap.
				fees = Fees{TipCap: new(big.Int).Add(fees.TipCap, big.NewInt(1)), FeeCap: new(big.Int).Add(fees.FeeCap, big.NewInt(1))}
				continue
			case got.TxNonce == nonce:
				err = nil
			}
		}
		if errors.Is(err, facilitator.ErrNonceTaken) && gap != nil {
			return nil // someone filled the gap meanwhile
		}
		if errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3 {
			e.cfg.Observer.NonceGap(n.id.ID, s.addr.Hex(), NonceTaken)
			s.nonces.reset()
			continue
		}
		if err != nil && !errors.Is(err, facilitator.ErrNotFound) && !errors.Is(err, facilitator.ErrNonceTaken) {
			// A write whose answer was lost may have committed: then the transaction is the
			// ledger's and must go out, or its nonce is a gap holding back the key.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
			got, rerr := e.store.SettlementByID(rctx, f.id)
			cancel()
			if rerr == nil && got.TxNonce == nonce && got.TxHash == rec.Hash {
				err = nil
			}
			if rerr != nil {
				// Not known either way: the watcher finds out from the row before it decides
				// anything more about the settlement (settleMove).
				f.mu.Lock()
				f.move = &pendingMove{nonce: nonce, tx: &sentTx{hash: rec.Hash, nonce: nonce, raw: raw, fees: fees, signedAt: e.now()}}
				f.mu.Unlock()
			}
		}
		if err != nil {
			s.nonces.reset()
			return err
		}
		if gap == nil {
			s.nonces.take(1) // nonce was s.next
		} else {
			s.nonces.reset() // the next commit derives the key's next free nonce afresh
		}
		f.update(func(f *flight) {
			f.nonce = nonce
			f.txs = append(f.txs, &sentTx{hash: rec.Hash, nonce: nonce, raw: raw, fees: fees, signedAt: e.now()})
		})
		e.log.Warn("re-signing with a new nonce", f.logAttrs("why", why, "signer", s.addr, "old_tx_nonce", old, "new_tx_nonce", nonce, "tx", rec.Hash)...)
		e.cfg.Observer.NonceGap(n.id.ID, s.addr.Hex(), NonceForeign)
		s.enqueue(f)
		return nil
	}
}

// pendingMove is a re-sign whose ledger write's outcome is unknown.
type pendingMove struct {
	nonce uint64
	tx    *sentTx
}

// settleMove finds out, from the ledger row, whether f's re-sign of unknown outcome committed, and
// makes the flight follow: the moved transaction is f's (and goes out), or it never was. It reports
// false while the ledger does not tell: nothing more is decided about f until it does, or the
// flight and the ledger could disagree on the nonce f holds (and leave it a gap).
func (n *network) settleMove(ctx context.Context, f *flight) bool {
	f.mu.Lock()
	m := f.move
	f.mu.Unlock()
	if m == nil {
		return true
	}
	e := n.engine
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
	row, err := e.store.SettlementByID(rctx, f.id)
	cancel()
	if err != nil {
		return false
	}
	moved := row.TxNonce == m.nonce
	f.update(func(f *flight) {
		f.move = nil
		if moved {
			f.nonce = m.nonce
			f.txs = append(f.txs, m.tx)
		}
	})
	if moved {
		e.log.Warn("a re-sign whose write's answer was lost had committed; sending", f.logAttrs("tx_nonce", m.nonce, "tx", m.tx.hash)...)
		f.sender.enqueue(f)
	}
	return true
}
