package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The operations overview's reads (ops/): aggregates over every replica's ledger, each one
// statement over an indexed time range.

// SettlementsPerMinute counts the settlements created since since, by minute of creation and
// current state.
func (db *DB) SettlementsPerMinute(ctx context.Context, since time.Time) ([]facilitator.MinuteCount, error) {
	rows, err := db.pool.Query(ctx, `SELECT date_trunc('minute', created_at), state, count(*) FROM settlements
		WHERE created_at >= $1 GROUP BY 1, 2 ORDER BY 1, 2`, since)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []facilitator.MinuteCount
	for rows.Next() {
		var m facilitator.MinuteCount
		var state string
		if err := rows.Scan(&m.Minute, &state, &m.Count); err != nil {
			return nil, err
		}
		m.State = facilitator.State(state)
		out = append(out, m)
	}
	return out, rows.Err()
}

// SettlementTimes is the p50/p90/p99 of how long the settlements created since since took from
// their row (signed) to their first mined and first final event, computed in Postgres.
func (db *DB) SettlementTimes(ctx context.Context, since time.Time) (facilitator.SettlementTimes, error) {
	var t facilitator.SettlementTimes
	var mined, final []float64
	err := db.pool.QueryRow(ctx, `WITH s AS (
			SELECT extract(epoch FROM (SELECT min(e.at) FROM settlement_events e WHERE e.settlement_id = s.id AND e.state = 'mined') - s.created_at) AS mined,
			       extract(epoch FROM (SELECT min(e.at) FROM settlement_events e WHERE e.settlement_id = s.id AND e.state = 'final') - s.created_at) AS final
			FROM settlements s WHERE s.created_at >= $1)
		SELECT count(mined), percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY mined) FILTER (WHERE mined IS NOT NULL),
		       count(final), percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY final) FILTER (WHERE final IS NOT NULL)
		FROM s`, since).Scan(&t.ToMined.Count, &mined, &t.ToFinal.Count, &final)
	if err != nil {
		return t, err
	}
	fill := func(p *facilitator.Percentiles, secs []float64) {
		if len(secs) == 3 {
			p.P50, p.P90, p.P99 = seconds(secs[0]), seconds(secs[1]), seconds(secs[2])
		}
	}
	fill(&t.ToMined, mined)
	fill(&t.ToFinal, final)
	return t, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// WebhookDeliveryCounts counts the deliveries created since since by result, and by the class of the
// receiver's last HTTP status.
func (db *DB) WebhookDeliveryCounts(ctx context.Context, since time.Time) (facilitator.DeliveryCounts, error) {
	c := facilitator.DeliveryCounts{ByStatusClass: map[string]int{}}
	rows, err := db.pool.Query(ctx, `SELECT
			CASE WHEN delivered_at IS NOT NULL THEN 'delivered' WHEN gave_up_at IS NOT NULL THEN 'gave_up' ELSE 'retrying' END,
			COALESCE((last_status / 100)::text || 'xx', 'none'), count(*)
		FROM webhook_deliveries WHERE created_at >= $1 GROUP BY 1, 2`, since)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	for rows.Next() {
		var result, class string
		var n int
		if err := rows.Scan(&result, &class, &n); err != nil {
			return c, err
		}
		switch result {
		case "delivered":
			c.Delivered += n
		case "gave_up":
			c.GaveUp += n
		default:
			c.Retrying += n
		}
		c.ByStatusClass[class] += n
	}
	return c, rows.Err()
}

// RecentSettled lists the newest mined or final settlements, at most limit, newest first.
func (db *DB) RecentSettled(ctx context.Context, limit int) ([]facilitator.Settlement, error) {
	return db.settlements(ctx, `SELECT `+settlementColumns+` FROM settlements
		WHERE state IN ('mined', 'final') ORDER BY id DESC LIMIT $1`, limit)
}

// RecordReconcileRun writes a run's row and, in the same statement, deletes the rows beyond the
// newest keep or older than keepFor: the table stays bounded without a job of its own.
func (db *DB) RecordReconcileRun(ctx context.Context, r facilitator.ReconcileRun, keep int, keepFor time.Duration) error {
	if r.Job == "" || keep <= 0 || keepFor <= 0 {
		return errors.New("postgres: a reconcile run needs a job and a retention")
	}
	changed, err := json.Marshal(r.Changed)
	if err != nil {
		return err
	}
	var errText *string
	if r.Error != "" {
		s := facilitator.StripURLs(r.Error)
		errText = &s
	}
	_, err = db.pool.Exec(ctx, `WITH ins AS (
			INSERT INTO reconcile_runs (job, network, started_at, finished_at, examined, changed, error)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id)
		DELETE FROM reconcile_runs WHERE started_at < $8
			OR id <= (SELECT id FROM reconcile_runs ORDER BY id DESC OFFSET $9 LIMIT 1)`,
		r.Job, r.Network, r.Started, r.Finished, r.Examined, changed, errText, r.Finished.Add(-keepFor), keep-1)
	return err
}

// ReconcileRuns lists the newest runs, at most limit, newest first.
func (db *DB) ReconcileRuns(ctx context.Context, limit int) ([]facilitator.ReconcileRun, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, job, network, started_at, finished_at, examined, changed, COALESCE(error, '')
		FROM reconcile_runs ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []facilitator.ReconcileRun
	for rows.Next() {
		var r facilitator.ReconcileRun
		var changed []byte
		if err := rows.Scan(&r.ID, &r.Job, &r.Network, &r.Started, &r.Finished, &r.Examined, &changed, &r.Error); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(changed, &r.Changed); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// StuckSettlement is a settlement still owed an outcome, with its age by the database's clock
// (every replica's rows, whatever their clocks say).
type StuckSettlement struct {
	facilitator.Settlement
	Age time.Duration
}

// StuckSettlements lists the settlements of every network still owed an outcome (signed,
// broadcast, or mined and not yet final) that were signed longer than olderThan ago, by state,
// oldest first, at most limit of them; with signer, only that key's (what a retiring key has left).
// The open rows are few whatever the ledger's size: the scan is of the partial index on them
// (settlements_updated, migration 0005).
func (db *DB) StuckSettlements(ctx context.Context, olderThan time.Duration, limit int, signer *common.Address) ([]StuckSettlement, error) {
	var only []byte
	if signer != nil {
		only = signer.Bytes()
	}
	rows, err := db.pool.Query(ctx, `SELECT `+settlementColumns+`, EXTRACT(EPOCH FROM now() - created_at)::float8
		FROM settlements
		WHERE state IN ('signed', 'broadcast', 'mined') AND created_at < now() - make_interval(secs => $1)
			AND ($3::bytea IS NULL OR signer = $3)
		ORDER BY array_position(ARRAY['signed', 'broadcast', 'mined'], state), created_at, id
		LIMIT $2`, olderThan.Seconds(), limit, only)
	if err != nil {
		return nil, fmt.Errorf("postgres: stuck settlements: %w", err)
	}
	defer rows.Close()
	var out []StuckSettlement
	for rows.Next() {
		var age float64
		s, err := scanSettlementWith(rows, &age)
		if err != nil {
			return nil, fmt.Errorf("postgres: stuck settlements: %w", err)
		}
		out = append(out, StuckSettlement{Settlement: *s, Age: seconds(age)})
	}
	return out, rows.Err()
}
