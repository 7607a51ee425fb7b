package settle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// Adoption: the ledger can lose its newest commits (a failover to an asynchronous standby, a
// restore from a backup) while the chain keeps the transactions they recorded. A transaction is
// ours when the ledger holds it or when one of the network's signer keys signed it; the second
// survives the loss. Such a transaction the ledger lacks is recorded again (Store.
// AdoptSettlements) as the settlement of every authorization it used, so that nothing is
// transferred twice, no caller is told a failure for a payment that moved, and a retry gets the
// success with the transaction's hash.

// adoptedMembers are the authorizations tx carries as transferWithAuthorization calls, each at its
// place: the transaction's own call (slot 0), or each call of a Multicall3 batch.
func adoptedMembers(tx *types.Transaction, network string) []facilitator.AdoptedMember {
	if tx.To() == nil {
		return nil
	}
	type call struct {
		target common.Address
		data   []byte
	}
	calls := []call{{*tx.To(), tx.Data()}}
	if *tx.To() == multicall3.Address {
		batch, ok := multicall3.DecodeAggregate3Calldata(tx.Data())
		if !ok {
			return nil
		}
		calls = calls[:0]
		for _, c := range batch {
			calls = append(calls, call{c.Target, c.CallData})
		}
	}
	var out []facilitator.AdoptedMember
	for slot, c := range calls {
		d, ok := eip3009.DecodeCall(c.data)
		if !ok || d.Method != eip3009.MethodTransferWithAuthorization {
			continue
		}
		a := d.Authorization
		out = append(out, facilitator.AdoptedMember{
			Key:  facilitator.AuthorizationKey{Network: network, Asset: c.target, Payer: a.From, Nonce: a.Nonce},
			Slot: slot, PayTo: a.To, Value: a.Value, ValidAfter: a.ValidAfter, ValidBefore: a.ValidBefore,
		})
	}
	return out
}

// txRecord is tx as the ledger records a variant.
func txRecord(tx *types.Transaction) (facilitator.TxRecord, error) {
	raw, err := tx.MarshalBinary()
	if err != nil {
		return facilitator.TxRecord{}, err
	}
	return facilitator.TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: tx.GasTipCap(), FeeCap: tx.GasFeeCap(), Gas: tx.Gas()}, nil
}

// AdoptionOf reads the transaction hash and, when one of the network's signer keys (ours) signed
// it, the adoption of what it did: every authorization it carries whose transfer it made, judged
// as the reconcile job judges an open settlement (Judge: its receipt, confirmed on a quorum of
// endpoints where there are several). ours is false when another key signed it. A nil adoption
// with ours true: the chain does not show it mined yet (or the reads disagree): nothing is
// decided. An error: the transaction could not be read, so whose it is is not known.
func AdoptionOf(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	fin facilitator.Finality, network string, isOurs func(common.Address) bool, told func(uint64), hash common.Hash, now time.Time) (a *facilitator.Adoption, ours bool, err error) {
	tx, from, err := ethrpc.SignedTx(ctx, chain, hash)
	if err != nil {
		return nil, false, err
	}
	if !isOurs(from) {
		return nil, false, nil
	}
	rec, err := txRecord(tx)
	if err != nil {
		return nil, true, err
	}
	out := &facilitator.Adoption{Network: network, Signer: from, TxNonce: tx.Nonce(), Tx: rec}
	for _, m := range adoptedMembers(tx, network) {
		s := &facilitator.OpenSettlement{
			Settlement: facilitator.Settlement{Key: m.Key, PayTo: m.PayTo, Value: m.Value, ValidBefore: m.ValidBefore, Signer: from,
				TxNonce: tx.Nonce(), BatchSlot: m.Slot, State: facilitator.StateBroadcast, CreatedAt: now},
			Txs: []facilitator.TxRecord{rec},
		}
		res, ok, err := Judge(ctx, chain, batchOn, s, fin, isOurs, told, now)
		if err != nil {
			return nil, true, err
		}
		if !ok || !res.State.Succeeded() || res.TxHash != hash || res.ErrorReason != "" {
			continue // not (yet) shown transferred by it: a batch's call that failed, or not mined
		}
		out.BlockNumber, out.BlockHash = res.BlockNumber, res.BlockHash
		out.Members = append(out.Members, m)
	}
	if len(out.Members) == 0 {
		return nil, true, nil
	}
	return out, true, nil
}

