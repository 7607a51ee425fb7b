package postgres_test

import (
	"os"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/settle"

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
	// Two processes as Postgres knows them: each lease is a session of its own, so one handle
	// serves both (a lock is the session's, not the handle's).
	Leasers: func(t *testing.T, l ledgertest.Ledger) (a, b settle.Leaser) {
		return l.(*postgres.DB), openTestDB(t)
	},
	Cut: func(t *testing.T, _ ledgertest.Ledger, network string, signer common.Address) {
		conn, err := pgx.Connect(t.Context(), os.Getenv("TEST_DATABASE_URL"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(t.Context())
		var cut bool
		if err := conn.QueryRow(t.Context(), `SELECT pg_terminate_backend(session_pid) FROM signer_leases WHERE network = $1 AND signer = $2`,
			network, signer.Bytes()).Scan(&cut); err != nil || !cut {
			t.Fatalf("Cut: terminating the lease's session: %v (terminated %v)", err, cut)
		}
	},
}

// TestIndexContract holds Postgres's index to the contract the simulator's index store is held to.
func TestIndexContract(t *testing.T) {
	ledgertest.RunIndex(t, ledgertest.IndexHarness{
		New: func(t *testing.T) (ledgertest.Index, string) {
			l := newLedgerFixture(t, time.Minute)
			return l.db, l.network
		},
	})
}
