package settle

import (
	"context"
	"errors"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A batch's member whose call did not transfer in a batch that was mined (the batch reverted as a
// whole because another payer's call burned its gas, its own call ran short inside it, or the
// chain has no code at Multicall3's address, where every call "succeeds" transferring nothing)
// is not failed while its authorization stays valid: once the batch's block is final and the
// authorization reads unused there, read twice, none of our transactions can transfer it any more,
// and the decision core (batchReverted in sendstate.go) has it settled again ALONE, at the key's
// next nonce, recorded in the ledger before it is sent. Alone, its new transaction is not a
// batch's, so it is never settled again a second time: what a member can cost is its batch's
// share and one lone transaction. A failure that is the payment's own (its payer's balance short
// at that block, its authorization used elsewhere or expired) is answered as before.

// resettle signs f's own call, taken from its batch's calldata, alone with the key's next nonce,
// and moves its row there (a batch of one: facilitator.SignerLease.MoveBatch) with the new
// transaction before it is queued. old is the batch's tx nonce. Its gas limit is its own
// estimate's (the batch's limit, which covered its call, for a flight recovered without one).
func (n *chainEngine) resettle(ctx context.Context, f *flight, old uint64, why string) error {
	e := n.engine
	s := f.sender
	fees, err := n.fees(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	moving, calls := batchCallsOf([]*flight{f}, old)
	if len(moving) == 0 {
		return nil // settled again already (its calldata is no batch's), or the call is not the flight's
	}
	data, gas := calls[0].CallData, f.gas
	if f.estimate > 0 {
		gas = eip3009.GasLimit(f.estimate)
	}
	for attempt := 0; ; attempt++ {
		l := s.held()
		if l == nil || f.isDropped() {
			return errNotLeased // the key's holder works it
		}
		if err := s.reload(ctx); err != nil {
			return err
		}
		nonce := s.next
		// A signer that fails leaves the member as it was: decided again next round.
		st, err := s.sign(ctx, nonce, f.key.Asset, data, gas, fees)
		if err != nil {
			return err
		}
		rec := facilitator.TxRecord{Hash: st.tx.Hash(), Raw: st.raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: gas}
		tx := &sentTx{hash: rec.Hash, nonce: nonce, raw: st.raw, fees: fees, signedAt: e.now()}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		err = l.MoveBatch(wctx, []int64{f.id}, nonce, rec)
		cancel()
		if errors.Is(err, facilitator.ErrNotFound) {
			// No longer open in the ledger (someone else resolved it): follow the ledger.
			n.sync(ctx, f)
			return err
		}
		retry, unknown, err := n.moveWritten(ctx, s, f.id, nonce, err, attempt, &fees)
		if retry {
			continue
		}
		if unknown {
			// Not known either way: the member finds out from its row before anything more is
			// decided about it (settleMove).
			f.update(func(f *flight) {
				f.move = &pendingMove{nonce: nonce, tx: tx, data: data, gas: gas}
			})
		}
		if err != nil {
			return err
		}
		s.nonces.take(1) // nonce was s.next
		f.update(func(f *flight) {
			f.nonce, f.data, f.to, f.gas, f.verdict = nonce, data, f.key.Asset, gas, nil
			// The batch's variants are mined in a final block without transferring for f: only
			// the new transaction can, and only it is watched.
			f.txs = []*sentTx{tx}
		})
		regroup([]*flight{f}) // out of its batch's family: nothing of the batch's is f's any more
		e.log.Warn("settling a batch's member again alone with a new nonce", f.logAttrs("why", why, "signer", s.addr,
			"old_tx_nonce", old, "new_tx_nonce", nonce, "tx", rec.Hash, "gas", gas)...)
		s.enqueue(f)
		return nil
	}
}
