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
	// The planner's own choice, with the table's own statistics: a test that wants the index
	// chosen fills the table to a realistic size rather than switching sequential scans off.
	rows, err := db.pool.Query(ctx, "EXPLAIN "+q, args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// SettlementByKeySQL is SettlementByKey's statement, for the plan tests.
const SettlementByKeySQL = settlementByKeySQL

// MigrateTo applies the embedded migrations up to version upTo: a ledger as an older release
// left it.
func (db *DB) MigrateTo(ctx context.Context, upTo int) ([]int, error) { return db.migrate(ctx, upTo) }
