package ledgertest

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Index is what the contract holds of an index store: what the indexer writes (indexer.Store)
// and what the status answers and the reconcile jobs read back. The simulator's
// (settlesim.IndexStore) stands in for Postgres's when the simulator drives the real indexer, and
// proves nothing of production unless the two agree.
type Index interface {
	Lead(ctx context.Context, network string) (leading context.Context, release func(), err error)
	Cursor(ctx context.Context, network string) (facilitator.Block, bool, error)
	Commit(ctx context.Context, network string, b facilitator.IndexBatch) error
	WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error)
	PruneBlocks(ctx context.Context, network string, below uint64) error
	AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error)
}

// IndexHarness makes the index stores under test.
type IndexHarness struct {
	// New is an empty index for one test, on which network is a network it may index.
	New func(t *testing.T) (x Index, network string)
}

// RunIndex runs the index contract against h's stores.
func RunIndex(t *testing.T, h IndexHarness) {
	for _, c := range []struct {
		name string
		f    func(t *testing.T, f *indexFixture)
	}{
		{"CommitAndRead", indexCommitAndRead},
		{"UsePairsItsOwnTransfer", indexUsePairsItsOwnTransfer},
		{"Rollback", indexRollback},
		{"DuplicateFailsWhole", indexDuplicateFailsWhole},
		{"Prune", indexPrune},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, network := h.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			_, release, err := x.Lead(ctx, network)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
			c.f(t, &indexFixture{x: x, ctx: ctx, network: network, token: randomAddress()})
		})
	}
}

type indexFixture struct {
	x       Index
	ctx     context.Context
	network string
	token   common.Address
}

func randomHash() common.Hash { return common.BytesToHash(randomAddress().Bytes()) }

// chainOf is n linked blocks from number first.
func chainOf(first uint64, n int) []facilitator.Block {
	out := make([]facilitator.Block, n)
	parent := randomHash()
	for i := range out {
		out[i] = facilitator.Block{Number: first + uint64(i), Hash: randomHash(), ParentHash: parent}
		parent = out[i].Hash
	}
	return out
}

func (f *indexFixture) pos(b facilitator.Block, tx common.Hash, index uint) facilitator.LogPosition {
	return facilitator.LogPosition{BlockNumber: b.Number, BlockHash: b.Hash, TxHash: tx, LogIndex: index, Token: f.token}
}

// use is an authorization used in block b by tx at log index, with its Transfer right after.
func (f *indexFixture) use(ev *facilitator.Events, b facilitator.Block, tx common.Hash, index uint, payer, to common.Address, nonce [32]byte, value int64) {
	ev.Auths = append(ev.Auths, facilitator.AuthorizationEvent{LogPosition: f.pos(b, tx, index), Authorizer: payer, Nonce: nonce})
	ev.Transfers = append(ev.Transfers, facilitator.Transfer{LogPosition: f.pos(b, tx, index+1), From: payer, To: to, Value: big.NewInt(value)})
}

