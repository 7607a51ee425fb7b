package settle

// Re-signing the members of a batch whose nonce a transaction that is not ours took (foreign.go
// tells that it was): they move to the key's next nonce as a new batch, written to the ledger
// before it is sent. moveWritten, what such a move's ledger write came to, serves resettle.go too.

import (
	"context"
	"errors"
	"math/big"
	"slices"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// resignBatch is resign for members of a batch whose nonce a foreign transaction took (decided on
// final evidence, sendstate.go): the members, each of whose authorization was read unused at that
// block, are signed again as ONE new batch (their own calls, in their old order, with a gas limit
// for those calls: resignGas) at the key's next nonce, and the
// ledger moves them there, slots 0..n-1, with the new transaction, before it is sent. They are a
// new family; the members left behind (used elsewhere, expired) keep the old one and resolve
// as before. members share one sender and the tx nonce old.
func (n *chainEngine) resignBatch(ctx context.Context, members []*flight, old uint64, why string) error {
	e := n.engine
	s := members[0].sender
	fees, err := n.fees(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	moving, calls := batchCallsOf(members, old)
	if len(moving) == 0 {
		return nil // moved already, or the calls are not the flights' (nothing to sign)
	}
	ids := make([]int64, len(moving))
	for i, f := range moving {
		ids[i] = f.id
	}
	data, gas := multicall3.Aggregate3Calldata(calls), resignGas(moving, members[0].gas, members[0].data)
	for attempt := 0; ; attempt++ {
		l := s.held()
		if l == nil {
			return errNotLeased // the key's holder works it
		}
		if err := s.reload(ctx); err != nil {
			return err
		}
		nonce := s.next
		// A signer that fails leaves the batch as it was: decided again next round.
		st, err := s.sign(ctx, nonce, multicall3.Address, data, gas, fees)
		if err != nil {
			return err
		}
		rec := facilitator.TxRecord{Hash: st.tx.Hash(), Raw: st.raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: gas}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		err = l.MoveBatch(wctx, ids, nonce, rec)
		cancel()
		retry, unknown, err := n.moveWritten(ctx, s, ids[0], nonce, err, attempt, &fees)
		if retry {
			continue
		}
		if unknown {
			// Not known either way: each member finds out from its row (the move is one
			// transaction) before anything more is decided about it (settleMove).
			tx := &sentTx{hash: rec.Hash, nonce: nonce, raw: st.raw, fees: fees, signedAt: e.now()}
			for _, f := range moving {
				f.update(func(f *flight) { f.move = &pendingMove{nonce: nonce, tx: tx, data: data, gas: gas} })
			}
			regroup(moving)
		}
		if err != nil {
			return err
		}
		s.nonces.take(1) // nonce was s.next
		now := e.now()
		for _, f := range moving {
			f.update(func(f *flight) {
				f.nonce, f.data, f.to, f.gas = nonce, data, multicall3.Address, gas
				f.txs = append(f.txs, &sentTx{hash: rec.Hash, nonce: nonce, raw: st.raw, fees: fees, signedAt: now})
			})
		}
		regroup(moving)
		for _, f := range moving {
			e.log.Warn("re-signing a batch's settlement in a new batch with a new nonce", f.logAttrs("why", why, "signer", s.addr,
				"old_tx_nonce", old, "new_tx_nonce", nonce, "tx", rec.Hash, "members", len(moving))...)
			s.enqueue(f)
		}
		e.cfg.Observer.NonceGap(n.net.ID, s.addr.Hex(), NonceForeign)
		return nil
	}
}

// moveWritten is what a MoveBatch of the settlements starting with id to nonce came to, whose
// answer was err, at the attempt-th try (resignBatch, resettle): retry (the nonce was taken, or
// these bytes are recorded under another nonce: *fees is raised by one wei), done (err nil: the
// row is at nonce, whatever the answer said), or failed; unknown reports a write that may have
// committed that the ledger could not tell either way. The key's next nonce is reset whenever it
// is not done.
func (n *chainEngine) moveWritten(ctx context.Context, s *sender, id int64, nonce uint64, err error, attempt int, fees *Fees) (retry, unknown bool, _ error) {
	e := n.engine
	committed := func() (bool, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		defer cancel()
		got, err := e.store.SettlementByID(rctx, id)
		return err == nil && got.TxNonce == nonce, err
	}
	switch {
	case err == nil:
	case errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3:
		e.cfg.Observer.NonceGap(n.net.ID, s.addr.Hex(), NonceTaken)
		s.nonces.reset()
		return true, false, nil
	case errors.Is(err, facilitator.ErrDuplicate):
		// These very bytes are recorded: an earlier move committed and its answer was lost,
		// or (another nonce) new bytes are needed: one wei more of tip and cap.
		ok, rerr := committed()
		if rerr != nil {
			s.nonces.reset()
			return false, false, rerr
		}
		if !ok && attempt < 3 {
			*fees = Fees{TipCap: new(big.Int).Add(fees.TipCap, big.NewInt(1)), FeeCap: new(big.Int).Add(fees.FeeCap, big.NewInt(1))}
			return true, false, nil
		}
		if ok {
			err = nil
		}
	case !errors.Is(err, facilitator.ErrNotFound) && !errors.Is(err, facilitator.ErrNonceTaken):
		// A write whose answer was lost may have committed: then the transaction is the
		// ledger's and must go out, or its nonce is a gap holding back the key.
		ok, rerr := committed()
		if ok {
			err = nil
		}
		unknown = !ok && rerr != nil
	}
	if err != nil {
		s.nonces.reset()
	}
	return false, unknown, err
}

// resignGas is the gas limit of a batch re-signed with moving's calls, by the rule a new batch is
// sized with (signBatch): their own estimates, Multicall3's cost per call, the margin. The old
// batch's limit, oldGas for its calldata oldData, was sized for all its calls: kept, a lone
// survivor of a batch of four would ask four calls' gas, which a narrow signer (its ceiling per
// call) refuses every round until the payment expires. A member recovered from the ledger has no
// estimate of its own and is given the one the old batch's calls had if they were alike (its
// limit's inverse). Never more than oldGas: the old batch held these calls and more.
func resignGas(moving []*flight, oldGas uint64, oldData []byte) uint64 {
	all, _ := multicall3.DecodeAggregate3Calldata(oldData)
	alike := multicall3.CallEstimate(oldGas-oldGas/5, len(all)) // eip3009.GasLimit's inverse, rounded down
	estimates := make([]uint64, len(moving))
	for i, f := range moving {
		estimates[i] = f.estimate
		if estimates[i] == 0 {
			estimates[i] = alike
		}
	}
	return min(eip3009.GasLimit(multicall3.NeededGas(estimates)), oldGas)
}

// batchCallsOf is, of members, those still at tx nonce old and worked by this process, with their
// own calls, in the order of the batch's calldata (its slots).
func batchCallsOf(members []*flight, old uint64) ([]*flight, []multicall3.Call) {
	all, ok := multicall3.DecodeAggregate3Calldata(members[0].data)
	if !ok {
		return nil, nil
	}
	var moving []*flight
	var calls []multicall3.Call
	for _, c := range all {
		tc, ok := eip3009.DecodeCall(c.CallData)
		if !ok || tc.Method != eip3009.MethodTransferWithAuthorization {
			continue
		}
		for _, f := range members {
			if f.txNonce() == old && !f.isDropped() && c.Target == f.key.Asset && tc.Authorization.From == f.key.Payer && tc.Authorization.Nonce == f.key.Nonce {
				moving, calls = append(moving, f), append(calls, c)
				break
			}
		}
	}
	return moving, calls
}

// regroup makes moving, members of one batch re-signed as a new one, a family of their own: the
// old family keeps the members left behind (a bump of theirs never touches the new batch).
func regroup(moving []*flight) {
	if old := moving[0].family; old != nil {
		old.mu.Lock()
		old.members = slices.DeleteFunc(old.members, func(f *flight) bool { return slices.Contains(moving, f) })
		old.mu.Unlock()
	}
	for _, f := range moving {
		f.family = nil
	}
	linkFamily(moving)
}
