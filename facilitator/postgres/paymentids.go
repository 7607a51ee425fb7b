package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// PaymentID returns a payment id's record with its settlement as it stands now.
func (db *DB) PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error) {
	var (
		rec      facilitator.PaymentIDRecord
		fp       []byte
		summary  []byte
		expires  *time.Time
		settleID int64
	)
	err := db.pool.QueryRow(ctx, `SELECT scope, id, fingerprint, summary, response, response_expires_at, created_at, settlement_id
		FROM payment_ids WHERE scope = $1 AND id = $2`, scope, id).
		Scan(&rec.Scope, &rec.ID, &fp, &summary, &rec.Response, &expires, &rec.CreatedAt, &settleID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, facilitator.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	copy(rec.Fingerprint[:], fp)
	if err := json.Unmarshal(summary, &rec.Summary); err != nil {
		return nil, err
	}
	if expires != nil {
		rec.ResponseExpires = *expires
	}
	if rec.Settlement, err = db.SettlementByID(ctx, settleID); err != nil {
		return nil, err
	}
	return &rec, nil
}

// StorePaymentResponse keeps the answer given under a payment id until expires.
func (db *DB) StorePaymentResponse(ctx context.Context, scope, id string, response []byte, expires time.Time) error {
	_, err := db.pool.Exec(ctx, `UPDATE payment_ids SET response = $3, response_expires_at = $4
		WHERE scope = $1 AND id = $2`, scope, id, response, expires)
	return err
}

// CompactPaymentIDs drops the stored answers whose window ended before now, keeping each id's
// link to its settlement. It returns how many it compacted.
func (db *DB) CompactPaymentIDs(ctx context.Context, now time.Time) (int64, error) {
	tag, err := db.pool.Exec(ctx, `UPDATE payment_ids SET response = NULL
		WHERE response IS NOT NULL AND response_expires_at < $1`, now)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
