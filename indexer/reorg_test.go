package indexer_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestReorgRollsBack settles an authorization, lets the indexer store it, then makes the chain
// drop it: the rows of the abandoned branch must go and the replacement branch must be indexed.
func TestReorgRollsBack(t *testing.T) {
	t.Run("evm_revert and a longer branch", func(t *testing.T) {
		cfg := freshConfig(t)
		network, ctx := cfg.Network, context.Background()
		obs := &reorgObserver{}
		cfg.Observer = obs
		r := start(t, cfg)
		payer, sender := chain.Accounts[2], gasAccount(t)
		// The common ancestor has to be a block the indexer has seen (see "the first indexed block").
		mine(t, 3)
		r.waitCursor(t, head(t), 5*time.Second)

		snap, err := chain.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		base := head(t)
		old := payOnce(t, payer, sender, 1_000)
		mine(t, 3)
		oldHead := head(t)
		r.waitCursor(t, oldHead, 10*time.Second)
		if tr, au := indexedTx(t, network, old.tx); tr != 1 || au != 1 {
			t.Fatalf("the settled authorization has %d transfer and %d authorization rows, want 1 and 1", tr, au)
		}
		compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, oldHead)

		// The old branch (base+1 .. oldHead) goes; the new one carries a different transfer and is
		// longer, so the chain's head moves past the indexer's cursor.
		if err := chain.Revert(ctx, snap); err != nil {
			t.Fatal(err)
		}
		replacement := payOnce(t, payer, sender, 2_000)
		mine(t, int(oldHead-base)+2)
		newHead := head(t)
		st := r.waitFor(t, "a reorg and the new head", 20*time.Second, func(s indexer.Health) bool { return s.Reorgs >= 1 && s.Cursor >= newHead })
		t.Logf("old branch %d..%d (authorization in %d), new branch %d..%d (transfer in %d); status %+v",
			base+1, oldHead, old.block, base+1, newHead, replacement.block, st)
		checkReorged(t, network, cfg, old, replacement, newHead)
		// The observer heard it, with the depth rolled back: the old branch above the ancestor.
		if got := obs.wait(t, 5*time.Second); len(got) != 1 || got[0] != fmt.Sprintf("%s %d", network, oldHead-base) {
			t.Errorf("observed reorgs %v, want one on %s of depth %d", got, network, oldHead-base)
		}
	})

	t.Run("anvil_reorg", func(t *testing.T) {
		cfg := freshConfig(t)
		network, ctx := cfg.Network, context.Background()
		r := start(t, cfg)
		payer, sender := chain.Accounts[3], gasAccount(t)
		// Funded before the blocks that will be replaced, so it still has ETH on the new branch.
		other := newTxSenders(t, 1)[0]
		mine(t, 3)

		old := payOnce(t, payer, sender, 3_000)
		mine(t, 2)
		oldHead := head(t)
		r.waitCursor(t, oldHead, 10*time.Second)
		if tr, au := indexedTx(t, network, old.tx); tr != 1 || au != 1 {
			t.Fatalf("the settled authorization has %d transfer and %d authorization rows, want 1 and 1", tr, au)
		}

		// Replace the blocks from the authorization's up with as many new ones, the first carrying
		// another transfer (from another gas account: the old sender's nonce is rewound too).
		a := devchain.TransferAuthorization{From: payer.Address, To: randomAddress(t), Value: big.NewInt(4_000),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 3600), Nonce: stacktest.Random32(t)}
		tx := other.sign(t, &chain.USDC.Address, packTransferWithAuthorization(t, payer.Key, a), 150_000)
		raw, err := tx.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		depth := oldHead - old.block + 1
		if err := chain.RPC.CallContext(ctx, nil, "anvil_reorg", depth, []any{[]any{hexutil.Encode(raw), 0}}); err != nil {
			t.Fatalf("anvil_reorg: %v", err)
		}
		if h := head(t); h != oldHead {
			t.Fatalf("anvil_reorg moved the head from %d to %d", oldHead, h)
		}
		rc := receiptOf(t, tx.Hash())
		if rc == nil {
			t.Fatal("the replacement transaction is not on the new branch")
		}
		replacement := settled{tx: tx.Hash(), block: uint64(mustUint(t, rc["blockNumber"])), payer: a.From, to: a.To, nonce: a.Nonce, amount: a.Value}
		// A branch of the same height is seen when a block arrives on top of it.
		mine(t, 1)
		newHead := head(t)
		st := r.waitFor(t, "a reorg and the new head", 20*time.Second, func(s indexer.Health) bool { return s.Reorgs >= 1 && s.Cursor >= newHead })
		t.Logf("blocks %d..%d replaced (authorization in %d, new transfer in %d); status %+v", old.block, oldHead, old.block, replacement.block, st)
		checkReorged(t, network, cfg, old, replacement, newHead)
	})

	t.Run("the first indexed block", func(t *testing.T) {
		cfg := freshConfig(t)
		network, ctx := cfg.Network, context.Background()
		payer, sender := chain.Accounts[2], gasAccount(t)
		snap, err := chain.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		base := head(t)
		r := start(t, cfg)
		old := payOnce(t, payer, sender, 7_000)
		mine(t, 2)
		oldHead := head(t)
		r.waitCursor(t, oldHead, 10*time.Second)
		if err := chain.Revert(ctx, snap); err != nil {
			t.Fatal(err)
		}
		replacement := payOnce(t, payer, sender, 8_000)
		mine(t, int(oldHead-base)+2)
		newHead := head(t)
		r.waitFor(t, "a reorg and the new head", 20*time.Second, func(s indexer.Health) bool { return s.Reorgs >= 1 && s.Cursor >= newHead })
		checkReorged(t, network, cfg, old, replacement, newHead)
	})

	t.Run("deeper than the window", func(t *testing.T) {
		cfg := freshConfig(t)
		network, ctx := cfg.Network, context.Background()
		r := start(t, cfg)
		payer, sender := chain.Accounts[4], gasAccount(t)

		snap, err := chain.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		old := payOnce(t, payer, sender, 5_000)
		mine(t, 150) // the window is max(2*2, 128) blocks
		oldHead := head(t)
		r.waitCursor(t, oldHead, 20*time.Second)
		if err := r.ix.Ready(1); err != nil {
			t.Fatalf("caught up, the indexer is not ready: %v", err)
		}
		if err := chain.Revert(ctx, snap); err != nil {
			t.Fatal(err)
		}
		payOnce(t, payer, sender, 6_000)
		mine(t, 160)
		select {
		case <-r.ix.Done():
			if err := r.ix.Err(); !errors.Is(err, indexer.ErrDeepReorg) {
				t.Fatalf("the indexer stopped with %v, want ErrDeepReorg", err)
			}
			t.Logf("Run: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatalf("the indexer did not stop on a reorg deeper than its window; status %+v", r.ix.Health())
		}
		// Stopped is what /readyz reports, whatever the lag bound.
		if st := r.ix.Health(); !st.Stopped {
			t.Errorf("status %+v after stopping, want Stopped", st)
		}
		if err := r.ix.Ready(0); err == nil || err.Error() != "stopped" {
			t.Errorf("Ready after stopping: %v, want stopped", err)
		}
		// It stopped without touching what it had: the old branch's rows are still there, for an
		// operator to look at.
		if tr, au := indexedTx(t, network, old.tx); tr != 1 || au != 1 {
			t.Errorf("after the deep reorg the old authorization has %d transfer and %d authorization rows", tr, au)
		}
		var cursor int64
		if err := pool.QueryRow(ctx, `SELECT number FROM index_cursors WHERE network = $1`, network).Scan(&cursor); err != nil || uint64(cursor) != oldHead {
			t.Errorf("cursor %d (%v), want it left at %d", cursor, err, oldHead)
		}
	})
}

