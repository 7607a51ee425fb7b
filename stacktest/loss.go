package stacktest

import (
	"context"
	"testing"
)

// LoseSettlements deletes settlements from the ledger with everything that refers to them (their
// transactions, events, payment ids, webhook deliveries), as a failover to an asynchronous standby
// or a restore from an older backup loses the commits that wrote them, while the chain keeps their
// transactions.
func (e *Env) LoseSettlements(t testing.TB, ids ...int64) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`DELETE FROM webhook_deliveries WHERE event_id IN (SELECT id FROM settlement_events WHERE settlement_id = ANY($1))`,
		`DELETE FROM settlement_events WHERE settlement_id = ANY($1)`,
		`DELETE FROM settlement_txs WHERE settlement_id = ANY($1)`,
		`DELETE FROM payment_ids WHERE settlement_id = ANY($1)`,
		`DELETE FROM settlements WHERE id = ANY($1)`,
	} {
		if _, err := e.Pool.Exec(ctx, q, ids); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// LoseIndexAbove rolls the network's block index back to block n, as a restore of the database
// takes the index back in time with the ledger: the indexer re-indexes from there.
func (e *Env) LoseIndexAbove(t testing.TB, n uint64) {
	t.Helper()
	ctx := context.Background()
	network := e.Network().ID
	for _, q := range []string{
		`DELETE FROM transfers WHERE network = $1 AND block_number > $2`,
		`DELETE FROM authorization_events WHERE network = $1 AND block_number > $2`,
		`DELETE FROM index_blocks WHERE network = $1 AND number > $2`,
	} {
		if _, err := e.Pool.Exec(ctx, q, network, int64(n)); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := e.Pool.Exec(ctx, `UPDATE index_cursors SET number = $2,
		hash = (SELECT hash FROM index_blocks WHERE network = $1 AND number = $2) WHERE network = $1`, network, int64(n)); err != nil {
		t.Fatalf("rolling the index cursor back: %v", err)
	}
}
