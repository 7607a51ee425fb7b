package postgres

import (
	"context"
	"errors"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// AttachDelivery records what the merchant delivered for one settlement of the transaction a.Tx,
// once: the settlement is picked and checked by facilitator.DeliveryTarget, a first record is
// kept (created), the same record again answers the one kept, and a different one is a
// delivery_conflict. Two requests racing meet on the table's key: one inserts, the
// other reads what it inserted.
func (db *DB) AttachDelivery(ctx context.Context, a facilitator.DeliveryAttachment) (facilitator.DeliveryCandidate, facilitator.DeliveryRecord, bool, error) {
	var (
		target  facilitator.DeliveryCandidate
		kept    facilitator.DeliveryRecord
		created bool
	)
	digest, err := digestBytes(a.Record.SHA256)
	if err != nil {
		return target, kept, false, err
	}
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		members, err := deliveryCandidates(ctx, tx, a.Tx)
		if err != nil {
			return err
		}
		if target, err = facilitator.DeliveryTarget(members, a); err != nil {
			return err
		}
		rec := a.Record
		err = tx.QueryRow(ctx, `-- AttachDelivery
			INSERT INTO delivery_records (settlement_id, sha256, content_type, size, key_id)
			VALUES ($1, $2, NULLIF($3, ''), $4, NULLIF($5, ''))
			ON CONFLICT (settlement_id) DO NOTHING RETURNING recorded_at`,
			target.ID, digest, rec.ContentType, rec.Size, a.KeyID).Scan(&rec.RecordedAt)
		switch {
		case err == nil:
			kept, created = rec, true
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		old, err := deliveryRecord(ctx, tx, target.ID)
		if err != nil {
			return err
		}
		if old == nil {
			return errors.New("postgres: a delivery record neither inserted nor found")
		}
		kept = *old
		if !kept.Same(rec) {
			return facilitator.DeliveryConflict(kept)
		}
		return nil
	})
	if err != nil {
		return facilitator.DeliveryCandidate{}, facilitator.DeliveryRecord{}, false, err
	}
	kept.RecordedAt = kept.RecordedAt.UTC()
	return target, kept, created, nil
}

// DeliveryRecord returns the delivery record of a settlement, nil when none was attached.
func (db *DB) DeliveryRecord(ctx context.Context, settlementID int64) (*facilitator.DeliveryRecord, error) {
	return deliveryRecord(ctx, db.pool, settlementID)
}

// deliveryCandidates lists the settlements of the transaction hash (any fee-bump variant) in batch
// order: the settlement the transaction was signed for and every member at its nonce, as
// BatchMembers reads them.
func deliveryCandidates(ctx context.Context, tx pgx.Tx, hash common.Hash) ([]facilitator.DeliveryCandidate, error) {
	rows, err := tx.Query(ctx, `-- deliveryCandidates
		SELECT s.id, s.network, s.asset, s.payer, s.auth_nonce, s.state, COALESCE(s.api_key, '')
		FROM settlements f JOIN settlements s ON s.network = f.network AND s.signer = f.signer AND s.tx_nonce = f.tx_nonce
		WHERE f.id = (SELECT settlement_id FROM settlement_txs WHERE tx_hash = $1)
		ORDER BY s.batch_slot LIMIT 100`, hash[:])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (facilitator.DeliveryCandidate, error) {
		var (
			c                   facilitator.DeliveryCandidate
			asset, payer, nonce []byte
			state               string
		)
		if err := row.Scan(&c.ID, &c.Key.Network, &asset, &payer, &nonce, &state, &c.KeyID); err != nil {
			return c, err
		}
		c.Key.Asset, c.Key.Payer, c.State = common.BytesToAddress(asset), common.BytesToAddress(payer), facilitator.State(state)
		copy(c.Key.Nonce[:], nonce)
		return c, nil
	})
}

// querier is what deliveryRecord reads through: the pool, or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func deliveryRecord(ctx context.Context, q querier, settlementID int64) (*facilitator.DeliveryRecord, error) {
	var (
		rec    facilitator.DeliveryRecord
		digest []byte
		ctype  *string
	)
	err := q.QueryRow(ctx, `-- DeliveryRecord
		SELECT sha256, content_type, size, recorded_at FROM delivery_records WHERE settlement_id = $1`,
		settlementID).Scan(&digest, &ctype, &rec.Size, &rec.RecordedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var d [32]byte
	copy(d[:], digest)
	rec.SHA256, rec.RecordedAt = facilitator.DigestHex(d), rec.RecordedAt.UTC()
	if ctype != nil {
		rec.ContentType = *ctype
	}
	return &rec, nil
}

// digestBytes reads a record's 0x-prefixed 32-byte hex digest.
func digestBytes(s string) ([]byte, error) {
	b, err := hexutil.Decode(s)
	if err != nil || len(b) != 32 {
		return nil, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidDelivery, "sha256 must be 0x-prefixed 32-byte hex")
	}
	return b, nil
}