// checkReorged checks the index after a reorg that dropped old and brought replacement: old's rows
// are gone, replacement's are there, nothing is stored above the head, the kept window is the
// canonical chain, and every row matches eth_getLogs.
func checkReorged(t *testing.T, network string, cfg indexer.Config, old, replacement settled, newHead uint64) {
	t.Helper()
	if receiptOf(t, old.tx) != nil {
		t.Fatalf("the old authorization's transaction %s is still on the chain", old.tx)
	}
	if used, err := chain.USDC.AuthorizationState(context.Background(), old.payer, old.nonce); err != nil || used {
		t.Fatalf("the old authorization's nonce is used on the new branch (%v, %v)", used, err)
	}
	if tr, au := indexedTx(t, network, old.tx); tr != 0 || au != 0 {
		t.Errorf("the reorged-out authorization still has %d transfer and %d authorization rows", tr, au)
	}
	if tr, au := indexedTx(t, network, replacement.tx); tr != 1 || au != 1 {
		t.Errorf("the new branch's transfer has %d transfer and %d authorization rows, want 1 and 1", tr, au)
	}
	var above int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transfers WHERE network = $1 AND block_number > $2)
		+ (SELECT count(*) FROM authorization_events WHERE network = $1 AND block_number > $2)`, network, int64(newHead)).Scan(&above); err != nil {
		t.Fatal(err)
	}
	if above != 0 {
		t.Errorf("%d rows above the head %d", above, newHead)
	}
	checkWindow(t, network)
	c := compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, newHead)
	if c.used != 1 || c.transfers != 1 {
		t.Errorf("blocks %d..%d hold %+v, want the one replacement transfer", cfg.StartBlock, newHead, c)
	}
}

func mustUint(t testing.TB, v any) uint64 {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("not a quantity: %v", v)
	}
	n, err := hexutil.DecodeUint64(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// reorgObserver records the reorgs an indexer reports, as "<network> <depth>", and its beats.
type reorgObserver struct {
	mu    sync.Mutex
	seen  []string
	beats []beat
}

type beat struct {
	loop, network string
	at            time.Time
}

func (o *reorgObserver) Beat(loop, network string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.beats = append(o.beats, beat{loop, network, at})
}

func (o *reorgObserver) beaten() []beat {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.beats)
}

func (o *reorgObserver) Reorg(network string, depth uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, fmt.Sprintf("%s %d", network, depth))
}

// wait returns what was observed once something was, or after d.
func (o *reorgObserver) wait(t *testing.T, d time.Duration) []string {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		o.mu.Lock()
		seen := slices.Clone(o.seen)
		o.mu.Unlock()
		if len(seen) > 0 || time.Now().After(deadline) {
			return seen
		}
	}
}
