package main

import (
	"context"
	"testing"
	"time"
)

// TestTwoProviders: a network served by two honest providers and a third that answers wrong
// receipts (every mined transaction "reverted", logging nothing), at the default quorum of two.
// Settlements stay exactly-once and no payment gets a wrong terminal answer: every outcome rests on
// reads two providers agree on, and the disagreements are counted. Then the liar goes down (every
// request refused, as a rate-limited or failing provider does) and settling goes on through the
// two left. (With two providers and a quorum of two, one provider that lies or is down holds every
// outcome pending: docs/configuration.md, "Several RPC providers".)
func TestTwoProviders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	dbURL, chain := faultStack(ctx, t, "two_providers")
	bin := buildFacilitator(ctx, t)
	liar, liarURL := newLaggyRPC(t, chain.RPCURL)
	_, honestURL := newLaggyRPC(t, chain.RPCURL) // a second honest provider: no faults set, it passes through
	load := newFaultLoad(ctx, t, chain, 8)
	load.terminal, load.retryCap = true, 5*time.Second
	env := serveEnv(t, dbURL, chain, chain.RPCURL, load.key)
	env["FACILITATOR_NETWORKS"] = withRPCs(t, withFinality(t, env["FACILITATOR_NETWORKS"], 3), honestURL, liarURL)
	env["FACILITATOR_LOG_LEVEL"] = "info"
	c := startServe(ctx, t, bin, env, "facilitator") // its start-up checks see three honest endpoints

	drive := func(what string, payments int64, faults *laggyFaults) {
		t.Helper()
		liar.set(faults)
		load.limit = int64(len(load.payments)) + payments
		load.issued.Store(int64(len(load.payments)))
		// A bound on liveness, not a speed check: alone this takes 20-30 s; a loaded 2-core machine
		// has needed more than 90.
		driveCtx, stop := context.WithTimeout(ctx, 150*time.Second)
		load.drive(driveCtx, func() *child { return c }, 6, nil).Wait()
		stop()
		rep := auditLedger(ctx, t, load.auditInput(dbURL))
		wrong := load.wrongAnswers(rep)
		doubled := doublyCarried(t, minedSignerTxs(ctx, t, chain, load.signer))
		t.Logf("%s: %s; ledger audit: %s; lying provider: %s", what, load.summary(), rep, liar)
		if len(wrong)+len(doubled)+rep.discrepancies > 0 || load.refused.Load() > 0 || load.failures.Load() > 0 {
			t.Fatalf("%s: %d wrong answers, %d doubly-carried authorizations, %d ledger discrepancies, %d answers not allowed, %d failures",
				what, len(wrong), len(doubled), rep.discrepancies, load.refused.Load(), load.failures.Load())
		}
		for _, p := range load.payments {
			if !p.answered() {
				t.Fatalf("%s: a payment got no definite answer: %v", what, p.key)
			}
		}
	}

	drive("one provider lying about receipts", 30, &laggyFaults{Revert: 1})
	if liar.reverted.Load() == 0 {
		t.Fatal("the lying provider was never asked for a receipt")
	}
	fams := scrape(t, c.base)
	if f, ok := fams["facilitator_rpc_disagreements_total"]; !ok || f.GetMetric()[0].GetCounter().GetValue() == 0 {
		t.Fatalf("no disagreement counted while one provider lied (%d receipts rewritten)", liar.reverted.Load())
	}

	drive("one provider down", 15, &laggyFaults{Error: 1})
	fams = scrape(t, c.base)
	up := map[string]float64{}
	for _, m := range fams["facilitator_rpc_endpoint_up"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "endpoint" {
				up[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if up["rpc0"] != 1 || up["rpc1"] != 1 || up["rpc2"] != 0 {
		t.Fatalf("endpoint health with rpc2 refusing everything: %v", up)
	}
	liar.set(nil)
	c.stop(t)
}

// withRPCs adds more RPC endpoints to every network of a FACILITATOR_NETWORKS value.
func withRPCs(t *testing.T, networks string, urls ...string) string {
	t.Helper()
	return editNetworks(t, networks, func(n map[string]any) { n["rpcs"] = urls })
}
