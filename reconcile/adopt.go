package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

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
	a, ours, err := settle.AdoptionOf(ctx, n.Chain, j.batchOn, n.Network.Finality, n.Network.ID, isOurs, nil, use.TxHash, j.cfg.Now())
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

// holeWindow bounds the look for a key's lost transactions to its most recent nonces: a
// failover or a restore loses the newest commits, and the look stays one small read per key.
const holeWindow = 1024

// adoptLost looks for transactions of n's keys that the ledger lost and nobody asked about
// again. It costs one nonce read per key and one ledger read when nothing is lost: it looks
// only when the ledger holds no row at some of a key's tx nonces below the chain's count of its
// transactions (holes: a lost transaction stays one when the key settles new payments after
// it), and then reads the index's uses of authorizations from the block of the key's newest
// mined settlement below its lowest hole, at most Batch of them, each by a transaction the
// ledger does not have read to tell whose it is. A hole the look leaves (a transaction of our
// key that carries no authorization of ours) is not looked for again by these jobs.
func (j *Jobs) adoptLost(ctx context.Context, n Network) (Changes, error) {
	var ch Changes
	lost, head, err := j.lostHoles(ctx, n)
	if err != nil || len(lost) == 0 {
		return ch, err
	}
	from, missing := lost[0].from, 0
	for _, k := range lost {
		from, missing = min(from, k.from), missing+len(k.holes)
	}
	from = j.holes.resumeAt(n.Network.ID, lost, from)
	uses, err := j.cfg.Store.AuthorizationUsesFrom(ctx, n.Network.ID, from, j.cfg.Batch)
	if err != nil {
		return ch, err
	}
	seen := map[common.Hash]bool{}
	unread := false
	for _, u := range uses {
		if seen[u.TxHash] || ch.Adopted >= missing {
			continue
		}
		seen[u.TxHash] = true
		switch _, err := j.cfg.Store.SettlementByTx(ctx, u.TxHash); {
		case err == nil:
			continue // the ledger has it
		case !errors.Is(err, facilitator.ErrNotFound):
			return ch, err
		}
		a, ours, err := settle.AdoptionOf(ctx, n.Chain, j.batchOn, n.Network.Finality, n.Network.ID, n.ours, nil, u.TxHash, j.cfg.Now())
		if err != nil {
			j.log.Debug("reading an indexed use's transaction", "network", n.Network.ID, "tx", u.TxHash, "err", err)
			unread = true
			continue
		}
		if ours && a == nil {
			unread = true // ours, not shown mined yet: adopted by a later run
		}
		if !ours || a == nil {
			continue
		}
		if err := j.adopt(ctx, &ch, a); err != nil {
			return ch, err
		}
	}
	if len(uses) >= j.cfg.Batch {
		// The look stopped short of the index's head: the next run goes on from here.
		next := uses[len(uses)-1].BlockNumber
		if next <= from {
			next = from + 1
		}
		j.holes.resume(n.Network.ID, lost, next)
		return ch, nil
	}
	j.holes.resume(n.Network.ID, nil, 0)
	if unread {
		return ch, nil // a transaction could not be read: the holes are looked for again next run
	}
	// The holes the look left are remembered only once the index holds every block the count
	// was read at: until then their transactions may not be indexed yet.
	if cur, ok, err := j.cfg.Store.Cursor(ctx, n.Network.ID); err != nil || !ok || cur.Number < head {
		return ch, err
	}
	for _, k := range lost {
		held, err := j.cfg.Store.NoncesHeld(ctx, n.Network.ID, k.signer, k.holes[0])
		if err != nil {
			return ch, err
		}
		var left []uint64
		for _, h := range k.holes {
			if !slices.Contains(held, h) {
				left = append(left, h)
			}
		}
		j.holes.scanned(n.Network.ID, k.signer, left)
	}
	return ch, nil
}

// keyHoles is one key's holes not looked for yet, and the block its lost transactions mined
// from.
type keyHoles struct {
	signer common.Address
	holes  []uint64
	from   uint64
}

