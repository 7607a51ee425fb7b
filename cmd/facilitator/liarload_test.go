package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The liar load's size: small enough for CI on two cores (each run takes about a minute), large
// enough that every lie is told many times.
const (
	liarLoadPayments = 100
	liarLoadWorkers  = 8
	// liarLoadDrive bounds driving every payment to a final answer (liveness, not a speed check).
	liarLoadDrive = 150 * time.Second
)

// liarLies are the lying provider's shares in TestFaultProxyLoadLiar. It invents a receipt every
// time it can: with blocks a second apart the engine asks for a pending transaction's receipt only
// a few times a run (3 or 4 inventions at a share of one half, and none in one CI run, which then
// proved nothing about inventions).
var liarLies = liarShares{Invent: 1, Null: 0.2, Ahead: 0.05, Behind: 0.2}

// TestFaultProxyLoadLiar is TestFaultProxyLoad with a network of three providers at a quorum of
// two: the node itself, the lagging provider (providerFaults) and a liar (liarLies: it invents
// receipts for transactions it has seen sent and not mined, answers null for mined ones, answers a
// head far ahead, and a "finalized" block behind one it answered before). Finality is by the
// "finalized" tag, so that the liar's finalized answers are read. It runs with settlement lone
// and batched (Multicall3), and audits each as TestFaultProxyLoad does, plus (5) successes told
// while the node had not mined the transaction. Every count must be 0; the disagreements the
// engine counted are how often a settlement waited for the quorum.
func TestFaultProxyLoadLiar(t *testing.T) {
	for _, batched := range []bool{false, true} {
		name := "lone"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) { liarLoad(t, name, batched) })
	}
}

func liarLoad(t *testing.T, name string, batched bool) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), liarLoadDrive+3*time.Minute)
	defer cancel()
	dbURL, chain := faultStack(ctx, t, "liar_"+name)
	bin := buildFacilitator(ctx, t)
	laggy, laggyURL := newLaggyRPC(t, chain.RPCURL)
	liar, liarURL := newLiarRPC(t, chain.RPCURL)
	// anvil's "finalized" block is 64 below its head: past that, it is a number the liar can answer
	// behind.
	if err := chain.RPC.CallContext(ctx, nil, "anvil_mine", hexutil.Uint64(80)); err != nil {
		t.Fatal(err)
	}
	load := newFaultLoad(ctx, t, chain, 8)
	load.terminal, load.retryCap, load.limit, load.minedCheck = true, 5*time.Second, liarLoadPayments, true
	// The liar is the first endpoint: a read that one endpoint answers (a receipt still null, say)
	// goes to it, so its inventions reach the engine and only the quorum stands between them and
	// an answer.
	env := serveEnv(t, dbURL, chain, liarURL, load.key)
	networks := withRPCs(t, withFinality(t, env["FACILITATOR_NETWORKS"], proxyLoadFinality), chain.RPCURL, laggyURL)
	env["FACILITATOR_NETWORKS"] = editNetworks(t, networks, func(n map[string]any) {
		n["finalityTag"] = facilitator.TagFinalized
		n["quorum"] = 2
		if batched {
			n["batch"] = map[string]any{"max": 5, "wait": "100ms"}
		}
	})
	env["FACILITATOR_LOG_LEVEL"] = "info"
	env["FACILITATOR_BUMP_AFTER"] = proxyLoadBumpAfter
	env["FACILITATOR_RECONCILE_SCHEDULE"] = "@every 5s"
	env["FACILITATOR_RECONCILE_STALE"] = "10s"
	c := startServe(ctx, t, bin, env, "facilitator") // its start-up checks go through calm providers
	faults, lies := providerFaults, liarLies
	laggy.set(&faults)
	liar.lies.Store(&lies)

	driveStart := time.Now()
	driveCtx, stopDriving := context.WithTimeout(ctx, liarLoadDrive)
	load.drive(driveCtx, func() *child { return c }, liarLoadWorkers, nil).Wait()
	stopDriving()
	driven := time.Since(driveStart)

	// The audit, with both faulty providers still faulty for the facilitator; its reads go to anvil.
	a := load.auditDrive(ctx, t, dbURL, chain, c, laggy.heads)
	var disagreements float64
	for _, m := range scrape(t, c.base)["facilitator_rpc_disagreements_total"].GetMetric() {
		disagreements += m.GetCounter().GetValue()
	}
	// The index, built through the providers that lag and lie: every log up to its cursor.
	index := auditIndex(ctx, t, load.auditInput(dbURL), proxyLoadFinality, time.Minute)
	laggy.set(nil)
	liar.lies.Store(nil)
	c.stop(t)

	rows := []struct {
		what string
		n    int
	}{
		{"wrong terminal answers", len(a.wrong)},
		{"successes before the node mined", int(load.premature.Load())},
		{"authorizations carried twice", len(a.doubled)},
		{fmt.Sprintf("bumps of mined nonces (of %d bumps)", a.bumps), len(a.minedBumps)},
		{"status mismatches", len(a.statuses)},
		{"ledger discrepancies", a.rep.discrepancies},
		{"answers not allowed", int(load.refused.Load())},
		{"index: chain logs missing below its cursor", index.missing},
		{"index: rows the chain does not have", index.unfounded},
	}
	var table strings.Builder
	bad := 0
	for _, r := range rows {
		fmt.Fprintf(&table, "\n  %-44s %d", r.what, r.n)
		bad += r.n
	}
	fmt.Fprintf(&table, "\n  %-44s %.0f disagreements counted (%d pending answers)", "settlements that waited for quorum", disagreements, load.pending.Load())
	t.Logf("liar load, %s: %s; ledger audit: %s%s\nliar: %s\nlagging provider: %s\ndrove for %s, took %s",
		name, load.summary(), a.rep, table.String(), liar, laggy, driven.Round(time.Second), time.Since(began).Round(time.Second))
	if bad > 0 {
		a.evidence(ctx, t)
		t.Fatalf("%s, with one provider of three lying: %s", name, table.String())
	}
	// The run proves something only if the liar lied and the engine noticed. (Batched settlement
	// may not ask for a receipt while its transaction is pending, so there is nothing to invent.)
	if (!batched && liar.invented.Load() == 0) || liar.nulled.Load() == 0 || liar.behindTold.Load() == 0 || disagreements == 0 {
		t.Fatalf("%s: the liar told %s; %.0f disagreements counted: the lies were not put to the engine", name, liar, disagreements)
	}
}
