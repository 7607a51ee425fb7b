package main

import (
	"context"
	"flag"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

var soakFlag = flag.Duration("soak", 0, "how long TestSoakKill kills the binary under load (default 45s, or SOAK_DURATION)")

// soakDuration is -soak, else SOAK_DURATION, else the CI bound.
func soakDuration(t *testing.T) time.Duration {
	if *soakFlag > 0 {
		return *soakFlag
	}
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		return d
	}
	return 45 * time.Second
}

// TestSoakKill SIGKILLs the real binary again and again, at random moments, under concurrent
// /settle load (half of the payments under a payment identifier), restarting it each time; the
// callers whose request died retry the same payload against the new process. Then it lets the
// last process recover and audits: every transfer on chain has its ledger row, no authorization
// moved money twice, every mined row has its transfer, every success answered is on chain.
// Bounded for CI (-soak / SOAK_DURATION run it longer).
func TestSoakKill(t *testing.T) {
	began := time.Now()
	dur := soakDuration(t)
	ctx, cancel := context.WithTimeout(context.Background(), dur+4*time.Minute)
	defer cancel()
	dbURL, chain := faultStack(ctx, t, "soak")
	bin := buildFacilitator(ctx, t)
	load := newFaultLoad(ctx, t, chain, 4)
	env := serveEnv(t, dbURL, chain, chain.RPCURL, load.key)
	env["FACILITATOR_LOG_LEVEL"] = "info"

	var current atomic.Pointer[child]
	current.Store(startServe(ctx, t, bin, env, "soak-0"))
	stop := make(chan struct{})
	workers := load.drive(ctx, func() *child { return current.Load() }, 6, stop)

	kills := 0
	for time.Since(began) < dur {
		// Kill between 2 and 7 s into each run: mid-request, mid-broadcast, mid-receipt, mid-recovery.
		time.Sleep(2*time.Second + time.Duration(mrand.Int64N(int64(5*time.Second))))
		victim := current.Load()
		victim.kill(t)
		kills++
		current.Store(startServe(ctx, t, bin, env, "soak-"+strconv.Itoa(kills)))
	}
	close(stop)
	workers.Wait()
	if t.Failed() {
		t.FailNow()
	}

	last := current.Load()
	load.settleAll(ctx, last)
	rep := load.audit(ctx, dbURL, last)
	last.stop(t)
	t.Logf("soak: %d kills in %s; %s; audit: %s; took %s", kills, dur, load.summary(), rep, time.Since(began).Round(time.Second))
	if rep.discrepancies != 0 || load.refused.Load() != 0 {
		t.Fatalf("soak: %d discrepancies, %d answers not allowed", rep.discrepancies, load.refused.Load())
	}
}
