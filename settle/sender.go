package settle

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"sync/atomic"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// sender owns one signer key on one network: it is the only allocator of that key's nonces
// (DESIGN invariant 7), and it broadcasts that key's transactions in nonce order, in batches.
type sender struct {
	net    *network
	key    *ecdsa.PrivateKey
	addr   common.Address
	signer types.Signer

	// mu makes "take the next nonce, sign, commit the row" one step, so a nonce is used only by a
	// committed row and given back (not incremented) when the commit fails.
	mu     sync.Mutex
	next   uint64
	loaded bool

	inFlight atomic.Int64 // flights not yet mined or failed
	// balance is the native balance at the last read (nil before); low: it is below the minimum,
	// so the key takes no new settlement (balance.go).
	balance atomic.Pointer[big.Int]
	low     atomic.Bool
	queue   chan *flight // to the broadcaster, in nonce order

	// lease is this process's hold on the key; nil while another process holds it. Set and
	// cleared under mu, so a commit never straddles a change of holder.
	lease atomic.Pointer[leaseBox]
}

func newSender(n *network, key *ecdsa.PrivateKey, queueSize int) *sender {
	return &sender{
		net:    n,
		key:    key,
		addr:   crypto.PubkeyToAddress(key.PublicKey),
		signer: types.LatestSignerForChainID(new(big.Int).SetUint64(n.id.ChainID)),
		queue:  make(chan *flight, queueSize),
	}
}

// load derives the next nonce from the chain's pending nonce and the ledger: the ledger may hold
// signed transactions the chain has not seen (a crash between commit and broadcast), and the pool
// may hold ours that are not mined yet. Caller holds mu.
func (s *sender) load(ctx context.Context) error {
	e := s.net.engine
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	defer cancel()
	var pending hexutil.Uint64
	if err := s.net.chain.CallContext(ctx, &pending, "eth_getTransactionCount", s.addr, "pending"); err != nil {
		return facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "could not read the signer's nonce; nothing was sent, retry", err)
	}
	maxLedger, ok, err := e.store.MaxTxNonce(ctx, s.net.id.ID, s.addr)
	if err != nil {
		return ledgerDown(err)
	}
	next := uint64(pending)
	if ok && maxLedger+1 > next {
		next = maxLedger + 1
	}
	if s.loaded && next != s.next {
		e.log.Warn("signer nonce resynchronised", "network", s.net.id.ID, "signer", s.addr, "was", s.next, "now", next)
		e.cfg.Observer.NonceGap(s.net.id.ID, s.addr.Hex(), NonceResync)
	}
	s.next, s.loaded = next, true
	return nil
}

// submit signs the settlement's transaction with the next nonce, commits it to the ledger, and
// hands it to the broadcaster. Nothing leaves the process before the commit.
func (s *sender) submit(ctx context.Context, row *NewSettlement, to common.Address, data []byte, gas uint64) (*flight, error) {
	e := s.net.engine
	fees, err := s.net.fees(ctx)
	if err != nil {
		return nil, err
	}
	gasLimit := gas + gas/4 // the estimate is exact only for the state it ran on
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; ; attempt++ {
		l := s.held()
		if l == nil {
			return nil, errNotLeased
		}
		if !s.loaded {
			if err := s.load(ctx); err != nil {
				return nil, err
			}
		}
		nonce := s.next
		tx, err := types.SignNewTx(s.key, s.signer, &types.DynamicFeeTx{
			ChainID:   new(big.Int).SetUint64(s.net.id.ChainID),
			Nonce:     nonce,
			GasTipCap: fees.TipCap,
			GasFeeCap: fees.FeeCap,
			Gas:       gasLimit,
			To:        &to,
			Data:      data,
		})
		if err != nil {
			return nil, fmt.Errorf("settle: signing: %w", err)
		}
		raw, err := tx.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("settle: encoding: %w", err)
		}
		row.Signer, row.TxNonce = s.addr, nonce
		row.Tx = TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: gasLimit}
		row.GasReserved = new(big.Int).Mul(new(big.Int).SetUint64(gasLimit), fees.FeeCap)
		e.fault(FaultBeforeCommit)
		// The commit goes through the key's lease: it fails if this process no longer holds the key.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
		id, err := l.InsertSettlement(wctx, row)
		cancel()
		if errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3 {
			// Our view of the key is stale (a commit whose answer was lost, another process on the
			// key): re-derive it and take the next free nonce.
			e.cfg.Observer.NonceGap(s.net.id.ID, s.addr.Hex(), NonceTaken)
			s.loaded = false
			continue
		}
		if err != nil {
			if errors.Is(err, facilitator.ErrDuplicate) || errors.Is(err, facilitator.ErrNonceTaken) || errors.Is(err, facilitator.ErrPaymentIDTaken) {
				return nil, err
			}
			if facilitator.ErrorCode(err) == facilitator.ELimited {
				// A limit refused the row: nothing was written, and the nonce is not taken (s.next
				// stays), so the signed transaction is simply dropped.
				return nil, err
			}
			return nil, ledgerDown(err)
		}
		s.next++
		e.fault(FaultAfterCommit)

		f := newFlight(id, facilitator.StateSigned)
		f.key, f.fingerprint, f.payTo, f.value, f.validBefore = row.Key, row.Fingerprint, row.PayTo, row.Value, row.ValidBefore
		f.sender, f.nonce, f.gas, f.data = s, nonce, gasLimit, data
		if row.PaymentID != nil {
			f.paymentID = row.PaymentID.ID
		}
		f.txs = []*sentTx{{hash: tx.Hash(), raw: raw, fees: fees, signedAt: e.now()}}
		f.count(true)
		e.track(f)
		s.enqueue(f)
		return f, nil
	}
}

