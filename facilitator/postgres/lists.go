package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// settlementList builds the list query with only the conditions the filter sets: a condition
// like ($n IS NULL OR col = $n) would leave a cached generic plan unable to pick the index a
// particular filter needs (migration 0015).
func settlementList(v facilitator.Viewer, f facilitator.SettlementFilter, p facilitator.Page) (string, []any) {
	var (
		where []string
		args  []any
	)
	arg := func(a any) string {
		args = append(args, a)
		return "$" + strconv.Itoa(len(args))
	}
	if !v.All {
		// The one scoping rule (facilitator.ViewerOf): a merchant key's own rows. Rows written in
		// open mode have no key, and "" matches none.
		where = append(where, "api_key = "+arg(v.Key))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, s := range f.States {
			states[i] = string(s)
		}
		where = append(where, "state = ANY("+arg(states)+")")
	}
	if f.PayTo != nil {
		where = append(where, "pay_to = "+arg(f.PayTo.Bytes()))
	}
	if f.Payer != nil {
		where = append(where, "payer = "+arg(f.Payer.Bytes()))
	}
	if f.Network != "" {
		where = append(where, "network = "+arg(f.Network))
	}
	if !f.Since.IsZero() {
		where = append(where, "created_at >= "+arg(f.Since))
	}
	if !f.Until.IsZero() {
		where = append(where, "created_at < "+arg(f.Until))
	}
	if p.After != nil {
		where = append(where, "(created_at, id) < ("+arg(p.After.At)+"::timestamptz, "+arg(p.After.ID)+"::bigint)")
	}
	q := `SELECT ` + settlementColumns + `, updated_at FROM settlements`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	// One row more than the page tells whether another page follows.
	q += ` ORDER BY created_at DESC, id DESC LIMIT ` + arg(p.Limit+1)
	return q, args
}

// ListSettlements reads one page of the settlements v may see, newest first.
func (db *DB) ListSettlements(ctx context.Context, v facilitator.Viewer, f facilitator.SettlementFilter, p facilitator.Page) (facilitator.SettlementPage, error) {
	q, args := settlementList(v, f, p)
	rows, err := db.pool.Query(ctx, q, args...)
	if err != nil {
		return facilitator.SettlementPage{}, err
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (facilitator.ListedSettlement, error) {
		var l facilitator.ListedSettlement
		s, err := scanSettlementWith(row, &l.UpdatedAt)
		if err == nil {
			l.Settlement = *s
		}
		return l, err
	})
	if err != nil {
		return facilitator.SettlementPage{}, err
	}
	var out facilitator.SettlementPage
	if len(items) > p.Limit {
		items = items[:p.Limit]
		last := items[len(items)-1]
		out.Next = &facilitator.Cursor{At: last.CreatedAt, ID: last.ID}
	}
	out.Items = items
	return out, nil
}

// WebhookDeliveries reads one page of a webhook's deliveries, newest event first. A webhook v may
// not read (another key's, unless v sees all) is ErrNotFound, like an unknown id: the same rule
// as DisableWebhook.
func (db *DB) WebhookDeliveries(ctx context.Context, v facilitator.Viewer, id string, p facilitator.Page) (facilitator.DeliveryPage, error) {
	var (
		out   facilitator.DeliveryPage
		payTo [][]byte
	)
	// A viewer that does not see all reads its own key's webhooks only: its Key "" (no viewer
	// at all, facilitator.ViewerFrom) matches none, not open mode's unowned ones.
	err := db.pool.QueryRow(ctx, `SELECT id, url, pay_to, created_at, COALESCE(api_key, '') FROM webhooks
		WHERE id = $1 AND ($2 OR api_key = $3)`, id, v.All, v.Key).
		Scan(&out.Webhook.ID, &out.Webhook.URL, &payTo, &out.Webhook.CreatedAt, &out.Webhook.Owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, facilitator.ErrNotFound
	}
	if err != nil {
		return out, err
	}
	out.Webhook.PayTo = make([]common.Address, len(payTo))
	for i, a := range payTo {
		out.Webhook.PayTo[i] = common.BytesToAddress(a)
	}
	var after int64 = 1<<63 - 1
	if p.After != nil {
		after = p.After.ID
	}
	// Event ids grow with time; the primary key (webhook_id, event_id) serves this order.
	rows, err := db.pool.Query(ctx, `
		SELECT d.event_id, e.settlement_id, e.state, e.at, s.network, s.asset, s.payer, s.auth_nonce,
			d.attempts, COALESCE(d.last_status, 0), COALESCE(d.last_error, ''), d.created_at,
			d.delivered_at, d.gave_up_at, d.next_attempt_at
		FROM webhook_deliveries d
		JOIN settlement_events e ON e.id = d.event_id
		JOIN settlements s ON s.id = e.settlement_id
		WHERE d.webhook_id = $1 AND d.event_id < $2
		ORDER BY d.event_id DESC LIMIT $3`, id, after, p.Limit+1)
	if err != nil {
		return out, err
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (facilitator.ListedDelivery, error) {
		var (
			d                   facilitator.ListedDelivery
			state               string
			asset, payer, nonce []byte
		)
		err := row.Scan(&d.Event.ID, &d.Event.SettlementID, &state, &d.Event.At, &d.Key.Network, &asset, &payer, &nonce,
			&d.Attempts, &d.LastStatus, &d.LastError, &d.CreatedAt, &d.DeliveredAt, &d.GaveUpAt, &d.NextAttempt)
		d.Event.State = facilitator.State(state)
		d.Key.Asset, d.Key.Payer = common.BytesToAddress(asset), common.BytesToAddress(payer)
		copy(d.Key.Nonce[:], nonce)
		return d, err
	})
	if err != nil {
		return out, err
	}
	if len(items) > p.Limit {
		items = items[:p.Limit]
		last := items[len(items)-1]
		out.Next = &facilitator.Cursor{ID: last.Event.ID, At: last.CreatedAt}
	}
	out.Items = items
	return out, nil
}
