package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// InsertWebhook stores a webhook unless its owner has limit enabled already. Its cursor starts at
// this statement's snapshot: events of transactions finished before it are not its business,
// those of transactions still running (xid at or above xmin) are. An empty Owner is stored as
// NULL (open mode).
func (db *DB) InsertWebhook(ctx context.Context, w *facilitator.Webhook, limit int) (bool, error) {
	payTo := make([][]byte, 0, len(w.PayTo))
	for _, a := range w.PayTo {
		payTo = append(payTo, a.Bytes())
	}
	// One owner's registrations one at a time (a transaction-scoped lock on the owner): the count
	// and the insert of two concurrent ones would otherwise both see room for one more.
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('x402:webhooks:' || $1, 0))`, w.Owner); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			INSERT INTO webhooks (id, url, secret, pay_to, api_key, cursor_xid)
			SELECT $1, $2, $3, $4, NULLIF($5, ''), pg_snapshot_xmin(pg_current_snapshot())
			WHERE (SELECT count(*) FROM webhooks
				WHERE disabled_at IS NULL AND api_key IS NOT DISTINCT FROM NULLIF($5, '')) < $6
			RETURNING created_at`, w.ID, w.URL, w.Secret, payTo, w.Owner, limit).Scan(&w.CreatedAt)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Webhooks lists owner's enabled webhooks (owner "": those registered in open mode), oldest
