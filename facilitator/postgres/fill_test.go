package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// The synthetic ledger is whole settlements: every row has its transaction, its four events, its
// indexed logs, and every other one a payment id, all under the fill's own network id.
func TestFillSynthetic(t *testing.T) {
	db := openTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	network := fmt.Sprintf("fill:%d", time.Now().UnixNano())
	var progress []int
	if err := db.FillSynthetic(ctx, postgres.Fill{Network: network, Rows: 2500, Chunk: 1000, Payers: 50, Payees: 10,
		Progress: func(n int) { progress = append(progress, n) }}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(progress) != "[1000 2000 2500]" {
		t.Errorf("progress %v", progress)
	}
	conn, err := pgx.Connect(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	count := func(q string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, q, network).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	for q, want := range map[string]int{
		`SELECT count(*) FROM settlements WHERE network = $1 AND state = 'final'`:                                                                                     2500,
		`SELECT count(*) FROM settlements s JOIN settlement_txs t ON t.settlement_id = s.id AND t.tx_hash = s.tx_hash WHERE network = $1`:                             2500,
		`SELECT count(*) FROM settlement_events e JOIN settlements s ON s.id = e.settlement_id WHERE network = $1`:                                                    10000,
		`SELECT count(*) FROM payment_ids p JOIN settlements s ON s.id = p.settlement_id WHERE network = $1`:                                                          1250,
		`SELECT count(*) FROM transfers t JOIN settlements s ON s.tx_hash = t.tx_hash AND s.payer = t.from_addr WHERE t.network = $1 AND s.network = $1`:              2500,
		`SELECT count(*) FROM authorization_events a JOIN settlements s ON s.auth_nonce = a.nonce AND s.payer = a.authorizer WHERE a.network = $1 AND s.network = $1`: 2500,
		`SELECT count(DISTINCT payer) FROM settlements WHERE network = $1`:                                                                                            50,
	} {
		if got := count(q); got != want {
			t.Errorf("%s: %d, want %d", q, got, want)
		}
	}
	if err := db.FillSynthetic(ctx, postgres.Fill{Network: network}); err == nil {
		t.Error("a fill of no rows was accepted")
	}
}