// adopted logs and counts an adoption the ledger recorded.
func adopted(log interface{ Warn(string, ...any) }, obs Observer, a *facilitator.Adoption, by string) {
	for _, m := range a.Members {
		log.Warn("adopted a transaction of our key the ledger lacked", "network", a.Network, "signer", a.Signer, "tx", a.Tx.Hash,
			"tx_nonce", a.TxNonce, "block", a.BlockNumber, "payer", m.Key.Payer, "nonce", hexutil.Encode(m.Key.Nonce[:]), "by", by)
	}
	obs.Adopted(a.Network, a.Signer.Hex())
}

// adoptUsed answers a payment whose authorization the chain shows used and the ledger has no
// row for: when a transaction of one of our keys used it (the ledger lost its row), that
// transaction is adopted and the payment follows it (its success goes to the first caller with
// the settlement's key, as any other's). ok is false when another key's transaction used it (or
// none is found): the caller answers as before.
func (e *Engine) adoptUsed(ctx, waitCtx context.Context, n *chainEngine, p *facilitator.Payment, key facilitator.AuthorizationKey, fp facilitator.Fingerprint) (out facilitator.SettleOutcome, ok bool, err error) {
	hash, found, err := n.findUse(waitCtx, key)
	if err != nil {
		return facilitator.SettleOutcome{}, true, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError,
			"the authorization is used and who used it could not be read; retry", err)
	}
	if !found {
		return facilitator.SettleOutcome{}, false, nil
	}
	a, ours, err := AdoptionOf(waitCtx, n.chain, n.batchOn, n.net.Finality, n.net.ID, n.isSigner, n.saw, hash, e.now())
	switch {
	case err != nil:
		return facilitator.SettleOutcome{}, true, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError,
			"the authorization is used and the transaction that used it could not be read; retry", err)
	case !ours:
		return facilitator.SettleOutcome{}, false, nil
	case a == nil || !a.Has(key):
		// Ours, and not shown mined yet (or not for this authorization): never a failure.
		return fail(p, facilitator.ReasonSettlementPending,
			"a transaction of this facilitator used the authorization; send the same payload again for its outcome (do not sign a new authorization)", hash), true, nil
	}
	for i := range a.Members {
		if m := &a.Members[i]; m.Key == key {
			row := newRow(p, key, fp, e.cfg.Limits)
			m.Fingerprint, m.KeyID, m.X402Version, m.Request, m.PaymentID = fp, p.KeyID, p.X402Version, row.Request, row.PaymentID
		}
	}
	ids, fresh, err := e.store.AdoptSettlements(waitCtx, *a)
	switch {
	case err == nil:
		if fresh {
			adopted(e.log, e.cfg.Observer, a, "settle")
		}
		n.trackAdopted(a, ids)
	case errors.Is(err, facilitator.ErrDuplicate), errors.Is(err, facilitator.ErrNonceTaken):
		// Adopted (or settled) meanwhile, or the ledger holds another settlement at its nonce:
		// the row, if any, answers.
		e.log.Warn("a transaction of our key the ledger lacked could not be adopted", "network", a.Network, "signer", a.Signer,
			"tx", a.Tx.Hash, "tx_nonce", a.TxNonce, "err", err)
	default:
		return facilitator.SettleOutcome{}, true, ledgerDown(err)
	}
	s, err := e.store.SettlementByKey(waitCtx, key)
	if err != nil {
		if errors.Is(err, facilitator.ErrNotFound) {
			return fail(p, facilitator.ReasonSettlementPending,
				"a transaction of this facilitator used the authorization and the ledger could not record it yet; send the same payload again", hash), true, nil
		}
		return facilitator.SettleOutcome{}, true, ledgerDown(err)
	}
	out, err = e.follow(ctx, waitCtx, p, fp, s)
	return out, true, err
}

