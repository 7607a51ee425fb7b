package settle

import (
	"context"
	"fmt"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// What happens after a crash: nothing of a settlement is in memory, and the ledger holds every
// row and signed transaction (invariant 2). Whoever takes a key's lease (Start, or a take-over:
// lease.go's takeKey) runs recoverLocked for it: the key's next nonce is loaded afresh, every
// settlement the ledger holds between signed and final is tracked again, those not mined handed
// to the broadcaster to be resent (harmless if the chain has them), and the watcher goes on
// from there. Failed
// settlements whose nonces the chain has not used are resent too, so that the key never waits
// behind a gap.

// recoverLocked loads the key's next nonce and resumes its open settlements. Caller holds s.mu
// and the key's lease.
func (e *Engine) recoverLocked(ctx context.Context, s *sender) error {
	if err := s.load(ctx); err != nil {
		return fmt.Errorf("settle: %s signer %s: %w", s.net.net.ID, s.addr, err)
	}
	open, err := e.store.OpenSettlements(ctx, s.net.net.ID, s.addr)
	if err != nil {
		return fmt.Errorf("settle: loading open settlements: %w", err)
	}
	var flights []*flight
	for _, o := range open {
		if len(o.Txs) == 0 {
			continue
		}
		f, err := recovered(s, &o)
		if err != nil {
			return err
		}
		if o.State.Succeeded() {
			f.minedHash, f.block, f.blockHash = o.TxHash, o.BlockNumber, o.BlockHash
		}
		flights = append(flights, f)
	}
	closed, err := e.closedFlights(ctx, s)
	if err != nil {
		return err
	}
	// A batch's members are one family again before any of them is worked (the ledger's
	// members of one batch share the signer's tx nonce).
	linkFamilies(append(append([]*flight(nil), flights...), closed...))
	for _, f := range flights {
		e.track(f)
		if st := f.view().state; st.Open() {
			f.count(true)
			s.enqueue(f) // the chain may never have seen it: resending is harmless if it has
		}
	}
	if len(open) > 0 {
		e.log.Info("resumed open settlements", "network", s.net.net.ID, "signer", s.addr, "count", len(open), "next_nonce", s.next)
	}
	for _, f := range closed {
		e.track(f)
		s.enqueue(f)
	}
	if len(closed) > 0 {
		e.log.Warn("resending failed settlements whose tx nonces are unused, to fill the gaps", "network", s.net.net.ID, "signer", s.addr, "count", len(closed), "from_nonce", s.mined)
	}
	return nil
}

// recovered is the flight of a ledger row of s's, with every transaction it signed.
func recovered(s *sender, o *facilitator.OpenSettlement) (*flight, error) {
	f := newFlight(o.ID, o.State)
	f.key, f.fingerprint, f.payTo, f.value, f.validBefore = o.Key, o.Fingerprint, o.PayTo, o.Value, o.ValidBefore
	f.sender, f.nonce = s, o.TxNonce
	for _, t := range o.Txs {
		f.txs = append(f.txs, &sentTx{hash: t.Hash, raw: t.Raw, fees: Fees{TipCap: t.TipCap, FeeCap: t.FeeCap}, signedAt: o.CreatedAt})
	}
	// Each variant's nonce, and gas and calldata for fee bumps from the last signed transaction.
	if err := f.restoreTemplate(); err != nil {
		return nil, fmt.Errorf("settle: settlement %d: %w", o.ID, err)
	}
	return f, nil
}

// closedFlights are the flights that resume filling the nonces of failed settlements that the chain has not used yet
// (the process that resolved them stopped, or a job resolved them while their transaction was
// lost): their transactions, which can only revert now, are resent until the nonce is used, or
// every later transaction of the key waits behind the gap. Caller holds s.mu, after s.load (which
// read the key's mined nonce).
func (e *Engine) closedFlights(ctx context.Context, s *sender) ([]*flight, error) {
	closed, err := e.store.ClosedFrom(ctx, s.net.net.ID, s.addr, s.mined)
	if err != nil {
		return nil, fmt.Errorf("settle: loading closed settlements: %w", err)
	}
	var out []*flight
	for _, o := range closed {
		if len(o.Txs) == 0 || e.flight(o.ID) != nil {
			continue
		}
		f, err := recovered(s, &o)
		if err != nil {
			return nil, err
		}
		f.closing, f.reason, f.message = true, o.ErrorReason, o.ErrorMessage
		out = append(out, f)
	}
	return out, nil
}

// linkFamilies makes the batched flights at each tx nonce one family.
func linkFamilies(flights []*flight) {
	byNonce := map[uint64][]*flight{}
	var nonces []uint64
	for _, f := range flights {
		if f.to != multicall3.Address {
			continue // a lone settlement (or a batch's member settled again alone)
		}
		if _, ok := byNonce[f.nonce]; !ok {
			nonces = append(nonces, f.nonce)
		}
		byNonce[f.nonce] = append(byNonce[f.nonce], f)
	}
	for _, n := range nonces {
		linkFamily(byNonce[n])
	}
}
