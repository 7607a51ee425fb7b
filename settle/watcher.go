package settle

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

var transferTopic = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))

// watchLoop polls receipts for every transaction this network's flights have signed, resolves
// outcomes from them, and keeps unmined transactions moving (resend, fee bump). It runs every
// PollInterval, and at once after a broadcast is accepted (wake).
func (n *network) watchLoop(ctx context.Context) {
	t := time.NewTicker(n.engine.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.watch(ctx)
		case <-n.kick:
			n.watch(ctx)
		}
	}
}

// watch is one round of the watcher. It follows new blocks rather than polling every receipt:
// it reads the hashes of the blocks mined since the last round and fetches receipts only for our
// transactions among them, so a thousand transactions in flight cost the node a few calls per
// block, not a thousand per round. A full sweep of every receipt still runs at start, after a gap
// of more than maxBlockGap blocks, and every fullSweepEvery, in case a block was missed.
func (n *network) watch(ctx context.Context) {
	e := n.engine
	if len(e.flightsOf(n)) == 0 {
		return
	}
	// A head the subscription announced past the last round's saves asking the node for one
	// (reading up to a head that is already behind is harmless: the next round reads on).
	head := hexutil.Uint64(n.headHint.Load())
	if uint64(head) <= n.lastBlock {
		if err := n.call(ctx, &head, "eth_blockNumber"); err != nil {
			e.log.Warn("reading the head", "network", n.id.ID, "err", err)
			return
		}
	}
	// The flights are read after the head: a flight tracked later was broadcast later, so it lands
	// in a block past head, which the next round reads. (Read before the head, a flight signed in
	// between could be mined at or below head, in a block this round marks as read without
	// asking for its receipt; only the next full sweep would find it.)
	flights := e.flightsOf(n)
	now := e.now()
	var candidates map[common.Hash]bool // nil: every transaction is a candidate
	var blockRcpts map[common.Hash]*types.Receipt
	switch {
	case n.lastBlock == 0, uint64(head) > n.lastBlock+maxBlockGap, now.Sub(n.lastSweep) >= fullSweepEvery, n.resweep.Swap(false):
		n.lastSweep = now
	case uint64(head) > n.lastBlock:
		var err error
		if !n.noBlockReceipts {
			// Every receipt of the new blocks in one call per block: ours among them need no
			// second round trip.
			if blockRcpts, err = n.blockReceipts(ctx, n.lastBlock+1, uint64(head)); errors.Is(err, errNoBlockReceipts) {
				e.log.Info("the node does not serve eth_getBlockReceipts; reading blocks, then receipts", "network", n.id.ID, "err", err)
				n.noBlockReceipts = true
			}
		}
		if n.noBlockReceipts {
			candidates, err = n.blockTxs(ctx, n.lastBlock+1, uint64(head))
		} else if err == nil {
			candidates = make(map[common.Hash]bool, len(blockRcpts))
			for h := range blockRcpts {
				candidates[h] = true
			}
		}
		if err != nil {
			// The announced head may be gone (a reorganisation to a shorter chain): ask the node next time.
			n.headHint.Store(0)
			e.log.Warn("reading new blocks", "network", n.id.ID, "err", err)
			return
		}
	default:
		candidates = map[common.Hash]bool{}
	}

	// Receipts: our transactions in the new blocks, and mined settlements due for finality (their
	// receipt is read again to be sure the block is still canonical).
	type slot struct {
		f    *flight
		rcpt **types.Receipt
	}
	var slots []slot
	var elems []rpc.BatchElem
	known := map[*flight]*types.Receipt{} // from the new blocks' receipts
	ask := func(f *flight, h common.Hash) {
		r := new(*types.Receipt)
		slots = append(slots, slot{f, r})
		elems = append(elems, rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{h}, Result: r})
	}
	for _, f := range flights {
		v := f.view()
		if v.resolving {
			continue // the previous round's outcome is being written
		}
		if v.state.Succeeded() {
			if candidates == nil || uint64(head)+1 >= v.block+n.depth {
				ask(f, v.hash)
			}
			continue
		}
		for _, h := range f.hashes() {
			if r := blockRcpts[h]; r != nil {
				known[f] = r
			} else if candidates == nil || candidates[h] {
				ask(f, h)
			}
		}
	}
	receipts := known
	asked := map[*flight]bool{}
	if len(elems) > 0 {
		if err := n.batch(ctx, elems); err != nil {
			e.log.Warn("polling receipts", "network", n.id.ID, "err", err)
			return
		}
		for i, s := range slots {
			asked[s.f] = true
			if elems[i].Error == nil && *s.rcpt != nil {
				receipts[s.f] = *s.rcpt
			}
		}
	}
	n.lastBlock = uint64(head)

	var resend []*flight
	var outcomes []outcome
	var finals []*flight
	for _, f := range flights {
		v := f.view()
		if v.resolving {
			continue
		}
		rcpt := receipts[f]
		switch {
		case v.state.Succeeded():
			if asked[f] && n.confirm(ctx, f, rcpt, uint64(head)) {
				finals = append(finals, f)
			}
		case rcpt != nil:
			if res, ok := n.outcome(ctx, f, rcpt); ok {
				outcomes = append(outcomes, outcome{f, res})
			}
		default:
			if f.takeNonceLow() {
				// A node called the nonce too low and no receipt of ours is in: a transaction
				// that is not ours may hold the nonce (foreign.go).
				if res, resolved, handled := n.foreignNonce(ctx, f); resolved {
					outcomes = append(outcomes, outcome{f, res})
					continue
				} else if handled {
					continue
				}
			}
			if n.needsSend(ctx, f) {
				resend = append(resend, f)
			}
		}
	}
	n.recordAsync(ctx, outcomes)
	n.finalize(ctx, finals)
	if len(resend) > 0 {
		n.send(ctx, resend)
	}
}

