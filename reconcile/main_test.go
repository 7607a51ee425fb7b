package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The package's tests share one anvil with real USDC and one database of their own, with one
// network id. They do not run in parallel: several move the chain's clock, mine on demand or
// reorganise it, and the index has one cursor per network.
var env *stacktest.Env

func TestMain(m *testing.M) {
	stacktest.Main(m, "reconcile", func(e *stacktest.Env) int { env = e; return m.Run() })
}

// later is the jobs' clock: an hour ahead, so every open settlement counts as stale (no engine
// is working on them in these tests: their engines were stopped, the process "died").
func later() time.Time { return time.Now().Add(time.Hour) }

// jobs builds the reconcile jobs over the shared chain and database.
func jobs(t testing.TB, depth uint64, now func() time.Time) *reconcile.Jobs {
	t.Helper()
	return reconcile.New(reconcile.Config{
		Store:      env.DB,
		Networks:   []reconcile.Network{{Network: network(facilitator.Finality{Depth: depth}), Chain: env.Chain.RPC}},
		StaleAfter: time.Minute,
		Now:        now,
		Logger:     stacktest.Logger(t),
	})
}

// network is the env's network with the finality rule rule.
func network(rule facilitator.Finality) facilitator.Network {
	n := env.Network()
	n.Finality = rule
	return n
}

// runSettlements runs the Settlements job once and fails the test on an error.
func runSettlements(t testing.TB, j *reconcile.Jobs) reconcile.Changes {
	t.Helper()
	ch, err := j.Settlements(context.Background())
	if err != nil {
		t.Fatalf("Settlements: %v (changes %+v)", err, ch)
	}
	t.Logf("Settlements: %+v", ch)
	return ch
}

// pendingDeadline is the engines' deadline here: short, so that with mining off they answer
// settlement_pending soon and leave the settlement to the jobs.
const pendingDeadline = time.Second
