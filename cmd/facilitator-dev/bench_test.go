package main

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBenchEndToEnd runs 'facilitator-dev bench' briefly (tiny K, 1 s of /verify, a short ceiling, a
// 2,000-event backfill) against the production binary on a fresh chain, the official facilitator
// included, so that the command cannot rot. The figures are not checked, only that every phase
// ran and was counted. The backfill writes into the facilitator's own test database under its
// '#bench-' network id, which is what keeps it apart from the ledger.
func TestBenchEndToEnd(t *testing.T) {
	dbURL, chain := requireStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// The stack 'facilitator-dev dev' serves: the production binary, no rate limits, webhooks
	// to loopback (the bench's receiver is there).
	m, err := startServe(ctx, stackConfig{Binary: facilitatorBin(t), Listen: "127.0.0.1:0", DBURL: dbURL, LogLevel: "warn",
		Chain: chain, Signers: []*ecdsa.PrivateKey{chain.Accounts[0].Key}}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	var stdout, stderr stacktest.SyncBuffer
	code := run(ctx, []string{"bench", "--url", "http://" + m.Addr, "--rpc", chain.RPCURL, "--duration", "1s",
		"--verify-rates", "20,max", "--verify-n", "100",
		"--k", "8", "--webhook-k", "6", "--k-ref", "4", "--c", "4", "--verify-c", "4", "--replays", "5",
		"--ceiling-n", "20", "--ceiling-batch", "10", "--ceiling-window", "20", "--ceiling-inflight", "4",
		"--backfill-events", "2000", "--database-url", dbURL, "--facilitator-database-url", dbURL},
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
		"(pid ", // memory was sampled (the facilitator child listening on --url's port)
		"events stored / emitted  2000 / 2000",
		"#bench-", // the backfill's own network id
		"per confirmed settlement (8 ops; official 4)",
		// /verify at a fixed rate and then in a closed loop, each on payments verified once.
		"/verify by arrival rate: distinct payments, each verified once",
		"20/s offered (at most 4 outstanding)",
		"with no request before the first rate: CPU ms per second",
		"concurrency 4, ",
		"facilitator + chain node + Postgres CPU",
		"per status lookup (",
		"gas per settlement",
		"backends of our database counted",
		// Every event of the webhook phase's 6 payments, exactly once and signed.
		"events delivered / expected  18 / 18",
		"missing / duplicate deliveries / bad signatures  0 / 0 / 0",
		"per delivered webhook event (", // 18 and the earlier phases' late ones
	} {
		if !strings.Contains(squeeze(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Every process was measured on both sides (the official has no database), and a settlement's
	// gas is that of a transferWithAuthorization: more than the 21,000 base, less than its limit.
	hooks := false // within the webhook phase's CPU rows: ours only, Postgres included
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if strings.Contains(l, "per delivered webhook event") {
			hooks = true
			continue
		}
		if hooks && !strings.HasPrefix(l, "    ") {
			hooks = false
		}
		switch {
		case hooks && !strings.Contains(l, "sum of the measured"):
			// The whole phase's figure and the one beyond its settlements.
			if strings.Count(l, " ms") != 2 {
				t.Errorf("a process without two webhook figures: %q", l)
			}
		case strings.Contains(l, "n/a (no status API)"):
			// Status lookups are ours only.
		case strings.HasPrefix(strings.TrimSpace(l), "facilitator ") && len(f) >= 5,
			strings.HasPrefix(strings.TrimSpace(l), "chain node (anvil)"),
			strings.HasPrefix(strings.TrimSpace(l), "load generator (this process)"):
			if strings.Count(l, " ms") != 2 {
				t.Errorf("a process without two figures: %q", l)
			}
		case strings.HasPrefix(strings.TrimSpace(l), "Postgres (our database's backends)"):
			if !strings.Contains(l, " ms") || !strings.Contains(l, "n/a (no database)") {
				t.Errorf("Postgres: %q", l)
			}
		case strings.HasPrefix(strings.TrimSpace(l), "gas per settlement"):
			var ours, ref float64
			if _, err := fmt.Sscan(strings.Join(f[len(f)-3:], " "), &ours, &ref); err != nil || ours < 21000 || ours > 150000 || ref < 21000 || ref > 150000 {
				t.Errorf("gas per settlement: %q (%v)", l, err)
			}
		}
	}
}

func TestParseRates(t *testing.T) {
	got, err := parseRates("50, 12.5,max")
	if err != nil || len(got) != 3 || got[0] != 50 || got[1] != 12.5 || got[2] != 0 {
		t.Fatalf("parseRates = %v, %v; want [50 12.5 0]", got, err)
	}
	for _, bad := range []string{"", "0", "-5", "fast", "50,,max", "Inf"} {
		if _, err := parseRates(bad); err == nil {
			t.Errorf("parseRates(%q) took it", bad)
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
