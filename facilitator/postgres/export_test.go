package postgres

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// ExplainList is the plan of a list query, for the tests that show which index it uses.
func (db *DB) ExplainList(ctx context.Context, v facilitator.Viewer, f facilitator.SettlementFilter, p facilitator.Page) (string, error) {
	q, args := settlementList(v, f, p)
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	// A test's table is small enough for a sequential scan to win; the question is whether the
	// index serves the query's order and conditions, as it must on a ledger of millions of rows.
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off`); err != nil {
		return "", err
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+q, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// SettlementByKeySQL is SettlementByKey's statement, for the plan tests.
const SettlementByKeySQL = settlementByKeySQL
