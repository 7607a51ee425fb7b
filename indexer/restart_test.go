package indexer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestRestartResumes stops indexers (once at the head, once in the middle of a backfill) and
// starts new instances on the same database while the chain moves on: each resumes from the
// stored cursor, and in the end the index is exactly eth_getLogs, with no gap and no duplicate.
func TestRestartResumes(t *testing.T) {
	cfg := freshConfig(t)
	network := cfg.Network
	sender := gasAccount(t)
	pay := func(n int) {
		for i := range n {
			payOnce(t, chain.Accounts[5+i%3], sender, int64(100+i))
		}
	}

	// 1. Index to the head and stop.
	first := start(t, cfg)
	pay(10)
	first.waitCursor(t, head(t), 10*time.Second)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	st1 := first.ix.Health()

	// 2. While no indexer runs, transfers and enough blocks that the next instance backfills.
	pay(10)
	mine(t, 300)
	pay(10)
	mine(t, 5)
	top := head(t)

	// A second instance, one block per getLogs so it is stopped mid-backfill.
	slow := cfg
	slow.InitialRange, slow.MaxRange = 1, 1
	second := start(t, slow)
	mid := st1.Cursor + (top-st1.Cursor)/2
	second.waitCursor(t, mid, 30*time.Second)
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	st2 := second.ix.Health()
	if st2.Cursor >= top-128 {
		t.Fatalf("the second instance got to %d, past its backfill (head %d): cannot test a stop mid-backfill", st2.Cursor, top)
	}

	// 3. A third instance, with more transfers arriving while it catches up.
	third := start(t, cfg)
	pay(5)
	top = head(t)
	st3 := third.waitCursor(t, top, 30*time.Second)
	if err := third.stop(); err != nil {
		t.Fatal(err)
	}

	c := compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, top)
	t.Logf("cursors: first stopped at %d (%d events), second at %d (%d events), third reached %d (%d events); chain %d..%d holds %+v",
		st1.Cursor, st1.Events, st2.Cursor, st2.Events, st3.Cursor, st3.Events, cfg.StartBlock, top, c)
	if c.used != 35 || c.transfers != 35 {
		t.Errorf("the chain holds %+v, want 35 authorizations", c)
	}
	if got := st1.Events + st2.Events + st3.Events; got != int64(c.total()) {
		t.Errorf("the three instances indexed %d events between them, the chain has %d (a gap or a duplicate)", got, c.total())
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transfers WHERE network = $1)
		+ (SELECT count(*) FROM authorization_events WHERE network = $1)`, network).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != c.total() {
		t.Errorf("%d rows stored for the network, the chain has %d events", rows, c.total())
	}
	checkWindow(t, network)
	if st1.Reorgs+st2.Reorgs+st3.Reorgs != 0 {
		t.Errorf("reorgs reported on a chain that never reorganised: %d, %d, %d", st1.Reorgs, st2.Reorgs, st3.Reorgs)
	}
}

// TestRestartAfterReorg: the chain reorganises the last indexed blocks while no indexer runs. The
// next instance must notice whether it resumes inside the unfinalized window (a few blocks later)
// or far behind the head (backfill).
func TestRestartAfterReorg(t *testing.T) {
	for _, c := range []struct {
		name  string
		later int // blocks mined on the new branch while stopped
	}{
		{"resuming in the window", 5},
		// Backfilling from a cursor whose block was reorganised away must notice it first.
		{"resuming with a backfill", 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := freshConfig(t)
			network, ctx := cfg.Network, context.Background()
			payer, sender := chain.Accounts[5], gasAccount(t)
			first := start(t, cfg)
			mine(t, 3)
			first.waitCursor(t, head(t), 5*time.Second)
			snap, err := chain.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			old := payOnce(t, payer, sender, 9_000)
			mine(t, 2)
			first.waitCursor(t, head(t), 5*time.Second)
			if err := first.stop(); err != nil {
				t.Fatal(err)
			}

			if err := chain.Revert(ctx, snap); err != nil {
				t.Fatal(err)
			}
			replacement := payOnce(t, payer, sender, 10_000)
			mine(t, c.later)
			top := head(t)
			second := start(t, cfg)
			st := second.waitCursor(t, top, 20*time.Second)
			t.Logf("old authorization in %d, first cursor %d; replacement in %d; second instance: %+v", old.block, first.ix.Health().Cursor, replacement.block, st)
			checkReorged(t, network, cfg, old, replacement, top)
		})
	}
}

// TestStoppedIndexerRefuses: Stop ends the loop (Done closes, no error), and a stopped indexer
// does not start again: Start answers ErrClosed.
func TestStoppedIndexerRefuses(t *testing.T) {
	r := start(t, config(bindNetwork(t)))
	r.waitCursor(t, head(t), 10*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.ix.Done():
	default:
		t.Fatal("Done is not closed after Stop")
	}
	if err := r.ix.Err(); err != nil {
		t.Fatalf("Err after a plain Stop: %v", err)
	}
	if err := r.ix.Start(context.Background()); !errors.Is(err, facilitator.ErrClosed) {
		t.Fatalf("Start after Stop: %v, want ErrClosed", err)
	}
}
