package settle

import (
	"bytes"
	"context"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

var transferTopic = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))

// watchLoop polls receipts for every transaction this network's flights have signed, resolves
// outcomes from them, and keeps unmined transactions moving (resend, fee bump).
func (n *network) watchLoop(ctx context.Context) {
	t := time.NewTicker(n.engine.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.watch(ctx)
		}
	}
}

func (n *network) watch(ctx context.Context) {
	e := n.engine
	flights := e.flightsOf(n)
	if len(flights) == 0 {
		return
	}
	var head hexutil.Uint64
	elems := []rpc.BatchElem{{Method: "eth_blockNumber", Result: &head}}
	type slot struct {
		f    *flight
		rcpt **types.Receipt
	}
	var slots []slot
	for _, f := range flights {
		for _, h := range f.hashes() {
			r := new(*types.Receipt)
			slots = append(slots, slot{f, r})
			elems = append(elems, rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{h}, Result: r})
		}
	}
	if err := n.batch(ctx, elems); err != nil || elems[0].Error != nil {
		e.log.Warn("polling receipts", "network", n.id.ID, "err", err)
		return
	}
	receipts := map[*flight]*types.Receipt{}
	for i, s := range slots {
		if elems[i+1].Error == nil && *s.rcpt != nil {
			receipts[s.f] = *s.rcpt
		}
	}
	resend := map[*sender][]*flight{}
	for _, f := range flights {
		v := f.view()
		rcpt := receipts[f]
		switch {
		case v.state.Succeeded():
			n.confirm(ctx, f, rcpt, uint64(head))
		case rcpt != nil:
			n.resolve(ctx, f, rcpt)
		default:
			if n.needsSend(ctx, f) {
				resend[f.sender] = append(resend[f.sender], f)
			}
		}
	}
	for s, fs := range resend {
		s.send(ctx, fs)
	}
}

