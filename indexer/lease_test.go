package indexer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestLeaseFailover runs two indexers for one network, as two replicas would (each with its own
// database handle): one leads, the other waits; when the leader stops, the other takes over from
// the cursor, and the index stays exactly eth_getLogs. Only the leader beats (on its clock): a
// waiting replica's silence is not a stall, and a stuck leader's is.
func TestLeaseFailover(t *testing.T) {
	cfg := freshConfig(t)
	network := cfg.Network
	sender := gasAccount(t)
	skew := 48 * time.Hour
	cfg.Now = func() time.Time { return time.Now().Add(skew) }
	obsA, obsB := &reorgObserver{}, &reorgObserver{}
	cfg.Observer = obsA

	otherDB, err := postgres.Open(context.Background(), dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(otherDB.Close)

	a := start(t, cfg)
	a.waitFor(t, "a to lead", 5*time.Second, func(s indexer.Health) bool { return s.Leader })
	cfgB := cfg
	cfgB.Store = otherDB
	cfgB.Observer = obsB
	b := start(t, cfgB)

	p := payOnce(t, chain.Accounts[9], sender, 1)
	a.waitCursor(t, p.block, 5*time.Second)
	time.Sleep(1500 * time.Millisecond) // b tries the lease every second
	if st := b.ix.Health(); st.Leader || st.Events != 0 {
		t.Fatalf("the replica leads or indexes while the leader runs: %+v", st)
	}
	if got := obsB.beaten(); len(got) != 0 {
		t.Fatalf("the waiting replica beat: %+v", got)
	}
	beats := obsA.beaten()
	if len(beats) == 0 {
		t.Fatal("the leader never beat")
	}
	for _, bt := range beats {
		if bt.loop != indexer.LoopIndexer || bt.network != network || bt.at.Before(time.Now().Add(skew-time.Minute)) {
			t.Fatalf("leader's beat %+v, want loop %s on %s at the indexer's clock", bt, indexer.LoopIndexer, network)
		}
	}

	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	b.waitFor(t, "b to take over", 5*time.Second, func(s indexer.Health) bool { return s.Leader })
	for deadline := time.Now().Add(5 * time.Second); len(obsB.beaten()) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the new leader does not beat")
		}
	}
	t.Logf("the replica took over %s after the leader stopped", time.Since(stoppedAt).Round(time.Millisecond))
	p = payOnce(t, chain.Accounts[9], sender, 2)
	b.waitCursor(t, p.block, 5*time.Second)
	c := compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, p.block)
	if c.used != 2 {
		t.Errorf("indexed %+v, want 2 authorizations", c)
	}
	if got := a.ix.Health().Events + b.ix.Health().Events; got != int64(c.total()) {
		t.Errorf("the two indexed %d events between them, the chain has %d", got, c.total())
	}
}

// TestSlowCommitKeepsLease: a commit that takes a few seconds (here, blocked by a table lock; in
// production, a large COPY or a busy database) must not cost the leader its lease.
func TestSlowCommitKeepsLease(t *testing.T) {
	cfg := freshConfig(t)
	logs := &stacktest.SyncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	sender := gasAccount(t)
	r := start(t, cfg)
	p := payOnce(t, chain.Accounts[9], sender, 1)
	r.waitCursor(t, p.block, 5*time.Second)

	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `LOCK TABLE transfers IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	p = payOnce(t, chain.Accounts[9], sender, 2)
	time.Sleep(3 * time.Second) // the indexer's commit of p waits for the lock
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitCursor(t, p.block, 10*time.Second)
	time.Sleep(2 * time.Second)
	if s := logs.String(); strings.Contains(s, "lost the indexer lease") || strings.Contains(s, "step failed") {
		t.Errorf("a slow commit cost the lease:\n%s", s)
	}
}