type outcome struct {
	f   *flight
	res Resolution
}

// recordAsync records a round's outcomes while the next round reads the chain: the ledger write
// (a commit) and the next receipts overlap, so a receipt does not wait for the previous round's
// write to be noticed. Writes stay one at a time, in round order; the flights being written are
// marked resolving, and rounds leave them alone until the write is done.
func (n *network) recordAsync(ctx context.Context, outcomes []outcome) {
	if len(outcomes) == 0 {
		return
	}
	for _, o := range outcomes {
		o.f.setResolving(true)
	}
	n.recording.Wait()
	n.recording.Add(1)
	n.engine.wg.Add(1)
	go func() {
		defer n.engine.wg.Done()
		defer n.recording.Done()
		n.record(ctx, outcomes)
	}()
}

// record writes a round's outcomes to the ledger in one statement, then tells the waiters. If the
// write fails nothing is told: the next round finds the same receipts and tries again.
func (n *network) record(ctx context.Context, outcomes []outcome) {
	if len(outcomes) == 0 {
		return
	}
	e := n.engine
	e.fault(FaultAfterReceipt)
	res := make([]Resolution, len(outcomes))
	for i, o := range outcomes {
		res[i] = o.res
	}
	if err := e.store.Resolve(ctx, res); err != nil {
		e.log.Warn("recording outcomes; will retry", "network", n.id.ID, "count", len(res), "err", err)
		for _, o := range outcomes {
			o.f.setResolving(false)
		}
		// The receipts' blocks are behind the watcher now: sweep them all again next round.
		n.resweep.Store(true)
		return
	}
	for _, o := range outcomes {
		f, r := o.f, o.res
		f.update(func(f *flight) {
			f.resolving = false
			f.state, f.minedHash, f.block, f.blockHash = r.State, r.TxHash, r.BlockNumber, r.BlockHash
			f.reason, f.message = r.ErrorReason, r.ErrorMessage
		})
		f.count(false)
		e.log.Info("settlement resolved", f.logAttrs("state", r.State, "tx", r.TxHash, "block", r.BlockNumber, "reason", r.ErrorReason)...)
		if !r.State.Succeeded() {
			e.untrack(f)
		}
	}
}

// finalize marks a round's settlements final in one statement.
func (n *network) finalize(ctx context.Context, finals []*flight) {
	if len(finals) == 0 {
		return
	}
	e := n.engine
	ids := make([]int64, len(finals))
	for i, f := range finals {
		ids[i] = f.id
	}
	if err := e.store.MarkFinal(ctx, ids); err != nil {
		e.log.Warn("marking settlements final; will retry", "network", n.id.ID, "err", err)
		return
	}
	for _, f := range finals {
		f.update(func(f *flight) { f.state = facilitator.StateFinal })
		e.untrack(f)
	}
}

const (
	// maxBlockGap is the most blocks a round reads one by one; past it, a full sweep is cheaper.
	maxBlockGap = 32
	// fullSweepEvery bounds how long a receipt can go unnoticed if a block read was missed.
	fullSweepEvery = 10 * time.Second
)

// errNoBlockReceipts: the node answered eth_getBlockReceipts with an error (it may not serve it).
var errNoBlockReceipts = errors.New("eth_getBlockReceipts refused")

// blockReceipts returns the receipts of every transaction in blocks from..to, by hash.
func (n *network) blockReceipts(ctx context.Context, from, to uint64) (map[common.Hash]*types.Receipt, error) {
	blocks := make([][]*types.Receipt, to-from+1)
	elems := make([]rpc.BatchElem, len(blocks))
	for i := range blocks {
		elems[i] = rpc.BatchElem{Method: "eth_getBlockReceipts", Args: []any{hexutil.EncodeUint64(from + uint64(i))}, Result: &blocks[i]}
	}
	if err := n.batch(ctx, elems); err != nil {
		return nil, err
	}
	out := map[common.Hash]*types.Receipt{}
	for i, rs := range blocks {
		if elems[i].Error != nil {
			return nil, fmt.Errorf("%w: %w", errNoBlockReceipts, elems[i].Error)
		}
		if rs == nil {
			// A block the node does not have (yet, or no longer): read it again next round.
			return nil, fmt.Errorf("no receipts for block %d", from+uint64(i))
		}
		for _, r := range rs {
			if r != nil {
				out[r.TxHash] = r
			}
		}
	}
	return out, nil
}

