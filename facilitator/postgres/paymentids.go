package postgres

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// PaymentID returns a payment id's record with its settlement as it stands now.
func (db *DB) PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error) {
	var (
		rec     facilitator.PaymentIDRecord
		fp      []byte
		summary []byte
		expires *time.Time
	)
	// One round trip: a replay is answered from this read alone.
	s, err := scanSettlementWith(db.pool.QueryRow(ctx, `SELECT `+settlementColumns+`,
			p.p_scope, p.p_id, p.p_fingerprint, p.summary, p.response, p.response_expires_at, p.p_created_at
		FROM (SELECT scope AS p_scope, id AS p_id, fingerprint AS p_fingerprint, summary, response,
				response_expires_at, created_at AS p_created_at, settlement_id
			FROM payment_ids WHERE scope = $1 AND id = $2) p
		JOIN settlements ON settlements.id = p.settlement_id`, scope, id),
		&rec.Scope, &rec.ID, &fp, &summary, &rec.Response, &expires, &rec.CreatedAt)
	if err != nil {
		return nil, err
	}
	rec.Settlement = s
	copy(rec.Fingerprint[:], fp)
	if err := json.Unmarshal(summary, &rec.Summary); err != nil {
		return nil, err
	}
	if expires != nil {
		rec.ResponseExpires = *expires
	}
	return &rec, nil
}

// StorePaymentResponse keeps the answer given under a payment id until expires, when the id is
// bound to the request that answered: to its fingerprint, or, for an id bound before ids covered
// the resource (no resource in its summary), to its payment's (facilitator.PaymentIDRecord.BindsTo).
// A request for the same payment and another resource never overwrites the answer of the request
// the id is bound to. stored is false when nothing was written.
func (db *DB) StorePaymentResponse(ctx context.Context, scope, id string, bound, legacy facilitator.Fingerprint, response []byte, expires time.Time) (stored bool, err error) {
	tag, err := db.pool.Exec(ctx, `UPDATE payment_ids SET response = $3, response_expires_at = $4
		WHERE scope = $1 AND id = $2 AND (fingerprint = $5 OR (fingerprint = $6 AND NOT summary ? 'resource'))`,
		scope, id, response, expires, bound[:], legacy[:])
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
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

// PaymentIDsOf lists the payment-identifier ids that resolved to the authorization's settlement,
// oldest first, as v may see them: its own key's ids, or every key's when v sees all. The links
// outlive the stored answers (CompactPaymentIDs keeps them), so a retry id found weeks later still
// leads to its receipt.
func (db *DB) PaymentIDsOf(ctx context.Context, k facilitator.AuthorizationKey, v facilitator.Viewer) ([]string, error) {
	if !v.All && v.Key == "" {
		// A viewer of nothing: scope '' holds open mode's ids, which such a viewer must not read.
		return nil, nil
	}
	rows, err := db.pool.Query(ctx, `SELECT p.id FROM payment_ids p
		JOIN settlements s ON s.id = p.settlement_id
		WHERE s.network = $1 AND s.asset = $2 AND s.payer = $3 AND s.auth_nonce = $4 AND ($5 OR p.scope = $6)
		ORDER BY p.created_at, p.id`, k.Network, k.Asset[:], k.Payer[:], k.Nonce[:], v.All, v.Key)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
