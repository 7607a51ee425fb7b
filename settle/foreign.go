package settle

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// A transaction from one of our signer keys that this engine did not sign (an operator using the
// key elsewhere, a second deployment without the lease) can take a nonce a settlement's
// transaction holds while it is not mined yet. Nodes then refuse ours as nonce too low, forever:
// no variant of it can ever land, and the payer's authorization, still valid and unused, would
// wait for validBefore. The watcher detects that case and re-signs the settlement's call with a
// new nonce from the key's owner, recorded in the ledger before it is sent. The old variants stay
// watched; EIP-3009's authorization nonce guarantees that at most one of them all transfers.

// resignMargin is how long before validBefore (by the chain's clock) a settlement is still
// re-signed: past it, the new transaction would likely be mined too late, and the settlement is
// left to expire.
const resignMargin = 30 * time.Second

// foreignNonce runs when a node called f's nonce too low and the round found no receipt of f's.
// It reads the chain: when the key's nonce at latest is past f's (whatever holds the nonce is
// mined) and none of f's variants has a receipt, the nonce went to a foreign transaction. Then
// the authorization is checked: used (by a transaction not ours) or expired, f is resolved (res,
// resolved); still valid with margin, f is re-signed with a new nonce and queued (handled).
// Otherwise the watcher goes on as usual (the node's answer was about one of our own variants,
// or the chain could not be read this round).
func (n *network) foreignNonce(ctx context.Context, f *flight) (res Resolution, resolved, handled bool) {
	e := n.engine
	s := f.sender
	if s.held() == nil || f.isDropped() {
		return Resolution{}, false, false
	}
	nonce := f.txNonce()
	var latest hexutil.Uint64
	if err := n.call(ctx, &latest, "eth_getTransactionCount", s.addr, "latest"); err != nil {
		e.log.Warn("reading the signer's mined nonce", f.logAttrs("signer", s.addr, "err", err)...)
		return Resolution{}, false, false
	}
	if uint64(latest) <= nonce {
		return Resolution{}, false, false // the nonce is not used by a mined transaction (yet)
	}
	// Every transaction holding a nonce up to f's is mined now (read after the count): if one of
	// ours is, its receipt is there.
	hashes := f.hashes()
	receipts := make([]*types.Receipt, len(hashes))
	var state hexutil.Bytes
	var head struct {
		Time hexutil.Uint64 `json:"timestamp"`
	}
	call := map[string]any{"to": f.key.Asset, "input": hexutil.Bytes(verify.AuthorizationStateCalldata(f.key.Payer, f.key.Nonce))}
	elems := make([]rpc.BatchElem, 0, len(hashes)+2)
	for i, h := range hashes {
		elems = append(elems, rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{h}, Result: &receipts[i]})
	}
	elems = append(elems,
		rpc.BatchElem{Method: "eth_call", Args: []any{call, "latest"}, Result: &state},
		rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{"latest", false}, Result: &head})
	err := n.batch(ctx, elems)
	for i := 0; err == nil && i < len(elems); i++ {
		err = elems[i].Error
	}
	if err != nil {
		e.log.Warn("checking a settlement whose nonce a node called too low", f.logAttrs("err", err)...)
		return Resolution{}, false, false
	}
	for _, r := range receipts {
		if r != nil {
			// Ours landed after all: the one classifier explains it.
			if res, ok := n.outcome(ctx, f, r); ok {
				return res, true, true
			}
			return Resolution{}, false, true
		}
	}
	if len(state) == 32 && state[31] == 1 {
		// Used, and by no transaction of ours. No hash is recorded: none of ours landed, and the
		// engine does not know which transaction used it (the index does, later). The status API
		// reads the using transaction from the index for every settled_elsewhere row and never
		// shows the row's own hash (the watcher's is our reverted one, reconcile's the index's),
		// so this row answers the same as theirs (TestSettleForeignNonceUsedElsewhere).
		return Resolution{ID: f.id, State: facilitator.StateSettledElsewhere, ErrorReason: facilitator.ReasonNonceAlreadyUsed,
			ErrorMessage: "the authorization was used by a transaction that is not ours"}, true, true
	}
	headTime := new(big.Int).SetUint64(uint64(head.Time))
	switch {
	case f.validBefore != nil && headTime.Cmp(f.validBefore) >= 0:
		// Unused and expired, and no transaction of ours can land (their nonces are all used).
		return Resolution{ID: f.id, State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore,
			ErrorMessage: fmt.Sprintf("validBefore passed with the authorization unused; the signer's tx nonce %d was taken by a transaction that is not ours", nonce)}, true, true
	case f.validBefore != nil && new(big.Int).Add(headTime, big.NewInt(int64(resignMargin/time.Second))).Cmp(f.validBefore) >= 0:
		e.log.Warn("signer nonce taken by a foreign transaction; too close to validBefore to re-sign, letting it expire",
			f.logAttrs("signer", s.addr, "tx_nonce", nonce, "valid_before", f.validBefore)...)
		return Resolution{}, false, false
	}
	if err := n.resign(ctx, f, nonce); err != nil {
		e.log.Warn("re-signing a settlement whose nonce a foreign transaction took; will retry", f.logAttrs("signer", s.addr, "tx_nonce", nonce, "err", err)...)
		return Resolution{}, false, false
	}
	return Resolution{}, false, true
}

// resign signs f's call again (same calldata and gas, current fees) with the key's next nonce,
// records it in the ledger as the settlement's transaction at that nonce, and queues it. old is
// the nonce the foreign transaction took.
func (n *network) resign(ctx context.Context, f *flight, old uint64) error {
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
			s.loaded = false
			return err
		}
		nonce := s.next
		to := f.key.Asset
		tx, err := types.SignNewTx(s.key, s.signer, &types.DynamicFeeTx{
			ChainID: new(big.Int).SetUint64(n.id.ChainID), Nonce: nonce,
			GasTipCap: fees.TipCap, GasFeeCap: fees.FeeCap, Gas: f.gas, To: &to, Data: f.data,
		})
		if err != nil {
			return err
		}
		raw, err := tx.MarshalBinary()
		if err != nil {
			return err
		}
		rec := TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: f.gas}
		// Through the lease, before the broadcast: no row, no broadcast.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		err = l.MoveNonce(wctx, f.id, nonce, rec)
		cancel()
		if errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3 {
			e.cfg.Observer.NonceGap(n.id.ID, s.addr.Hex(), NonceTaken)
			s.loaded = false
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
		}
		if err != nil {
			s.loaded = false
			return err
		}
		s.next = nonce + 1
		f.update(func(f *flight) {
			f.nonce = nonce
			f.txs = append(f.txs, &sentTx{hash: rec.Hash, raw: raw, fees: fees, signedAt: e.now()})
		})
		e.log.Warn("signer nonce taken by a foreign transaction; re-signing with a new nonce",
			f.logAttrs("signer", s.addr, "old_tx_nonce", old, "new_tx_nonce", nonce, "tx", rec.Hash)...)
		e.cfg.Observer.NonceGap(n.id.ID, s.addr.Hex(), NonceForeign)
		s.enqueue(f)
		return nil
	}
}
