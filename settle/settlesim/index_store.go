package settlesim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// IndexStore is the block index as Postgres keeps it (facilitator/postgres/index.go), in memory:
// what the real indexer writes (indexer.Store) and what the status answers and the reconcile jobs
// read back. Its semantics are Postgres's, held to them by the index contract (settle/ledgertest's
// RunIndex): a commit is all or nothing, an event already stored (its transaction and log index)
// fails the whole commit as the primary key does, the cursor keeps no parent hash, and a use is
// paired with the Transfer logged right after it.
type IndexStore struct {
	mu     sync.Mutex
	r      *rand.Rand
	faults IndexFaults
	nets   map[string]*indexNet
	leased map[string]bool
}

// IndexFaults are the index store's faults, each a chance per write: Fail, nothing is written;
// Ambiguous, the commit is written and answers an error (its connection died after COMMIT).
type IndexFaults struct {
	Fail, Ambiguous float64
}

type indexNet struct {
	cursor    *facilitator.Block
	blocks    map[uint64]facilitator.Block
	transfers []facilitator.Transfer
	auths     []facilitator.AuthorizationEvent
}

// NewIndexStore is an empty index; its fault draws come from a generator forked from r.
func NewIndexStore(faults IndexFaults, r *rand.Rand) *IndexStore {
	return &IndexStore{r: Fork(r), faults: faults, nets: map[string]*indexNet{}, leased: map[string]bool{}}
}

// SetFaults changes the store's faults (IndexFaults{} at the end of a run).
func (x *IndexStore) SetFaults(f IndexFaults) {
	x.mu.Lock()
	x.faults = f
	x.mu.Unlock()
}

// ErrIndexWrite is a simulated failure of an index write; whether it was applied is unknown to the
// caller, as a lost connection's is.
var ErrIndexWrite = errors.New("settlesim: index write failed")

func (x *IndexStore) net(network string) *indexNet {
	n := x.nets[network]
	if n == nil {
		n = &indexNet{blocks: map[uint64]facilitator.Block{}}
		x.nets[network] = n
	}
	return n
}

// fault draws a write's fault: fail (nothing written) or ambiguous (written, then an error).
// Caller holds mu.
func (x *IndexStore) fault(ctx context.Context) (fail, ambiguous bool) {
	if faultless(ctx) {
		return false, false
	}
	u := x.r.Float64()
	return u < x.faults.Fail, u >= x.faults.Fail && u < x.faults.Fail+x.faults.Ambiguous
}

// Lead takes the network's lease: one holder at a time, the others wait until ctx ends (the
// simulator's indexer is stepped by one driver, which takes the lease once per process).
func (x *IndexStore) Lead(ctx context.Context, network string) (context.Context, func(), error) {
	x.mu.Lock()
	if x.leased[network] {
		x.mu.Unlock()
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	x.leased[network] = true
	x.mu.Unlock()
	leading, cancel := context.WithCancel(ctx)
	var once sync.Once
	return leading, func() {
		once.Do(func() {
			cancel()
			x.mu.Lock()
			delete(x.leased, network)
			x.mu.Unlock()
		})
	}, nil
}

// Cursor is the last indexed block: its number and hash (Postgres keeps no parent hash).
func (x *IndexStore) Cursor(ctx context.Context, network string) (facilitator.Block, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := x.net(network)
	if n.cursor == nil {
		return facilitator.Block{}, false, nil
	}
	return facilitator.Block{Number: n.cursor.Number, Hash: n.cursor.Hash}, true, nil
}

type logKey struct {
	tx    common.Hash
	index uint
}

// insertLogs appends adds to rows as a table keyed by (tx_hash, log_index) inserts them: a log
// stored already, or twice among adds, fails the insert.
func insertLogs[E any](rows, adds []E, what string, at func(E) facilitator.LogPosition) ([]E, error) {
	seen := map[logKey]bool{}
	for _, e := range rows {
		p := at(e)
		seen[logKey{p.TxHash, p.LogIndex}] = true
	}
	for _, e := range adds {
		p := at(e)
		k := logKey{p.TxHash, p.LogIndex}
		if seen[k] {
			return nil, fmt.Errorf("%s %s:%d already stored (duplicate key)", what, p.TxHash, p.LogIndex)
		}
		seen[k] = true
		rows = append(rows, e)
	}
	return rows, nil
}

// Commit writes one indexer step at once: the rollback above a reorg's ancestor, the events, the
// window blocks (replacing any at their numbers) and the cursor.
func (x *IndexStore) Commit(ctx context.Context, network string, b facilitator.IndexBatch) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	fail, ambiguous := x.fault(ctx)
	if fail {
		return fmt.Errorf("committing the index of %s: %w", network, ErrIndexWrite)
	}
	cur := x.net(network)
	n := &indexNet{blocks: map[uint64]facilitator.Block{}}
	for k, v := range cur.blocks {
		n.blocks[k] = v
	}
	n.transfers, n.auths = slices.Clone(cur.transfers), slices.Clone(cur.auths)
	if b.RollbackTo != nil {
		above := b.RollbackTo.Number
		n.transfers = slices.DeleteFunc(n.transfers, func(t facilitator.Transfer) bool { return t.BlockNumber > above })
		n.auths = slices.DeleteFunc(n.auths, func(a facilitator.AuthorizationEvent) bool { return a.BlockNumber > above })
		for k := range n.blocks {
			if k > above {
				delete(n.blocks, k)
			}
		}
	}
	// The primary keys: (network, tx_hash, log_index), in each table.
	adds := make([]facilitator.Transfer, len(b.Events.Transfers))
	for i, t := range b.Events.Transfers {
		t.Value = new(big.Int).Set(t.Value)
		adds[i] = t
	}
	var err error
	if n.transfers, err = insertLogs(n.transfers, adds, "transfer", func(t facilitator.Transfer) facilitator.LogPosition { return t.LogPosition }); err != nil {
		return fmt.Errorf("committing the index of %s: %w", network, err)
	}
	if n.auths, err = insertLogs(n.auths, b.Events.Auths, "authorization event", func(a facilitator.AuthorizationEvent) facilitator.LogPosition { return a.LogPosition }); err != nil {
		return fmt.Errorf("committing the index of %s: %w", network, err)
	}
	for _, bl := range b.Blocks {
		n.blocks[bl.Number] = bl
	}
	c := facilitator.Block{Number: b.Cursor.Number, Hash: b.Cursor.Hash}
	n.cursor = &c
	x.nets[network] = n
	if ambiguous {
		return fmt.Errorf("committing the index of %s (committed): %w", network, ErrIndexWrite)
	}
	return nil
}

