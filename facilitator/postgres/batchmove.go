package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/big"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// MoveBatch re-signs members of a batch whose tx nonce a transaction that is not ours took: it
// moves the settlements ids (members of one batch, all still signed or broadcast; in the order of
// their slots) to txNonce, in slots 0..len(ids)-1, and records tx, the new batch's transaction,
// under the new slot 0, in one transaction before anything is sent (invariant 2). Invariant 7
// holds on (network, signer, tx_nonce, batch_slot): a nonce another settlement holds is
// facilitator.ErrNonceTaken, and nothing is written. The members left at the old nonce (their
// authorizations used elsewhere, or expired) keep the old batch's transactions: when its slot 0
// moves, the lowest of them becomes slot 0 and takes its transactions (migration 0017 finds a
// batch's transactions under slot 0). A member that is mined, final or failed, or that is not at
// the same (network, signer, tx_nonce) as the others, makes it facilitator.ErrNotFound; a tx
// already recorded, facilitator.ErrDuplicate (an earlier move of it committed and its answer was
// lost).
func (db *DB) MoveBatch(ctx context.Context, ids []int64, txNonce uint64, tx facilitator.TxRecord) error {
	if len(ids) == 0 || len(ids) > 100 {
		return fmt.Errorf("postgres: a batch moves 1..100 settlements, not %d", len(ids))
	}
	share := new(big.Int).Mul(new(big.Int).SetUint64((tx.Gas+uint64(len(ids))-1)/uint64(len(ids))), tx.FeeCap)
	return pgx.BeginFunc(ctx, db.pool, func(t pgx.Tx) error {
		rows, err := t.Query(ctx, `SELECT network, signer, tx_nonce, state IN ('signed', 'broadcast'), batch_slot = 0
			FROM settlements WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
		if err != nil {
			return err
		}
		var (
			network          string
			signer           []byte
			old              int64
			seen             int
			slot0Moved, same = false, true
		)
		for rows.Next() {
			var nw string
			var sg []byte
			var nonce int64
			var open, zero bool
			if err := rows.Scan(&nw, &sg, &nonce, &open, &zero); err != nil {
				rows.Close()
				return err
			}
			if seen == 0 {
				network, signer, old = nw, sg, nonce
			}
			same = same && open && nw == network && string(sg) == string(signer) && nonce == old
			slot0Moved = slot0Moved || zero
			seen++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if seen != len(ids) || !same {
			return facilitator.ErrNotFound
		}
		if uint64(old) == txNonce {
			return facilitator.ErrNonceTaken
		}
		var slot0 int64
		if err := t.QueryRow(ctx, `SELECT id FROM settlements WHERE network = $1 AND signer = $2 AND tx_nonce = $3 AND batch_slot = 0`,
			network, signer, old).Scan(&slot0); err != nil {
			return err
		}
		slots := make([]int16, len(ids))
		for i := range slots {
			slots[i] = int16(i)
		}
		if _, err := t.Exec(ctx, `UPDATE settlements s SET tx_nonce = $2, batch_slot = m.slot,
				gas_reserved = GREATEST(s.gas_reserved, NULLIF($4::numeric, 0)), updated_at = now()
			FROM unnest($1::bigint[], $3::smallint[]) AS m(id, slot) WHERE s.id = m.id`,
			ids, int64(txNonce), slots, numeric(share)); err != nil {
			return insertError(err)
		}
		if slot0Moved {
			// The members left at the old nonce keep its transactions, under their new slot 0.
			var heir int64
			err := t.QueryRow(ctx, `UPDATE settlements SET batch_slot = 0 WHERE id = (
					SELECT id FROM settlements WHERE network = $1 AND signer = $2 AND tx_nonce = $3 ORDER BY batch_slot LIMIT 1)
				RETURNING id`, network, signer, old).Scan(&heir)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				// Every member moved: the old transactions stay with the old slot 0, the new one's
				// slot 0 too (the first of ids), as a lone settlement's re-sign keeps them.
			case err != nil:
				return err
			default:
				if _, err := t.Exec(ctx, `UPDATE settlement_txs SET settlement_id = $1 WHERE settlement_id = $2`, heir, slot0); err != nil {
					return err
				}
			}
		}
		if _, err := t.Exec(ctx, `INSERT INTO settlement_txs (tx_hash, settlement_id, raw, gas_tip_cap, gas_fee_cap) VALUES ($1, $2, $3, $4, $5)`,
			tx.Hash[:], ids[0], tx.Raw, numeric(tx.TipCap), numeric(tx.FeeCap)); err != nil {
			return insertError(err)
		}
		_, err = t.Exec(ctx, `INSERT INTO settlement_events (settlement_id, state, detail)
			SELECT m.id, 'renonced', 'tx nonce ' || $2::bigint || ' left for batch tx ' || $3::text || ' nonce ' || $4::bigint || ' slot ' || m.slot
			FROM unnest($1::bigint[], $5::smallint[]) AS m(id, slot)`, ids, old, tx.Hash.Hex(), int64(txNonce), slots)
		return err
	})
}

// MoveBatch re-signs a batch's members on the lease's session; see DB.MoveBatch.
func (l *signerLease) MoveBatch(ctx context.Context, ids []int64, txNonce uint64, tx facilitator.TxRecord) error {
	if l.isLost() {
		return errLeaseSessionGone
	}
	return l.db.MoveBatch(ctx, ids, txNonce, tx)
}