// lostHoles is n's keys' holes not looked for yet (none: nothing is lost, as far as these jobs
// can tell), and the chain's head when the counts were read (the highest uint64 when unread).
func (j *Jobs) lostHoles(ctx context.Context, n Network) ([]keyHoles, uint64, error) {
	if len(n.Signers) == 0 {
		return nil, 0, nil
	}
	counts := make([]hexutil.Uint64, len(n.Signers))
	elems := make([]rpc.BatchElem, len(n.Signers), len(n.Signers)+1)
	for i, s := range n.Signers {
		elems[i] = ethrpc.TransactionCount(s, "latest", &counts[i])
	}
	var headNum hexutil.Uint64
	elems = append(elems, ethrpc.BlockNumber(&headNum)) // after the counts: no lower than their block
	if err := j.batch(ctx, n, elems); err != nil {
		return nil, 0, err
	}
	head := uint64(headNum)
	if elems[len(n.Signers)].Error != nil {
		head = math.MaxUint64
	}
	var out []keyHoles
	for i, s := range n.Signers {
		if elems[i].Error != nil {
			continue // not read: looked at next run
		}
		count := uint64(counts[i])
		held, err := j.cfg.Store.NoncesHeld(ctx, n.Network.ID, s, count-min(count, holeWindow))
		if err != nil {
			return nil, 0, err
		}
		holes := nonceHoles(count, held, holeWindow, j.holes.seen(n.Network.ID, s, count-min(count, holeWindow)))
		if len(holes) == 0 {
			continue
		}
		block, _, err := j.cfg.Store.MinedBlockBelow(ctx, n.Network.ID, s, holes[0])
		if err != nil {
			return nil, 0, err
		}
		out = append(out, keyHoles{signer: s, holes: holes, from: block})
	}
	return out, head, nil
}

// nonceHoles is the decision: the tx nonces among the window below count (the chain's count of
// the key's transactions) that no ledger row holds (held, ascending) and that scanned does not
// name (looked for already without result), ascending.
func nonceHoles(count uint64, held []uint64, window uint64, scanned func(uint64) bool) []uint64 {
	var out []uint64
	i := 0
	for n := count - min(count, window); n < count; n++ {
		for i < len(held) && held[i] < n {
			i++
		}
		if (i < len(held) && held[i] == n) || scanned(n) {
			continue
		}
		out = append(out, n)
	}
	return out
}

// scannedHoles remembers, in memory, what the look for lost transactions found nothing at, so
// that a permanent hole costs one look per process, and where a look cut short goes on.
type scannedHoles struct {
	mu   sync.Mutex
	done map[holeKey]bool
	// at is where the next look of a network goes on, while its holes are those of the look
	// cut short (lost).
	at map[string]resumePoint
}

type holeKey struct {
	network string
	signer  common.Address
	nonce   uint64
}

type resumePoint struct {
	lost  string
	block uint64
}

func newScannedHoles() *scannedHoles {
	return &scannedHoles{done: map[holeKey]bool{}, at: map[string]resumePoint{}}
}

// seen is whether a hole of signer's was looked for already; the memory of holes below floor
// (out of the window for good) is dropped.
func (h *scannedHoles) seen(network string, signer common.Address, floor uint64) func(uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.done {
		if k.network == network && k.signer == signer && k.nonce < floor {
			delete(h.done, k)
		}
	}
	return func(n uint64) bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.done[holeKey{network, signer, n}]
	}
}

func (h *scannedHoles) scanned(network string, signer common.Address, holes []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range holes {
		h.done[holeKey{network, signer, n}] = true
	}
}

// resume records where the next look at the same holes goes on (nil lost: from the start).
func (h *scannedHoles) resume(network string, lost []keyHoles, block uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if lost == nil {
		delete(h.at, network)
		return
	}
	h.at[network] = resumePoint{lost: fmt.Sprint(lost), block: block}
}

// resumeAt is where a look at lost starts: from, or further on when a look at the same holes
// was cut short.
func (h *scannedHoles) resumeAt(network string, lost []keyHoles, from uint64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.at[network]; ok && p.lost == fmt.Sprint(lost) && p.block > from {
		return p.block
	}
	return from
}