// trackAdopted watches the rows an adoption recorded (ids, in the order of a's members) when
// this process holds their key: the watcher takes them to final, or back should a
// reorganisation take their block away, as it does the rows recovery resumes. A key held
// elsewhere is its holder's (and the reconcile job's).
func (n *chainEngine) trackAdopted(a *facilitator.Adoption, ids []int64) {
	var s *sender
	for _, x := range n.senders {
		if x.addr == a.Signer && x.held() != nil {
			s = x
		}
	}
	if s == nil || len(ids) != len(a.Members) {
		return
	}
	e := n.engine
	var flights []*flight
	for i, m := range a.Members {
		if e.flight(ids[i]) != nil {
			continue // already watched
		}
		row := facilitator.Settlement{ID: ids[i], Key: m.Key, Fingerprint: m.Fingerprint, PayTo: m.PayTo, Value: m.Value, ValidBefore: m.ValidBefore,
			Signer: a.Signer, TxNonce: a.TxNonce, BatchSlot: m.Slot, State: facilitator.StateMined, CreatedAt: e.now()}
		f, err := recovered(s, &facilitator.OpenSettlement{Settlement: row, Txs: []facilitator.TxRecord{a.Tx}})
		if err != nil {
			continue
		}
		f.minedHash, f.block, f.blockHash = a.Tx.Hash, a.BlockNumber, a.BlockHash
		flights = append(flights, f)
	}
	linkFamilies(flights)
	for _, f := range flights {
		e.track(f)
	}
}

// watchAdopted watches an adopted row, mined, that this process holds the key of and does not
// watch yet: its adoption's write answered an error though it committed, or the reconcile job
// adopted it. Read back from the ledger with its transactions, as recovery reads a row.
func (e *Engine) watchAdopted(ctx context.Context, row *facilitator.Settlement) {
	if !row.Adopted || row.State != facilitator.StateMined || e.flight(row.ID) != nil {
		return
	}
	n := e.networks[row.Key.Network]
	if n == nil {
		return
	}
	for _, s := range n.senders {
		if s.addr != row.Signer || s.held() == nil {
			continue
		}
		open, err := e.store.OpenSettlements(ctx, n.net.ID, s.addr)
		if err != nil {
			return // the reconcile job finalizes it, or a later request watches it
		}
		for _, o := range open {
			if o.ID != row.ID || len(o.Txs) == 0 || !o.State.Succeeded() {
				continue
			}
			f, err := recovered(s, &o)
			if err != nil {
				return
			}
			f.minedHash, f.block, f.blockHash = o.TxHash, o.BlockNumber, o.BlockHash
			e.track(f)
		}
	}
}

// findUse finds the transaction that used the authorization of key (its AuthorizationUsed log)
// within logLookback blocks of the head. One node's word names it only: whose it is and whether
// it transferred are read from the transaction itself and judged (AdoptionOf).
func (n *chainEngine) findUse(ctx context.Context, key facilitator.AuthorizationKey) (common.Hash, bool, error) {
	var head hexutil.Uint64
	if err := n.one(ctx, ethrpc.BlockNumber(&head)); err != nil {
		return common.Hash{}, false, err
	}
	// Counted as every answer's head is: a fee bump must never rest on reads behind it (the
	// simulator's seed 20423: this read told of the block that mined a nonce a bump then replaced).
	n.saw(uint64(head))
	from := uint64(0)
	if uint64(head) > logLookback {
		from = uint64(head) - logLookback
	}
	var logs []types.Log
	filter := map[string]any{
		"address":   key.Asset,
		"fromBlock": hexutil.EncodeUint64(from),
		"toBlock":   hexutil.EncodeUint64(uint64(head)),
		"topics":    eip3009.AuthorizationTopics(key.Payer, key.Nonce),
	}
	if err := n.one(ctx, ethrpc.Logs(filter, &logs)); err != nil {
		return common.Hash{}, false, err
	}
	for i := len(logs) - 1; i >= 0; i-- {
		l := logs[i]
		if !l.Removed && len(l.Topics) > 0 && l.Topics[0] != eip3009.AuthorizationCanceledTopic {
			return l.TxHash, true, nil
		}
	}
	return common.Hash{}, false, nil
}

