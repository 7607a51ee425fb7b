package settle

import (
	"context"
	"errors"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
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
func (n *chainEngine) resign(ctx context.Context, f *flight, old uint64, why string, gap *uint64) error {
	s := f.sender
	fees, err := n.fees(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; ; attempt++ {
		l, nonce, done, err := n.resignNonce(ctx, f, old, gap)
		if done || err != nil {
			return err
		}
		// A signer that fails leaves the settlement as it was: the watcher decides the re-sign
		// again next round and tries again.
		st, err := s.sign(ctx, nonce, f.target(), f.data, f.gas, fees)
		if err != nil {
			return err
		}
		rec := facilitator.TxRecord{Hash: st.tx.Hash(), Raw: st.raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: f.gas}
		// Through the lease, before the broadcast: no row, no broadcast.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		err = l.MoveNonce(wctx, f.id, nonce, rec)
		cancel()
		retry, done, err := n.resignWritten(ctx, f, nonce, rec, &fees, err, attempt, gap != nil)
		if retry {
			continue
		}
		if done || err != nil {
			return err
		}
		n.resigned(f, old, nonce, rec, fees, why, gap != nil)
		return nil
	}
}

// resignNonce is the nonce f's call is re-signed at, under the key's lease l (the caller holds the
// key's lock): the key's next nonce, or the gap's. done: nothing to re-sign (f moved already, or
// the gap is not below old), or not this process's to (errNotLeased), or the nonce not known.
func (n *chainEngine) resignNonce(ctx context.Context, f *flight, old uint64, gap *uint64) (l facilitator.SignerLease, nonce uint64, done bool, err error) {
	s := f.sender
	l = s.held()
	if l == nil || f.isDropped() {
		return nil, 0, true, errNotLeased // the key's holder works it
	}
	if f.txNonce() != old {
		return nil, 0, true, nil // already moved
	}
	if err := s.reload(ctx); err != nil {
		return nil, 0, true, err
	}
	nonce = s.next
	if gap != nil {
		// Into the gap, and only there (the ledger refuses it as taken if a settlement holds
		// it by now): moving anywhere else would leave the gap.
		if *gap >= old {
			return nil, 0, true, nil
		}
		nonce = *gap
	}
	return l, nonce, false, nil
}

// resignWritten is what the MoveNonce of f to nonce with rec came to, whose answer was err, at the
// attempt-th try: retry (these bytes are recorded under another nonce: *fees is raised by one wei;
// or the nonce was taken), done (failed with the error, or a gap someone filled meanwhile: nil),
// or neither (the row is at nonce, whatever the answer said). A write that may have committed and
// that the ledger cannot tell either way leaves f a pending move (settleMove). The key's next
// nonce is reset whenever the move is not written.
func (n *chainEngine) resignWritten(ctx context.Context, f *flight, nonce uint64, rec facilitator.TxRecord, fees *Fees, err error, attempt int, intoGap bool) (retry, done bool, _ error) {
	e := n.engine
	s := f.sender
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
			return false, true, rerr
		case got.TxNonce != nonce && attempt < 3:
			// New bytes: one wei more of tip and cap.
			*fees = Fees{TipCap: new(big.Int).Add(fees.TipCap, big.NewInt(1)), FeeCap: new(big.Int).Add(fees.FeeCap, big.NewInt(1))}
			return true, false, nil
		case got.TxNonce == nonce:
			err = nil
		}
	}
	if errors.Is(err, facilitator.ErrNonceTaken) && intoGap {
		return false, true, nil // someone filled the gap meanwhile
	}
	if errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3 {
		e.cfg.Observer.NonceGap(n.net.ID, s.addr.Hex(), NonceTaken)
		s.nonces.reset()
		return true, false, nil
	}
	if err != nil && !errors.Is(err, facilitator.ErrNotFound) && !errors.Is(err, facilitator.ErrNonceTaken) {
		// A write whose answer was lost may have committed: then the transaction is the
		// ledger's and must go out, or its nonce is a gap holding back the key.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		got, rerr := e.store.SettlementByID(rctx, f.id)
		cancel()
		// The row's nonce alone says (only this key's holder moves its rows): its hash is
		// another's once the row failed meanwhile (settled elsewhere names the other party's
		// transaction), and the moved transaction must go out all the same, or its nonce is
		// a gap (the simulator's seed 877, with the reconcile job resolving the row first).
		if rerr == nil && got.TxNonce == nonce {
			err = nil
		}
		if rerr != nil {
			// Not known either way: the watcher finds out from the row before it decides
			// anything more about the settlement (settleMove).
			f.mu.Lock()
			f.move = &pendingMove{nonce: nonce, tx: &sentTx{hash: rec.Hash, nonce: nonce, raw: rec.Raw, fees: *fees, signedAt: e.now()}}
			f.mu.Unlock()
		}
	}
	if err != nil {
		s.nonces.reset()
		return false, true, err
	}
	return false, false, nil
}

// resigned makes f hold its re-signed transaction rec at nonce, recorded in the ledger, and
// queues it for the broadcaster.
func (n *chainEngine) resigned(f *flight, old, nonce uint64, rec facilitator.TxRecord, fees Fees, why string, intoGap bool) {
	e := n.engine
	s := f.sender
	if !intoGap {
		s.nonces.take(1) // nonce was s.next
	} else {
		s.nonces.reset() // the next commit derives the key's next free nonce afresh
	}
	f.update(func(f *flight) {
		f.nonce = nonce
		f.txs = append(f.txs, &sentTx{hash: rec.Hash, nonce: nonce, raw: rec.Raw, fees: fees, signedAt: e.now()})
	})
	e.log.Warn("re-signing with a new nonce", f.logAttrs("why", why, "signer", s.addr, "old_tx_nonce", old, "new_tx_nonce", nonce, "tx", rec.Hash)...)
	e.cfg.Observer.NonceGap(n.net.ID, s.addr.Hex(), NonceForeign)
	s.enqueue(f)
}

