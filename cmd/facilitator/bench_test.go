package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestBenchEndToEnd runs 'facilitator bench' briefly (tiny K, 1 s of /verify, a short ceiling, a
// 2,000-event backfill) against the real wiring on a fresh chain, the official facilitator
// included, so that the command cannot rot. The figures are not checked, only that every phase
// ran and was counted. The backfill writes into the facilitator's own test database under its
// '#bench-' network id, which is what keeps it apart from the ledger.
func TestBenchEndToEnd(t *testing.T) {
	dbURL, chain := requireStack(t)
	cfg, err := configFor(t, dbURL, chain, chain.Accounts[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	cfg.LogLevel = "warn"
	// As 'facilitator dev' does: no per-client rate limit, or the load would measure the limiter.
	cfg.ClientRate, cfg.ClientBurst = 0, 0
	m := &Main{Config: cfg, Logger: newLogger(t.Output(), "warn", "text")}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	var stdout, stderr syncBuffer
	code := run(ctx, []string{"bench", "--url", "http://" + m.Addr, "--rpc", chain.RPCURL, "--duration", "1s",
		"--k", "8", "--k-ref", "4", "--c", "4", "--verify-c", "4", "--replays", "5",
		"--ceiling-n", "20", "--ceiling-batch", "10", "--ceiling-window", "20", "--ceiling-inflight", "4",
		"--backfill-events", "2000", "--database-url", dbURL},
		func(string) string { return "" }, &stdout, &stderr)
	out := stdout.String()
	t.Log("\n" + out)
	if code != 0 {
		t.Fatalf("bench exited %d: %s", code, stderr.String())
	}
	for _, want := range []string{
		"on-chain transfers (of K)  8 / 8",
		"4 / 4",            // the reference's transfers
		"duplicates  0  0", // nothing paid twice, on either side
		"answered as replays  5 / 5",
		"one per request (20 txs)",
		"batches of 10 (20 txs)",
		"settle rate as % of the ceiling",
		"(pid ", // memory was sampled (here: this test process, which serves the API)
		"events stored / emitted  2000 / 2000",
		"#bench-", // the backfill's own network id
	} {
		if !strings.Contains(squeeze(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// squeeze collapses runs of spaces so that checks do not depend on column widths.
func squeeze(s string) string {
	for strings.Contains(s, "   ") {
		s = strings.ReplaceAll(s, "   ", "  ")
	}
	return s
}