// WindowBlocks are the kept blocks numbered from upward, ascending.
func (x *IndexStore) WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []facilitator.Block
	for k, b := range x.net(network).blocks {
		if k >= from {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b facilitator.Block) int { return cmp.Compare(a.Number, b.Number) })
	return out, nil
}

// PruneBlocks drops the kept blocks below a number.
func (x *IndexStore) PruneBlocks(ctx context.Context, network string, below uint64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if fail, _ := x.fault(ctx); fail {
		return fmt.Errorf("pruning the index of %s: %w", network, ErrIndexWrite)
	}
	n := x.net(network)
	for k := range n.blocks {
		if k < below {
			delete(n.blocks, k)
		}
	}
	return nil
}

// AuthorizationUse is the indexed use or cancellation of an authorization (the lowest block's),
// with the Transfer logged right after a use, from the authorizer, in its transaction.
func (x *IndexStore) AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := x.net(network)
	var a *facilitator.AuthorizationEvent
	for i := range n.auths {
		e := &n.auths[i]
		if e.Token == token && e.Authorizer == authorizer && e.Nonce == nonce && (a == nil || e.BlockNumber < a.BlockNumber) {
			a = e
		}
	}
	if a == nil {
		return nil, nil
	}
	u := &facilitator.AuthorizationUse{Canceled: a.Canceled, BlockNumber: a.BlockNumber, BlockHash: a.BlockHash, TxHash: a.TxHash}
	for _, t := range n.transfers {
		if t.BlockNumber == a.BlockNumber && t.TxHash == a.TxHash && t.LogIndex == a.LogIndex+1 && t.Token == a.Token && t.From == a.Authorizer {
			u.To, u.Value = t.To, new(big.Int).Set(t.Value)
			break
		}
	}
	return u, nil
}

// IndexedEvents counts a network's stored events, as Postgres's does.
func (x *IndexStore) IndexedEvents(ctx context.Context, network string) (int64, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := x.net(network)
	return int64(len(n.transfers) + len(n.auths)), nil
}

// Events are every stored event of a network, for the oracle.
func (x *IndexStore) Events(network string) facilitator.Events {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := x.net(network)
	return facilitator.Events{Transfers: slices.Clone(n.transfers), Auths: slices.Clone(n.auths)}
}

// AuthorizationUsesFrom lists the stored uses (not cancels) in blocks from from on, in chain
// order, at most limit, as Postgres's.
func (x *IndexStore) AuthorizationUsesFrom(ctx context.Context, network string, from uint64, limit int) ([]facilitator.AuthorizationEvent, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []facilitator.AuthorizationEvent
	for _, e := range x.net(network).auths {
		if !e.Canceled && e.BlockNumber >= from {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b facilitator.AuthorizationEvent) int {
		if a.BlockNumber != b.BlockNumber {
			return cmp.Compare(a.BlockNumber, b.BlockNumber)
		}
		return cmp.Compare(a.LogIndex, b.LogIndex)
	})
	return out[:min(len(out), limit)], nil
}
