package reconcile

import (
	"context"
	"errors"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// The ledger can lose its newest commits (a failover to an asynchronous standby, a restore from
// a backup) while the chain keeps the transactions they recorded. A transaction one of the
// network's signer keys signed is ours whether or not the ledger has it: the jobs adopt it
// (settle.AdoptionOf, Store.AdoptSettlements) instead of answering its authorization settled
// elsewhere, and look for the ones nobody asks about again.

// adoptUse looks at a use of row's authorization by a transaction none of row's: when one of our
// keys signed it, it is adopted as row's (a mined row is reopened first: the chain says its
// authorization was used by that transaction, not the one it records). handled is true when the
// use is ours, adopted or not yet shown mined, or its transaction could not be read: the row
// must not be answered settled elsewhere on it.
func (j *Jobs) adoptUse(ctx context.Context, p *pass, row facilitator.OpenSettlement, use *facilitator.AuthorizationUse) (handled bool, err error) {
	n := p.n
	isOurs := func(a common.Address) bool { return a == row.Signer || n.ours(a) }
	a, ours, err := settle.AdoptionOf(ctx, n.Chain, j.batchOn, n.Network.Finality, n.Network.ID, isOurs, use.TxHash, j.cfg.Now())
	switch {
	case err != nil:
		j.log.Warn("reading the transaction that used a settlement's authorization; looking again later", "network", n.Network.ID,
			"settlement", row.ID, "tx", use.TxHash, "err", err)
		return true, nil
	case !ours:
		return false, nil
	case a == nil || !a.Has(row.Key):
		return true, nil // ours, not shown mined (for it) yet
	}
	if row.State.Succeeded() {
		if err := j.reopen(ctx, facilitator.MinedIn{ID: row.ID, BlockHash: row.BlockHash},
			"reconcile: a transaction of our key the ledger had lost used the authorization"); err != nil {
			return true, err
		}
		p.ch.Reopened++
	}
	return true, j.adopt(ctx, &p.ch, a)
}

// adopt records a; an adoption the ledger refuses (another settlement at its nonce, a member
// resolved otherwise) is logged and left for a person or a later run.
func (j *Jobs) adopt(ctx context.Context, ch *Changes, a *facilitator.Adoption) error {
	_, fresh, err := j.cfg.Store.AdoptSettlements(ctx, *a)
	switch {
	case errors.Is(err, facilitator.ErrDuplicate), errors.Is(err, facilitator.ErrNonceTaken):
		j.log.Warn("a transaction of our key the ledger lacked could not be adopted", "network", a.Network, "signer", a.Signer,
			"tx", a.Tx.Hash, "tx_nonce", a.TxNonce, "err", err)
		return nil
	case err != nil:
		return err
	case !fresh:
		return nil // adopted already (a retry, the settle path): counted by whoever wrote it
	}
	for _, m := range a.Members {
		j.log.Warn("adopted a transaction of our key the ledger lacked", "network", a.Network, "signer", a.Signer, "tx", a.Tx.Hash,
			"tx_nonce", a.TxNonce, "block", a.BlockNumber, "payer", m.Key.Payer, "nonce", hexutil.Encode(m.Key.Nonce[:]), "by", "reconcile")
	}
	j.cfg.Observer.Adopted(a.Network, a.Signer.Hex())
	ch.Adopted++
	return nil
}

// adoptLost looks for transactions of n's keys that the ledger lost and nobody asked about
// again. It costs one nonce read per key when nothing is lost: it looks only when the chain has
// counted more transactions of a key than the ledger accounts for (its highest tx nonce, plus
// one), and then reads the index's uses of authorizations from the block of the key's newest
// settlement the ledger has mined, at most Batch of them, each by a transaction the ledger does
// not have read to tell whose it is.
func (j *Jobs) adoptLost(ctx context.Context, n Network) (Changes, error) {
	var ch Changes
	from, missing, err := j.lostFrom(ctx, n)
	if err != nil || missing == 0 {
		return ch, err
	}
	uses, err := j.cfg.Store.AuthorizationUsesFrom(ctx, n.Network.ID, from, j.cfg.Batch)
	if err != nil {
		return ch, err
	}
	seen := map[common.Hash]bool{}
	for _, u := range uses {
		if seen[u.TxHash] || uint64(ch.Adopted) >= missing {
			continue
		}
		seen[u.TxHash] = true
		switch _, err := j.cfg.Store.SettlementByTx(ctx, u.TxHash); {
		case err == nil:
			continue // the ledger has it
		case !errors.Is(err, facilitator.ErrNotFound):
			return ch, err
		}
		a, ours, err := settle.AdoptionOf(ctx, n.Chain, j.batchOn, n.Network.Finality, n.Network.ID, n.ours, u.TxHash, j.cfg.Now())
		if err != nil {
			j.log.Debug("reading an indexed use's transaction", "network", n.Network.ID, "tx", u.TxHash, "err", err)
			continue
		}
		if !ours || a == nil {
			continue
		}
		if err := j.adopt(ctx, &ch, a); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// lostFrom is the block from which n's keys may have transactions the ledger lost, and how many
// (0: none: the chain counts no more transactions of any key than the ledger accounts for).
func (j *Jobs) lostFrom(ctx context.Context, n Network) (from, missing uint64, err error) {
	if len(n.Signers) == 0 {
		return 0, 0, nil
	}
	counts := make([]hexutil.Uint64, len(n.Signers))
	elems := make([]rpc.BatchElem, len(n.Signers))
	for i, s := range n.Signers {
		elems[i] = ethrpc.TransactionCount(s, "latest", &counts[i])
	}
	if err := j.batch(ctx, n, elems); err != nil {
		return 0, 0, err
	}
	first := true
	for i, s := range n.Signers {
		if elems[i].Error != nil {
			continue // not read: looked at next run
		}
		top, has, err := j.cfg.Store.MaxTxNonce(ctx, n.Network.ID, s)
		if err != nil {
			return 0, 0, err
		}
		accounted := uint64(0)
		if has {
			accounted = top + 1
		}
		if uint64(counts[i]) <= accounted {
			continue
		}
		missing += uint64(counts[i]) - accounted
		block, _, err := j.cfg.Store.NewestMinedBlock(ctx, n.Network.ID, s)
		if err != nil {
			return 0, 0, err
		}
		if first || block < from {
			from, first = block, false
		}
	}
	return from, missing, nil
}