// batch runs elems in chunks, each bounded by the RPC timeout.
func (n *network) batch(ctx context.Context, elems []rpc.BatchElem) error {
	const chunk = 500
	for i := 0; i < len(elems); i += chunk {
		end := min(i+chunk, len(elems))
		cctx, cancel := context.WithTimeout(ctx, n.engine.cfg.RPCTimeout)
		err := n.chain.BatchCallContext(cctx, elems[i:end])
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// confirm moves a mined settlement to final at the network's depth, or back to broadcast when its
// receipt is gone (its block was reorganised away; the transaction may be mined again).
func (n *network) confirm(ctx context.Context, f *flight, rcpt *types.Receipt, head uint64) {
	e := n.engine
	if rcpt == nil {
		if err := e.store.Reopen(ctx, f.id, "receipt disappeared: reorganised"); err != nil {
			e.log.Warn("reopening a reorganised settlement", "settlement", f.id, "err", err)
			return
		}
		e.log.Warn("settlement's block was reorganised away; watching again", "settlement", f.id)
		f.update(func(f *flight) {
			f.state, f.minedHash, f.block = facilitator.StateBroadcast, common.Hash{}, 0
		})
		f.sender.inFlight.Add(1)
		return
	}
	if head+1 < rcpt.BlockNumber.Uint64()+n.depth {
		return
	}
	if err := e.store.MarkFinal(ctx, f.id); err != nil {
		e.log.Warn("marking a settlement final", "settlement", f.id, "err", err)
		return
	}
	f.update(func(f *flight) { f.state = facilitator.StateFinal })
	e.untrack(f)
}

// resolve turns a receipt into the settlement's outcome. A revert is explained from the chain:
// the authorization used by someone else, expired, or a plain failure.
func (n *network) resolve(ctx context.Context, f *flight, rcpt *types.Receipt) {
	e := n.engine
	res := Resolution{TxHash: rcpt.TxHash, BlockNumber: rcpt.BlockNumber.Uint64(), BlockHash: rcpt.BlockHash}
	if rcpt.Status == types.ReceiptStatusSuccessful {
		res.State = facilitator.StateMined
		if !transferLogged(rcpt, f) {
			res.ErrorReason = facilitator.ReasonTransferEventMismatch
			res.ErrorMessage = "the transaction succeeded without the expected Transfer event"
		}
	} else {
		used, blockTime, err := n.explainRevert(ctx, f, rcpt)
		if err != nil {
			e.log.Warn("explaining a revert; will retry", "settlement", f.id, "err", err)
			return
		}
		switch {
		case used:
			res.State = facilitator.StateSettledElsewhere
			res.ErrorReason = facilitator.ReasonNonceAlreadyUsed
			res.ErrorMessage = "the authorization was used by another transaction before ours"
		case f.validBefore != nil && new(big.Int).SetUint64(blockTime).Cmp(f.validBefore) >= 0:
			res.State = facilitator.StateExpired
			res.ErrorReason = facilitator.ReasonValidBefore
			res.ErrorMessage = "the authorization expired before the transaction was mined"
		default:
			res.State = facilitator.StateReverted
			res.ErrorReason = facilitator.ReasonTransactionFailed
			res.ErrorMessage = "the transaction reverted"
		}
	}
	e.fault(FaultAfterReceipt)
	if err := e.store.Resolve(ctx, f.id, res); err != nil {
		e.log.Warn("recording an outcome; will retry", "settlement", f.id, "err", err)
		return
	}
	f.update(func(f *flight) {
		f.state, f.minedHash, f.block, f.blockHash = res.State, res.TxHash, res.BlockNumber, res.BlockHash
		f.reason, f.message = res.ErrorReason, res.ErrorMessage
	})
	f.sender.inFlight.Add(-1)
	e.log.Info("settlement resolved", "settlement", f.id, "state", res.State, "tx", res.TxHash, "block", res.BlockNumber,
		"payer", f.key.Payer, "nonce", hexutil.Encode(f.key.Nonce[:]))
	if !res.State.Succeeded() {
		e.untrack(f)
	}
}

// explainRevert reads whether the authorization is used now, and the block's time.
func (n *network) explainRevert(ctx context.Context, f *flight, rcpt *types.Receipt) (used bool, blockTime uint64, err error) {
	var state hexutil.Bytes
	var block struct {
		Time hexutil.Uint64 `json:"timestamp"`
	}
	call := map[string]any{"to": f.key.Asset, "input": hexutil.Bytes(verify.AuthorizationStateCalldata(f.key.Payer, f.key.Nonce))}
	elems := []rpc.BatchElem{
		{Method: "eth_call", Args: []any{call, "latest"}, Result: &state},
		{Method: "eth_getBlockByNumber", Args: []any{hexutil.EncodeBig(rcpt.BlockNumber), false}, Result: &block},
	}
	if err := n.batch(ctx, elems); err != nil {
		return false, 0, err
	}
	for _, el := range elems {
		if el.Error != nil {
			return false, 0, el.Error
		}
	}
	return len(state) == 32 && state[31] == 1, uint64(block.Time), nil
}

func transferLogged(rcpt *types.Receipt, f *flight) bool {
	for _, l := range rcpt.Logs {
		if l.Address == f.key.Asset && len(l.Topics) == 3 && l.Topics[0] == transferTopic &&
			common.BytesToAddress(l.Topics[1][:]) == f.key.Payer && common.BytesToAddress(l.Topics[2][:]) == f.payTo &&
			bytes.Equal(l.Data, common.LeftPadBytes(f.value.Bytes(), 32)) {
			return true
		}
	}
	return false
}

// needsSend decides whether an unmined flight's transaction should go out again now, bumping its
// fees first when it has waited too long or a node called it underpriced.
func (n *network) needsSend(ctx context.Context, f *flight) bool {
	e := n.engine
	now := e.now()
	t := f.latest()
	if t == nil {
		return false
	}
	f.mu.Lock()
	sentAt, tried, signedAt := t.sentAt, t.tried, t.signedAt
	f.mu.Unlock()
	switch {
	case n.takeBump(f), !sentAt.IsZero() && now.Sub(signedAt) >= e.cfg.BumpAfter:
		if err := n.bump(ctx, f); err != nil {
			e.log.Warn("fee bump failed; resending the current transaction", "settlement", f.id, "err", err)
		}
		return true
	case sentAt.IsZero():
		return now.Sub(tried) >= e.cfg.RetryInterval
	default:
		// Accepted once but not mined: a node may have dropped it; resending is harmless.
		return now.Sub(tried) >= e.cfg.RebroadcastAfter
	}
}

// bump signs a replacement with the same nonce and higher fees, and commits it before it is sent.
func (n *network) bump(ctx context.Context, f *flight) error {
	e := n.engine
	suggested, err := n.fees(ctx)
	if err != nil {
		return err
	}
	old := f.latest()
	fees := BumpFees(old.fees, suggested)
	if !WithinLimit(fees, e.cfg.MaxFeeCap) {
		e.log.Warn("fee bump would exceed the fee cap limit; keeping the current fees", "settlement", f.id, "fee_cap", fees.FeeCap)
		return nil
	}
	s := f.sender
	to := f.key.Asset
	tx, err := types.SignNewTx(s.key, s.signer, &types.DynamicFeeTx{
		ChainID: new(big.Int).SetUint64(n.id.ChainID), Nonce: f.nonce,
		GasTipCap: fees.TipCap, GasFeeCap: fees.FeeCap, Gas: f.gas, To: &to, Data: f.data,
	})
	if err != nil {
		return err
	}
	raw, err := tx.MarshalBinary()
	if err != nil {
		return err
	}
	if err := e.store.AddTx(ctx, f.id, TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap}); err != nil {
		return err
	}
	f.update(func(f *flight) {
		f.txs = append(f.txs, &sentTx{hash: tx.Hash(), raw: raw, fees: fees, signedAt: e.now()})
	})
	e.log.Info("fee bump", "settlement", f.id, "nonce", f.nonce, "tx", tx.Hash(), "tip", fees.TipCap, "fee_cap", fees.FeeCap)
	return nil
}