// blockTxs returns the hashes of the transactions in blocks from..to.
func (n *network) blockTxs(ctx context.Context, from, to uint64) (map[common.Hash]bool, error) {
	blocks := make([]struct {
		Txs []common.Hash `json:"transactions"`
	}, to-from+1)
	elems := make([]rpc.BatchElem, len(blocks))
	for i := range blocks {
		elems[i] = rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{hexutil.EncodeUint64(from + uint64(i)), false}, Result: &blocks[i]}
	}
	if err := n.batch(ctx, elems); err != nil {
		return nil, err
	}
	out := map[common.Hash]bool{}
	for i, b := range blocks {
		if elems[i].Error != nil {
			return nil, elems[i].Error
		}
		for _, h := range b.Txs {
			out[h] = true
		}
	}
	return out, nil
}

func (n *network) call(ctx context.Context, result any, method string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, n.engine.cfg.RPCTimeout)
	defer cancel()
	return n.chain.CallContext(ctx, result, method, args...)
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

// confirm reports whether a mined settlement has reached the network's depth; when its receipt is
// gone (its block was reorganised away) it moves it back to broadcast, to be mined again.
func (n *network) confirm(ctx context.Context, f *flight, rcpt *types.Receipt, head uint64) bool {
	e := n.engine
	if rcpt == nil {
		if err := e.store.Reopen(ctx, f.id, "receipt disappeared: reorganised"); err != nil {
			e.log.Warn("reopening a reorganised settlement", f.logAttrs("err", err)...)
			return false
		}
		e.log.Warn("settlement's block was reorganised away; watching again", f.logAttrs()...)
		f.update(func(f *flight) {
			f.state, f.minedHash, f.block = facilitator.StateBroadcast, common.Hash{}, 0
		})
		f.count(true)
		return false
	}
	return head+1 >= rcpt.BlockNumber.Uint64()+n.depth
}

// outcome classifies a receipt of f's; ok is false when the chain could not explain it this round.
func (n *network) outcome(ctx context.Context, f *flight, rcpt *types.Receipt) (Resolution, bool) {
	res, err := ReceiptOutcome(ctx, n.batch, Expected{ID: f.id, Key: f.key, PayTo: f.payTo, Value: f.value, ValidBefore: f.validBefore}, rcpt)
	if err != nil {
		n.engine.log.Warn("explaining a revert; will retry", f.logAttrs("tx", rcpt.TxHash, "err", err)...)
		return Resolution{}, false
	}
	return res, true
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
			e.log.Warn("fee bump failed; resending the current transaction", f.logAttrs("tx", t.hash, "err", err)...)
		}
		return true
	case sentAt.IsZero():
		if tried.IsZero() {
			// Still in the broadcaster's queue: it is the broadcaster's to send first.
			tried = signedAt
		}
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
		e.log.Warn("fee bump would exceed the fee cap limit; keeping the current fees", f.logAttrs("tx", old.hash, "fee_cap", fees.FeeCap)...)
		return nil
	}
	s := f.sender
	l := s.held()
	if l == nil || f.isDropped() {
		return errNotLeased // the key's holder bumps it
	}
	to := f.key.Asset
	tx, err := types.SignNewTx(s.key, s.signer, &types.DynamicFeeTx{
		ChainID: new(big.Int).SetUint64(n.id.ChainID), Nonce: f.txNonce(),
		GasTipCap: fees.TipCap, GasFeeCap: fees.FeeCap, Gas: f.gas, To: &to, Data: f.data,
	})
	if err != nil {
		return err
	}
	raw, err := tx.MarshalBinary()
	if err != nil {
		return err
	}
	// Through the lease: a process that lost the key cannot add a variant its next holder would
	// not know of.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
	err = l.AddTx(wctx, f.id, TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: f.gas})
	cancel()
	if err != nil {
		return err
	}
	f.update(func(f *flight) {
		f.txs = append(f.txs, &sentTx{hash: tx.Hash(), raw: raw, fees: fees, signedAt: e.now()})
	})
	e.log.Info("fee bump", f.logAttrs("tx_nonce", f.txNonce(), "tx", tx.Hash(), "replaces", old.hash, "tip", fees.TipCap, "fee_cap", fees.FeeCap)...)
	e.cfg.Observer.FeeBumped(n.id.ID)
	return nil
}
