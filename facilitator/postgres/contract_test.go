package postgres_test

import (
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"

	"github.com/x402-facilitator/x402-facilitator/settle/ledgertest"
)

// TestLedgerContract holds the Postgres ledger to the contract the simulator's ledger is held to
// (settle/settlesim runs the same suite): the two must not differ in anything the engine, the
// reconcile jobs or the status answers rely on.
func TestLedgerContract(t *testing.T) { ledgertest.Run(t, pgHarness) }

var pgHarness = ledgertest.Harness{
	New: func(t *testing.T) (ledgertest.Ledger, string) {
		l := newLedgerFixture(t, time.Minute)
		return l.db, l.network
	},
	Events: func(t *testing.T, l ledgertest.Ledger, id int64) []string {
		evs, err := l.(*postgres.DB).SettlementEvents(t.Context(), id, 0, []string{"signed", "broadcast", "mined", "final", "reverted",
			"expired", "settled_elsewhere", "canceled", "bumped", "renonced"}, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range evs {
			out = append(out, string(ev.State))
		}
		return out
	},
	// updated_at is the server's now(); this machine's clock is the server's.
	Now:  func(ledgertest.Ledger) time.Time { return time.Now() },
	Pass: func(_ ledgertest.Ledger, d time.Duration) { time.Sleep(d) },
}