func (f *indexFixture) commit(t *testing.T, b facilitator.IndexBatch) {
	t.Helper()
	if err := f.x.Commit(f.ctx, f.network, b); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func (f *indexFixture) useOf(t *testing.T, payer common.Address, nonce [32]byte) *facilitator.AuthorizationUse {
	t.Helper()
	u, err := f.x.AuthorizationUse(f.ctx, f.network, f.token, payer, nonce)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// holdsNone fails t when the index holds the use of payer's nonce, or a kept block from number
// from up: what a rewind or a failed commit leaves (where says which, in the failure).
func (f *indexFixture) holdsNone(t *testing.T, payer common.Address, nonce [32]byte, from uint64, where string) {
	t.Helper()
	if u := f.useOf(t, payer, nonce); u != nil {
		t.Fatalf("a use %s: %+v", where, u)
	}
	if kept, _ := f.x.WindowBlocks(f.ctx, f.network, from); len(kept) != 0 {
		t.Fatalf("blocks from %d %s: %+v", from, where, kept)
	}
}

func (f *indexFixture) cursor(t *testing.T) (facilitator.Block, bool) {
	t.Helper()
	c, ok, err := f.x.Cursor(f.ctx, f.network)
	if err != nil {
		t.Fatal(err)
	}
	return c, ok
}

func randomNonce() [32]byte { return randomHash() }

// Nothing before the first commit; then the cursor (its number and hash only), the kept blocks
// ascending from a number, uses and cancellations.
func indexCommitAndRead(t *testing.T, f *indexFixture) {
	if _, ok := f.cursor(t); ok {
		t.Fatal("a cursor before the first commit")
	}
	bs := chainOf(10, 3)
	payer, to, nonce, canceled := randomAddress(), randomAddress(), randomNonce(), randomNonce()
	var ev facilitator.Events
	f.use(&ev, bs[1], randomHash(), 4, payer, to, nonce, 77)
	ev.Auths = append(ev.Auths, facilitator.AuthorizationEvent{LogPosition: f.pos(bs[2], randomHash(), 0), Canceled: true, Authorizer: payer, Nonce: canceled})
	f.commit(t, facilitator.IndexBatch{Events: ev, Blocks: bs, Cursor: bs[2]})
	if c, ok := f.cursor(t); !ok || c != (facilitator.Block{Number: 12, Hash: bs[2].Hash}) {
		t.Fatalf("cursor %+v %v, want block 12 %s without its parent", c, ok, bs[2].Hash)
	}
	kept, err := f.x.WindowBlocks(f.ctx, f.network, 11)
	if err != nil || len(kept) != 2 || kept[0] != bs[1] || kept[1] != bs[2] {
		t.Fatalf("window from 11: %+v %v, want blocks 11 and 12", kept, err)
	}
	u := f.useOf(t, payer, nonce)
	if u == nil || u.Canceled || u.BlockNumber != 11 || u.BlockHash != bs[1].Hash || u.TxHash != ev.Auths[0].TxHash || u.To != to || u.Value.Int64() != 77 {
		t.Fatalf("use: %+v, want block 11 paying 77 to %s", u, to)
	}
	if u := f.useOf(t, payer, canceled); u == nil || !u.Canceled || u.BlockNumber != 12 || u.To != (common.Address{}) || u.Value != nil {
		t.Fatalf("cancel: %+v, want canceled in block 12 with no transfer", u)
	}
	if u := f.useOf(t, payer, randomNonce()); u != nil {
		t.Fatalf("an unknown nonce: %+v", u)
	}
	if u, err := f.x.AuthorizationUse(f.ctx, f.network, randomAddress(), payer, nonce); u != nil || err != nil {
		t.Fatalf("another token's: %+v %v", u, err)
	}
}

// One transaction using two authorizations of one payer: each use is paired with the Transfer
// logged right after it, not with the payer's first transfer in the transaction.
func indexUsePairsItsOwnTransfer(t *testing.T, f *indexFixture) {
	bs := chainOf(1, 1)
	tx, payer := randomHash(), randomAddress()
	a, b := randomNonce(), randomNonce()
	toA, toB := randomAddress(), randomAddress()
	var ev facilitator.Events
	f.use(&ev, bs[0], tx, 0, payer, toA, a, 1)
	f.use(&ev, bs[0], tx, 2, payer, toB, b, 2)
	// Another transfer of the payer's in the transaction, after both, and another's right after
	// a third authorization's use: neither is a use's.
	other := randomNonce()
	ev.Transfers = append(ev.Transfers, facilitator.Transfer{LogPosition: f.pos(bs[0], tx, 4), From: payer, To: randomAddress(), Value: big.NewInt(3)})
	ev.Auths = append(ev.Auths, facilitator.AuthorizationEvent{LogPosition: f.pos(bs[0], tx, 5), Authorizer: payer, Nonce: other})
	ev.Transfers = append(ev.Transfers, facilitator.Transfer{LogPosition: f.pos(bs[0], tx, 6), From: randomAddress(), To: randomAddress(), Value: big.NewInt(4)})
	f.commit(t, facilitator.IndexBatch{Events: ev, Blocks: bs, Cursor: bs[0]})
	if u := f.useOf(t, payer, a); u == nil || u.To != toA || u.Value.Int64() != 1 {
		t.Fatalf("first use: %+v, want 1 to %s", u, toA)
	}
	if u := f.useOf(t, payer, b); u == nil || u.To != toB || u.Value.Int64() != 2 {
		t.Fatalf("second use: %+v, want 2 to %s", u, toB)
	}
	if u := f.useOf(t, payer, other); u == nil || u.To != (common.Address{}) || u.Value != nil {
		t.Fatalf("a use followed by another's transfer: %+v, want no transfer", u)
	}
}

// A rollback drops every event and kept block above the ancestor, in the commit that indexes the
// new branch: a transaction reincluded at the same log index is stored again.
func indexRollback(t *testing.T, f *indexFixture) {
	old := chainOf(5, 4)
	tx, payer, nonce := randomHash(), randomAddress(), randomNonce()
	var ev facilitator.Events
	f.use(&ev, old[1], randomHash(), 0, payer, randomAddress(), randomNonce(), 5)
	f.use(&ev, old[2], tx, 0, payer, randomAddress(), nonce, 6)
	f.commit(t, facilitator.IndexBatch{Events: ev, Blocks: old, Cursor: old[3]})

	ancestor := old[1]
	branch := chainOf(7, 3)
	branch[0].ParentHash = ancestor.Hash
	var again facilitator.Events
	f.use(&again, branch[1], tx, 0, payer, randomAddress(), nonce, 6)
	f.commit(t, facilitator.IndexBatch{RollbackTo: &ancestor, Events: again, Blocks: branch, Cursor: branch[2]})
	if c, _ := f.cursor(t); c.Number != 9 || c.Hash != branch[2].Hash {
		t.Fatalf("cursor %+v, want the new branch's 9", c)
	}
	if u := f.useOf(t, payer, nonce); u == nil || u.BlockNumber != 8 || u.BlockHash != branch[1].Hash {
		t.Fatalf("use after the rollback: %+v, want the new branch's block 8", u)
	}
	kept, _ := f.x.WindowBlocks(f.ctx, f.network, 0)
	want := append([]facilitator.Block{old[0], old[1]}, branch...)
	if len(kept) != len(want) {
		t.Fatalf("window %+v, want %+v", kept, want)
	}
	for i := range want {
		if kept[i] != want[i] {
			t.Fatalf("window %+v, want %+v", kept, want)
		}
	}
	// A rewind alone (reconcile's): everything above it goes, and the cursor comes down to it.
	f.commit(t, facilitator.IndexBatch{RollbackTo: &ancestor, Cursor: ancestor})
	f.holdsNone(t, payer, nonce, 7, "above a rewind")
}

// An event already stored (its transaction and log index) fails the whole commit: nothing of it
// is written, the cursor stays.
func indexDuplicateFailsWhole(t *testing.T, f *indexFixture) {
	bs := chainOf(1, 2)
	tx, payer := randomHash(), randomAddress()
	var ev facilitator.Events
	f.use(&ev, bs[0], tx, 0, payer, randomAddress(), randomNonce(), 1)
	f.commit(t, facilitator.IndexBatch{Events: ev, Blocks: bs[:1], Cursor: bs[0]})
	nonce := randomNonce()
	var dup facilitator.Events
	f.use(&dup, bs[1], randomHash(), 0, payer, randomAddress(), nonce, 2)
	dup.Transfers = append(dup.Transfers, ev.Transfers[0])
	if err := f.x.Commit(f.ctx, f.network, facilitator.IndexBatch{Events: dup, Blocks: bs[1:], Cursor: bs[1]}); err == nil {
		t.Fatal("a commit storing a transfer again succeeded")
	}
	if c, _ := f.cursor(t); c.Number != 1 {
		t.Fatalf("cursor %+v after a failed commit, want 1", c)
	}
	f.holdsNone(t, payer, nonce, 2, "after a failed commit")
}

// Pruning drops the kept blocks below a number, and nothing else.
func indexPrune(t *testing.T, f *indexFixture) {
	bs := chainOf(20, 5)
	payer, nonce := randomAddress(), randomNonce()
	var ev facilitator.Events
	f.use(&ev, bs[0], randomHash(), 0, payer, randomAddress(), nonce, 1)
	f.commit(t, facilitator.IndexBatch{Events: ev, Blocks: bs, Cursor: bs[4]})
	if err := f.x.PruneBlocks(f.ctx, f.network, 23); err != nil {
		t.Fatal(err)
	}
	kept, _ := f.x.WindowBlocks(f.ctx, f.network, 0)
	if len(kept) != 2 || kept[0].Number != 23 || kept[1].Number != 24 {
		t.Fatalf("window after pruning below 23: %+v", kept)
	}
	if u := f.useOf(t, payer, nonce); u == nil || u.BlockNumber != 20 {
		t.Fatalf("a pruned block's use: %+v, want kept", u)
	}
	if c, _ := f.cursor(t); c.Number != 24 {
		t.Fatalf("cursor %+v after pruning", c)
	}
}