// first, without their secrets.
func (db *DB) Webhooks(ctx context.Context, owner string) ([]facilitator.Webhook, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, url, pay_to, created_at, COALESCE(api_key, '') FROM webhooks
		WHERE disabled_at IS NULL AND api_key IS NOT DISTINCT FROM NULLIF($1, '') ORDER BY created_at, id`, owner)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (facilitator.Webhook, error) {
		var w facilitator.Webhook
		var payTo [][]byte
		if err := row.Scan(&w.ID, &w.URL, &payTo, &w.CreatedAt, &w.Owner); err != nil {
			return w, err
		}
		w.PayTo = make([]common.Address, len(payTo))
		for i, a := range payTo {
			w.PayTo[i] = common.BytesToAddress(a)
		}
		return w, nil
	})
}

// DisableWebhook stops one of owner's webhooks and cancels what it is still owed. Another
// owner's webhook is ErrNotFound, like an unknown id.
func (db *DB) DisableWebhook(ctx context.Context, owner, id string) error {
	var n int
	// Two statements: the first waits for an enqueue holding the webhook's row and disables it;
	// the second, with a snapshot of its own taken after that enqueue committed, sees the
	// deliveries it wrote (in one statement they were invisible, and stayed owed for good).
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE webhooks SET disabled_at = COALESCE(disabled_at, now())
			WHERE id = $1 AND api_key IS NOT DISTINCT FROM NULLIF($2, '')`, id, owner)
		if err != nil {
			return err
		}
		if n = int(tag.RowsAffected()); n == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = NULL
			WHERE webhook_id = $1 AND next_attempt_at IS NOT NULL`, id)
		return err
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return facilitator.ErrNotFound
	}
	return nil
}

// EnqueueWebhookEvents advances every enabled webhook over its next events in one statement, so
// a delivery exists exactly for the events its cursor has passed. Only events of transactions
// below the snapshot's xmin are read: all of those are committed or never will be, so the cursor
// never passes an event that commits later (see migration 0006). A webhook another replica is
// advancing is skipped, not waited for.
func (db *DB) EnqueueWebhookEvents(ctx context.Context, states []string, limit int) (bool, error) {
	var more bool
	err := db.pool.QueryRow(ctx, `
		WITH w AS (
			SELECT id, pay_to, api_key, cursor_xid, cursor_event_id FROM webhooks
			WHERE disabled_at IS NULL ORDER BY id FOR UPDATE SKIP LOCKED),
		ev AS (
			SELECT w.id AS webhook_id, w.pay_to AS wanted, w.api_key AS owner, k.pay_to AS owner_pay_to, e.*
			FROM w LEFT JOIN api_keys k ON k.id = w.api_key CROSS JOIN LATERAL (
				SELECT e.id AS event_id, e.xid, e.state, s.pay_to, s.api_key
				FROM settlement_events e JOIN settlements s ON s.id = e.settlement_id
				WHERE (e.xid, e.id) > (w.cursor_xid, w.cursor_event_id)
					AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
				ORDER BY e.xid, e.id LIMIT $2) e),
		ins AS (
			INSERT INTO webhook_deliveries (webhook_id, event_id, next_attempt_at)
			SELECT webhook_id, event_id, now() FROM ev
			WHERE state = ANY($1) AND (cardinality(wanted) = 0 OR pay_to = ANY(wanted))
				-- A key's webhook hears only what is the key's merchant's: settlements made with
				-- that key, or paid to an address on its allow-list (which the operator gave it).
				-- Naming another merchant's payTo is not enough.
				AND (owner IS NULL OR api_key = owner OR pay_to = ANY(owner_pay_to))
			ON CONFLICT DO NOTHING),
		last AS (
			SELECT DISTINCT ON (webhook_id) webhook_id, xid, event_id FROM ev
			ORDER BY webhook_id, xid DESC, event_id DESC),
		upd AS (
			UPDATE webhooks SET cursor_xid = last.xid, cursor_event_id = last.event_id
			FROM last WHERE webhooks.id = last.webhook_id)
		SELECT COALESCE(max(n) >= $2, false) FROM (SELECT count(*) AS n FROM ev GROUP BY webhook_id) c`,
		states, limit).Scan(&more)
	return more, err
}

// ClaimWebhookDeliveries takes due deliveries of enabled webhooks for one attempt each: the
// attempt is counted and the delivery hidden for c.Lease, in one statement. SKIP LOCKED lets
// replicas claim side by side without ever taking the same attempt.
func (db *DB) ClaimWebhookDeliveries(ctx context.Context, c facilitator.DeliveryClaim) ([]facilitator.WebhookDelivery, error) {
	whIDs, whN := busyArrays(c.BusyWebhooks)
	owners, ownerN := busyArrays(c.BusyOwners)
	skip := c.Skip
	if skip == nil {
		skip = []string{}
	}
	// Each webhook's own oldest due deliveries, no more than what is left of its share and of its
	// owner's (one webhook's or one owner's backlog, the oldest of all, must not take every
	// slot); then, owner by owner, those left of the owner's share, taken in turns: first the
	// oldest of each owner with the fewest in flight, then the next of each, and so on (within an
	// owner, its webhooks take turns the same way). A fresh
	// delivery of one owner is therefore taken in the first turn however long another owner's
	// backlog is. Reading webhook by webhook (webhook_deliveries_webhook_due) keeps the backlog of
	// one out of the others' way: a read of the oldest due of all would meet only the backlog.
	rows, err := db.pool.Query(ctx, `
		WITH bw AS (SELECT * FROM unnest($3::text[], $4::int[]) AS b(webhook_id, n)),
		bo AS (SELECT * FROM unnest($5::text[], $6::int[]) AS b(owner, n)),
		w AS (
			SELECT w.id, COALESCE(w.api_key, '') AS owner,
				COALESCE((SELECT bw.n FROM bw WHERE bw.webhook_id = w.id), 0) AS busy,
				COALESCE((SELECT bo.n FROM bo WHERE bo.owner = COALESCE(w.api_key, '')), 0) AS owner_busy
			FROM webhooks w WHERE w.disabled_at IS NULL AND w.id <> ALL($9::text[])),
		cand AS (
			SELECT w.id AS webhook_id, w.owner, w.owner_busy, w.busy, d.event_id, d.next_attempt_at,
				row_number() OVER (PARTITION BY w.id ORDER BY d.next_attempt_at, d.event_id) AS wrn
			FROM w CROSS JOIN LATERAL (
				SELECT d.event_id, d.next_attempt_at FROM webhook_deliveries d
				WHERE d.webhook_id = w.id AND d.next_attempt_at <= now()
				ORDER BY d.next_attempt_at, d.event_id
				LIMIT LEAST($7 - w.busy, $8 - w.owner_busy)) d
			WHERE w.busy < $7 AND w.owner_busy < $8),
		ranked AS (
			SELECT c.*, row_number() OVER (PARTITION BY c.owner ORDER BY c.busy + c.wrn, c.next_attempt_at, c.event_id) AS rn
			FROM cand c),
		due AS (
			SELECT d.webhook_id, d.event_id FROM webhook_deliveries d
			JOIN ranked r ON r.webhook_id = d.webhook_id AND r.event_id = d.event_id
			WHERE r.rn <= $8 - r.owner_busy AND d.next_attempt_at <= now()
			ORDER BY r.owner_busy + r.rn, r.next_attempt_at, r.event_id LIMIT $1
			FOR UPDATE OF d SKIP LOCKED),
		c AS (
			UPDATE webhook_deliveries d SET attempts = d.attempts + 1,
				next_attempt_at = now() + $2::bigint * interval '1 microsecond'
			FROM due WHERE d.webhook_id = due.webhook_id AND d.event_id = due.event_id
			RETURNING d.webhook_id, d.event_id, d.attempts)
		SELECT c.webhook_id, COALESCE(w.api_key, ''), w.url, w.secret, c.attempts, e.id, e.settlement_id, e.state, e.at,
			s.network, s.asset, s.payer, s.auth_nonce,
			COALESCE((SELECT p.id FROM payment_ids p WHERE p.settlement_id = s.id AND p.scope = COALESCE(w.api_key, '') LIMIT 1), '')
		FROM c JOIN webhooks w ON w.id = c.webhook_id
		JOIN settlement_events e ON e.id = c.event_id
		JOIN settlements s ON s.id = e.settlement_id
		ORDER BY e.id`, c.Limit, c.Lease.Microseconds(), whIDs, whN, owners, ownerN, max(c.PerWebhook, 1), max(c.PerOwner, 1), skip)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (facilitator.WebhookDelivery, error) {
		var (
			d                   facilitator.WebhookDelivery
			state               string
			asset, payer, nonce []byte
		)
		err := row.Scan(&d.WebhookID, &d.Owner, &d.URL, &d.Secret, &d.Attempt, &d.Event.ID, &d.Event.SettlementID, &state, &d.Event.At,
			&d.Key.Network, &asset, &payer, &nonce, &d.PaymentID)
		d.Event.State = facilitator.State(state)
		d.Key.Asset, d.Key.Payer = common.BytesToAddress(asset), common.BytesToAddress(payer)
		copy(d.Key.Nonce[:], nonce)
		return d, err
	})
}

// busyArrays is a count by id as two arrays, for unnest.
func busyArrays(m map[string]int) ([]string, []int32) {
	ids, counts := make([]string, 0, len(m)), make([]int32, 0, len(m))
	for id, n := range m {
		ids, counts = append(ids, id), append(counts, int32(n))
	}
	return ids, counts
}

// RecordWebhookAttempt stores an attempt's outcome (a deferred one gives its attempt back). A delivery already marked delivered stays
// so: a late report from an attempt whose claim had lapsed does not schedule it again; nor is one
// scheduled for a webhook disabled while the attempt was in flight.
func (db *DB) RecordWebhookAttempt(ctx context.Context, a facilitator.DeliveryAttempt) error {
	var status *int
	if a.HTTPStatus != 0 {
		status = &a.HTTPStatus
	}
	var errText *string
	if a.Error != "" {
		errText = &a.Error
	}
	_, err := db.pool.Exec(ctx, `
		UPDATE webhook_deliveries SET
			delivered_at = CASE WHEN $3 THEN now() END,
			gave_up_at = CASE WHEN $4 AND NOT $3 THEN now() END,
			next_attempt_at = CASE WHEN $3 OR $4 OR (SELECT disabled_at IS NOT NULL FROM webhooks WHERE id = $1) THEN NULL
				ELSE now() + $5::bigint * interval '1 microsecond' END,
			-- A deferred attempt was never made: its claim's count is given back, and the last
			-- attempt's answer stays what it was.
			attempts = CASE WHEN $8 THEN GREATEST(attempts - 1, 0) ELSE attempts END,
			last_status = CASE WHEN $8 THEN last_status ELSE $6 END,
			last_error = CASE WHEN $8 THEN last_error ELSE $7 END
		WHERE webhook_id = $1 AND event_id = $2 AND delivered_at IS NULL`,
		a.WebhookID, a.EventID, a.Delivered, a.GiveUp, a.RetryIn.Microseconds(), status, errText, a.Deferred)
	return err
}

// PruneWebhookDeliveries deletes up to limit deliveries that ended (delivered or given up) before
// before; deliveries still owed are never deleted.
func (db *DB) PruneWebhookDeliveries(ctx context.Context, before time.Time, limit int) (int64, error) {
	tag, err := db.pool.Exec(ctx, `
		DELETE FROM webhook_deliveries WHERE (webhook_id, event_id) IN (
			SELECT webhook_id, event_id FROM webhook_deliveries
			WHERE next_attempt_at IS NULL AND COALESCE(delivered_at, gave_up_at) < $1
			LIMIT $2)`, before, limit)
	return tag.RowsAffected(), err
}

// SettlementEvents lists a settlement's events after an id with one of states, oldest first.
func (db *DB) SettlementEvents(ctx context.Context, settlementID, after int64, states []string, limit int) ([]facilitator.SettlementEvent, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, settlement_id, state, at FROM settlement_events
		WHERE settlement_id = $1 AND id > $2 AND state = ANY($3) ORDER BY id LIMIT $4`, settlementID, after, states, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (facilitator.SettlementEvent, error) {
		var ev facilitator.SettlementEvent
		var state string
		err := row.Scan(&ev.ID, &ev.SettlementID, &state, &ev.At)
		ev.State = facilitator.State(state)
		return ev, err
	})
}