// pendingMove is a re-sign whose ledger write's outcome is unknown.
type pendingMove struct {
	nonce uint64
	tx    *sentTx
	// data and gas are the new batch's calldata and gas limit, for a batch's member (nil and 0: a
	// lone settlement's are the same).
	data []byte
	gas  uint64
}

// settleMove finds out, from the ledger row, whether f's re-sign of unknown outcome committed, and
// makes the flight follow: the moved transaction is f's (and goes out), or it never was. It reports
// false while the ledger does not tell: nothing more is decided about f until it does, or the
// flight and the ledger could disagree on the nonce f holds (and leave it a gap).
func (n *chainEngine) settleMove(ctx context.Context, f *flight) bool {
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
			if m.data != nil {
				f.data, f.gas = m.data, m.gas
			}
		}
	})
	if moved {
		if _, batch := multicall3.DecodeAggregate3Calldata(f.data); !batch {
			// A lone call: a batch's member settled again alone (resettle.go), out of its family.
			f.update(func(f *flight) { f.to = f.key.Asset })
			regroup([]*flight{f})
		}
		e.log.Warn("a re-sign whose write's answer was lost had committed; sending", f.logAttrs("tx_nonce", m.nonce, "tx", m.tx.hash)...)
		f.sender.enqueue(f)
	}
	return true
}

// nonceTaker finds, by the blocks themselves, the transaction that used signer's nonce by block
// at: the first block whose count of the signer's transactions passes nonce (the last 32 blocks'
// counts in one batch, and a binary search below them over the last logLookback blocks), then that
// block's own transactions. A re-sign rests on it, not on null receipts: a node can answer null for a
// receipt of ours it has not indexed, and re-signing after our own transaction (one that
// reverted, with the authorization still unused) would put a second transaction of ours on the
// authorization and pay its gas. known is false when a read failed, a node lacked a block, or the
// nonce was used before the window: not known yet.
func (n *chainEngine) nonceTaker(ctx context.Context, signer common.Address, nonce, at uint64) (tx common.Hash, known bool) {
	count := func(b uint64) (uint64, bool) {
		var c hexutil.Uint64
		if err := n.one(ctx, ethrpc.TransactionCount(signer, ethrpc.At(b), &c)); err != nil {
			return 0, false
		}
		return uint64(c), true
	}
	// The nonce is almost always used in the last few blocks: their counts in one batch, and a
	// binary search below them only when it was not.
	const recent = 32
	lo, hi := uint64(0), at
	if at > logLookback {
		lo = at - logLookback
	}
	first := max(lo, at-min(at, recent-1))
	counts := make([]hexutil.Uint64, at-first+1)
	elems := make([]rpc.BatchElem, len(counts))
	for k := range counts {
		elems[k] = ethrpc.TransactionCount(signer, ethrpc.At(first+uint64(k)), &counts[k])
	}
	if err := n.batch(ctx, elems); err != nil {
		return common.Hash{}, false
	}
	for k := range elems {
		if elems[k].Error != nil {
			return common.Hash{}, false
		}
	}
	switch {
	case uint64(counts[len(counts)-1]) <= nonce:
		return common.Hash{}, false // not used at at, by this node's word
	case uint64(counts[0]) <= nonce:
		for k := range counts {
			if uint64(counts[k]) > nonce {
				hi = first + uint64(k)
				break
			}
		}
	default:
		hi = first
		if c, ok := count(lo); !ok || c > nonce {
			return common.Hash{}, false
		}
		for lo+1 < hi { // count(lo) <= nonce < count(hi)
			mid := lo + (hi-lo)/2
			c, ok := count(mid)
			if !ok {
				return common.Hash{}, false
			}
			if c > nonce {
				hi = mid
			} else {
				lo = mid
			}
		}
	}
	var b *struct {
		Txs []struct {
			Hash  common.Hash    `json:"hash"`
			From  common.Address `json:"from"`
			Nonce hexutil.Uint64 `json:"nonce"`
		} `json:"transactions"`
	}
	if err := n.one(ctx, ethrpc.Block(ethrpc.At(hi), true, &b)); err != nil || b == nil {
		return common.Hash{}, false
	}
	for _, t := range b.Txs {
		if t.From == signer && uint64(t.Nonce) == nonce {
			return t.Hash, true
		}
	}
	return common.Hash{}, false
}

// takenByForeign reports whether the transaction that used the nonce by block at is known, by the
// blocks, to be none of t's own (f's track as the decision read it).
func (n *chainEngine) takenByForeign(ctx context.Context, f *flight, t track, nonce, at uint64) bool {
	h, known := n.nonceTaker(ctx, f.sender.addr, nonce, at)
	if !known {
		n.engine.log.Info("the nonce's transaction could not be found in the blocks yet; not re-signing this round", f.logAttrs("tx_nonce", nonce)...)
		return false
	}
	for _, v := range t.variants {
		if v.hash == h {
			n.engine.log.Info("the nonce is used by our own transaction, whose receipt the node did not answer; not re-signing", f.logAttrs("tx_nonce", nonce, "tx", h)...)
			return false
		}
	}
	return true
}