// adoptVariant carries out actAdopt: the transaction of our key that used f's authorization,
// none of f's variants (the ledger lost the one that mined), is recorded as f's, mined, and f
// follows the ledger. A failure is tried again next round. Where another settlement holds the
// transaction's place, f is resolved where it is only once its own nonce is used in a final
// block (read twice): before that, waits reports that the adoption waits, and f stays open, its
// own transaction still going out, until that nonce is used or the other settlement moves on
// (resolved at a nonce nothing uses, f would hold a gap nothing fills).
func (n *chainEngine) adoptVariant(ctx context.Context, f *flight, d decision) (waits bool) {
	e := n.engine
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RPCTimeout)
	defer cancel()
	a, err := n.variantAdoption(rctx, f, d.res)
	fresh := false
	if err == nil {
		_, fresh, err = e.store.AdoptSettlements(rctx, *a)
	}
	if errors.Is(err, facilitator.ErrNonceTaken) {
		if used, rerr := n.nonceUsedFinal(rctx, f.sender.addr, f.txNonce()); rerr != nil || !used {
			e.log.Debug("adopting a transaction of our key the ledger lacked waits: another settlement holds its nonce, and this one's own nonce is not used in a final block yet",
				f.logAttrs("tx", d.res.TxHash, "tx_nonce", f.txNonce(), "err", rerr)...)
			return true
		}
		a.MayStay = true
		_, fresh, err = e.store.AdoptSettlements(rctx, *a)
	}
	if errors.Is(err, facilitator.ErrDuplicate) {
		// Resolved otherwise by another writer meanwhile (mined by another transaction, or
		// failed): the flight follows the ledger, as for any move it did not make, instead of
		// deciding the same adoption every round.
		e.log.Warn("a transaction of our key the ledger lacked could not be adopted: the settlement is resolved otherwise; following the ledger",
			f.logAttrs("tx", d.res.TxHash, "err", err)...)
		n.sync(ctx, f)
		return false
	}
	if err != nil {
		e.log.Warn("adopting a transaction of our key the ledger lacked; will retry", f.logAttrs("tx", d.res.TxHash, "err", err)...)
		return false
	}
	if fresh {
		adopted(e.log, e.cfg.Observer, a, "watch")
	}
	n.sync(ctx, f)
	return false
}

// nonceUsedFinal reports whether the signer's nonce is used at the network's final point (by its
// depth under the highest head seen: a tag rule's fallback depth), read twice: a node that
// lacks the block, or either read under the nonce, says not yet.
func (n *chainEngine) nonceUsedFinal(ctx context.Context, signer common.Address, nonce uint64) (bool, error) {
	fp := n.net.Finality.At(n.maxSeen.Load(), facilitator.TagRead{}, 0)
	if !fp.Known {
		return false, nil
	}
	for range 2 {
		var count hexutil.Uint64
		if err := n.one(ctx, ethrpc.TransactionCount(signer, hexutil.EncodeUint64(fp.Block), &count)); err != nil {
			return false, err
		}
		if uint64(count) <= nonce {
			return false, nil
		}
	}
	return true, nil
}

// variantAdoption is the adoption of the transaction res names for f's authorization alone: the
// pinned reads showed its use log at res's block, on a quorum, and the transaction signed by one
// of our keys.
func (n *chainEngine) variantAdoption(ctx context.Context, f *flight, res facilitator.Resolution) (*facilitator.Adoption, error) {
	tx, from, err := ethrpc.SignedTx(ctx, n.chain, res.TxHash)
	if err != nil {
		return nil, err
	}
	if !n.isSigner(from) {
		return nil, fmt.Errorf("transaction %s is signed by %s, not one of ours", res.TxHash, from)
	}
	rec, err := txRecord(tx)
	if err != nil {
		return nil, err
	}
	a := &facilitator.Adoption{Network: n.net.ID, Signer: from, TxNonce: tx.Nonce(), Tx: rec, BlockNumber: res.BlockNumber, BlockHash: res.BlockHash}
	for _, m := range adoptedMembers(tx, n.net.ID) {
		if m.Key == f.key {
			a.Members = append(a.Members, m)
			return a, nil
		}
	}
	return nil, fmt.Errorf("transaction %s carries no transferWithAuthorization of the settlement's authorization", res.TxHash)
}