// LastSettlementEvent is the id of a settlement's latest event (0 when it has none).
func (db *DB) LastSettlementEvent(ctx context.Context, settlementID int64) (int64, error) {
	var id int64
	err := db.pool.QueryRow(ctx, `SELECT COALESCE(max(id), 0) FROM settlement_events WHERE settlement_id = $1`, settlementID).Scan(&id)
	return id, err
}

// RedeliverWebhook schedules a given-up delivery again, now, with a fresh count of attempts (the
// dispatcher's full retry schedule); its last status and error stay until the next attempt.
// A webhook v does not see (another key's, unless v sees all) is ErrNotFound, like an unknown
// one; a delivery not given up is facilitator.ErrDeliveryNotGivenUp, one of a disabled webhook
// facilitator.ErrWebhookDisabled.
// It returns when the delivery is due.
func (db *DB) RedeliverWebhook(ctx context.Context, v facilitator.Viewer, webhookID string, eventID int64) (time.Time, error) {
	var due time.Time
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		var givenUp, disabled bool
		// The row lock holds off a claim or an attempt's record while this decides.
		err := tx.QueryRow(ctx, `SELECT d.gave_up_at IS NOT NULL, w.disabled_at IS NOT NULL
			FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
			WHERE d.webhook_id = $1 AND d.event_id = $2 AND ($3 OR w.api_key = $4)
			FOR UPDATE OF d`, webhookID, eventID, v.All, v.Key).Scan(&givenUp, &disabled)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return facilitator.ErrNotFound
		case err != nil:
			return err
		case disabled:
			return facilitator.ErrWebhookDisabled
		case !givenUp:
			return facilitator.ErrDeliveryNotGivenUp
		}
		return tx.QueryRow(ctx, `UPDATE webhook_deliveries SET gave_up_at = NULL, attempts = 0, next_attempt_at = now()
			WHERE webhook_id = $1 AND event_id = $2 RETURNING next_attempt_at`, webhookID, eventID).Scan(&due)
	})
	return due, err
}