// enqueue hands f to the broadcaster. The queue is sized to the in-flight limit, so this only
// blocks when recovery hands over more than a queue's worth at once.
func (s *sender) enqueue(f *flight) {
	select {
	case s.queue <- f:
	default:
		go func() { s.queue <- f }()
	}
}

// broadcastLoop sends queued transactions in JSON-RPC batches: a burst of settlements reaches the
// node in one request instead of one each, and in nonce order.
func (s *sender) broadcastLoop(ctx context.Context) {
	const maxBatch = 100
	for {
		var batch []*flight
		select {
		case f := <-s.queue:
			batch = append(batch, f)
		case <-ctx.Done():
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case f := <-s.queue:
				batch = append(batch, f)
			default:
				break drain
			}
		}
		s.send(ctx, batch)
	}
}

// send broadcasts the latest variant of each flight and records which the node took.
func (s *sender) send(ctx context.Context, flights []*flight) {
	e := s.net.engine
	elems := make([]rpc.BatchElem, 0, len(flights))
	txs := make([]*sentTx, 0, len(flights))
	var sendable []*flight
	if s.held() == nil {
		return // the key's holder sends them
	}
	for _, f := range flights {
		t := f.latest()
		if v := f.view(); t == nil || !v.state.Open() || v.dropped {
			continue
		}
		sendable = append(sendable, f)
		txs = append(txs, t)
		elems = append(elems, rpc.BatchElem{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes(t.raw)}, Result: new(common.Hash)})
	}
	if len(elems) == 0 {
		return
	}
	now := e.now()
	cctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	err := s.net.chain.BatchCallContext(cctx, elems)
	cancel()
	if err != nil {
		// The node may or may not have them: the watcher resends after RetryInterval.
		e.log.Warn("broadcast failed; will resend", "network", s.net.id.ID, "signer", s.addr, "txs", len(elems), "err", err)
		for i, f := range sendable {
			f.mu.Lock()
			txs[i].tried = now
			f.mu.Unlock()
		}
		return
	}
	var accepted []int64
	for i, f := range sendable {
		res := classifySend(elems[i].Error)
		f.mu.Lock()
		txs[i].tried = now
		if res == sentOK {
			txs[i].sentAt = now
		}
		f.mu.Unlock()
		switch res {
		case sentOK:
			accepted = append(accepted, f.id)
		case sendUnderpriced:
			s.net.wantBump(f)
		case sendNonceUsed:
			// Possibly our own earlier variant, mined: the watcher checks receipts and the authorization.
			e.log.Info("node says nonce used; watching receipts", f.logAttrs("tx_nonce", f.nonce, "signer", s.addr, "tx", txs[i].hash)...)
			e.cfg.Observer.NonceGap(s.net.id.ID, s.addr.Hex(), NonceUsed)
		case sendNoFunds:
			e.log.Error("signer cannot pay for gas: fund it", f.logAttrs("network", s.net.id.ID, "signer", s.addr, "tx", txs[i].hash, "err", elems[i].Error)...)
		default:
			e.log.Warn("node refused transaction; will resend", f.logAttrs("tx", txs[i].hash, "err", elems[i].Error)...)
		}
	}
	if len(accepted) == 0 {
		return
	}
	e.fault(FaultAfterBroadcast)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RPCTimeout)
	defer cancel()
	if err := e.store.MarkBroadcast(sctx, accepted); err != nil {
		// Only bookkeeping: recovery treats signed and broadcast alike.
		e.log.Warn("recording broadcasts", "err", err)
	}
	for _, f := range sendable {
		f.update(func(f *flight) {
			if f.state == facilitator.StateSigned && f.txs[len(f.txs)-1].sentAt.Equal(now) {
				f.state = facilitator.StateBroadcast
			}
		})
	}
}

func ledgerDown(err error) error {
	return facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "the settlement ledger is unavailable; nothing was sent, retry", err)
}
