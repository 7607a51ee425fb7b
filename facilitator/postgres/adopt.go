package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// AdoptSettlements records a mined transaction of one of our signer keys that the ledger lost
// (facilitator.Adoption), in one transaction, and returns each member's settlement id in the
// order of a.Members. A member whose authorization has no row gets one, mined and marked
// adopted; an open row of the authorization (its mined variant was lost: a bump, a re-sign)
// takes the transaction as its variant and is resolved mined, moved to the transaction's nonce
// and slot unless another settlement holds them; a row already mined by this transaction is
// left as it is (adopting twice is adopting once). fresh reports that this call wrote a member
// (false: every member was adopted already, by a concurrent or earlier call), so that each
// adoption is counted once. A row resolved settled elsewhere by this very transaction (its
// writer took our transaction for another's) is corrected as an open row is. Errors, with
// nothing written: facilitator.ErrDuplicate when a member's row is resolved otherwise (mined
// by another transaction, or failed), facilitator.ErrNonceTaken when another settlement holds
// the (signer, tx nonce, slot) of a new member, or of an open one without a.MayStay.
func (db *DB) AdoptSettlements(ctx context.Context, a facilitator.Adoption) (ids []int64, fresh bool, err error) {
	ids = make([]int64, len(a.Members))
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		home, homeSlot := int64(0), 0
		fresh = false // a retried transaction starts over
		for i, m := range a.Members {
			id, placed, wrote, err := adoptMember(ctx, tx, a, m)
			if err != nil {
				return err
			}
			ids[i], fresh = id, fresh || wrote
			switch {
			case placed && (home == 0 || m.Slot < homeSlot):
				home, homeSlot = id, m.Slot
			case !placed:
				// Resolved where it is: the transaction is one of its family's variants.
				if err := recordAdoptedTx(ctx, tx, a.Tx, `SELECT `+familyID+` FROM settlements WHERE id = $5`, id); err != nil {
					return err
				}
			}
		}
		if home == 0 {
			return nil
		}
		// The transaction is recorded once, under the lowest slot at its nonce (slot 0, where
		// the batch's variants live, whenever it is there).
		return recordAdoptedTx(ctx, tx, a.Tx, `SELECT $5::bigint`, home)
	})
	if err != nil {
		return nil, false, insertError(err)
	}
	return ids, fresh, nil
}

// recordAdoptedTx records an adopted transaction under the settlement the query owner (with
// $5) names; one recorded already is left as it is.
func recordAdoptedTx(ctx context.Context, tx pgx.Tx, t facilitator.TxRecord, owner string, arg any) error {
	_, err := tx.Exec(ctx, `INSERT INTO settlement_txs (tx_hash, settlement_id, raw, gas_tip_cap, gas_fee_cap)
		SELECT $1, (`+owner+`), $2, $3, $4 ON CONFLICT (tx_hash) DO NOTHING`,
		t.Hash[:], t.Raw, numeric(orZero(t.TipCap)), numeric(orZero(t.FeeCap)), arg)
	return err
}

// errAdoptRace: the member's row was inserted by a concurrent adoption between the look and
// the insert; looked at again.
var errAdoptRace = errors.New("adopted concurrently")

// adoptMember adopts one member; placed reports that its row is at the transaction's (signer,
// tx nonce, slot), wrote that this call wrote it (false: it was adopted already).
func adoptMember(ctx context.Context, tx pgx.Tx, a facilitator.Adoption, m facilitator.AdoptedMember) (id int64, placed, wrote bool, err error) {
	for try := 0; ; try++ {
		id, placed, wrote, err = adoptOnce(ctx, tx, a, m)
		if !errors.Is(err, errAdoptRace) || try > 0 {
			return id, placed, wrote, err
		}
	}
}

func adoptOnce(ctx context.Context, tx pgx.Tx, a facilitator.Adoption, m facilitator.AdoptedMember) (int64, bool, bool, error) {
	k := m.Key
	detail := fmt.Sprintf("adopted: tx %s nonce %d block %d (the ledger had lost its record)", a.Tx.Hash.Hex(), a.TxNonce, a.BlockNumber)
	var (
		id, txNonce    int64
		slot           int16
		state          string
		txHash, signer []byte
	)
	err := tx.QueryRow(ctx, `SELECT id, state, tx_hash, signer, tx_nonce, batch_slot FROM settlements
		WHERE network = $1 AND asset = $2 AND payer = $3 AND auth_nonce = $4 FOR UPDATE`,
		k.Network, k.Asset[:], k.Payer[:], k.Nonce[:]).Scan(&id, &state, &txHash, &signer, &txNonce, &slot)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		request := m.Request
		if request == nil {
			request = []byte("{}")
		}
		var (
			scope                  string
			pid                    *string
			idFingerprint, summary []byte
		)
		if b := m.PaymentID; b != nil {
			var err error
			if summary, err = json.Marshal(b.Summary); err != nil {
				return 0, false, false, err
			}
			scope, pid, idFingerprint = b.Scope, &b.ID, b.Fingerprint[:]
		}
		err := tx.QueryRow(ctx, `
			WITH s AS (
				INSERT INTO settlements (network, asset, payer, auth_nonce, fingerprint, pay_to, value, valid_after,
					valid_before, x402_version, request, signer, tx_nonce, state, tx_hash, block_number, block_hash,
					api_key, gas_reserved, batch_slot, adopted_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'mined', $14, $15, $16,
					NULLIF($17, ''), 0, $18, now())
				ON CONFLICT (network, asset, payer, auth_nonce) DO NOTHING
				RETURNING id),
			e AS (INSERT INTO settlement_events (settlement_id, state, detail) SELECT id, 'mined', $19 FROM s),
			p AS (
				INSERT INTO payment_ids (scope, id, fingerprint, settlement_id, summary)
				SELECT $20::text, $21::text, $22::bytea, id, $23::jsonb FROM s WHERE $21::text IS NOT NULL
				ON CONFLICT DO NOTHING)
			SELECT id FROM s`,
			k.Network, k.Asset[:], k.Payer[:], k.Nonce[:], m.Fingerprint[:], m.PayTo[:], numeric(orZero(m.Value)),
			numeric(orZero(m.ValidAfter)), numeric(orZero(m.ValidBefore)), int16(m.X402Version), request,
			a.Signer[:], int64(a.TxNonce), a.Tx.Hash[:], int64(a.BlockNumber), a.BlockHash[:], m.KeyID, int16(m.Slot), detail,
			scope, pid, idFingerprint, summary).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false, false, errAdoptRace
		}
		return id, true, true, err
	case err != nil:
		return 0, false, false, err
	}
	placed := common.BytesToAddress(signer) == a.Signer && txNonce == int64(a.TxNonce) && int(slot) == m.Slot
	switch facilitator.State(state) {
	case facilitator.StateMined, facilitator.StateFinal:
		if common.BytesToHash(txHash) == a.Tx.Hash {
			return id, placed, false, nil
		}
		return 0, false, false, facilitator.ErrDuplicate
	case facilitator.StateSigned, facilitator.StateBroadcast:
	case facilitator.StateSettledElsewhere:
		// Resolved as another's use by this very transaction: a writer that did not know every
		// key of ours (a replica with fewer keys configured, a binary from before they were all
		// counted). The transaction is ours (its signature says so): the row is corrected.
		if common.BytesToHash(txHash) != a.Tx.Hash {
			return 0, false, false, facilitator.ErrDuplicate
		}
	default:
		return 0, false, false, facilitator.ErrDuplicate
	}
	// The row survived and the variant that mined did not (a bump, a re-sign at another nonce or
	// slot, or a retry after the loss signed on another key): the row moves to where the chain
	// has it, key included (else it would hold a nonce of its old key that nothing will send: a
	// gap every later transaction of that key waits behind), unless another settlement holds that
	// place (one signed there after the loss, while the lost transaction waited in a pool: it
	// cannot mine there now, and moves on when the engine re-signs it). Then the row is resolved
	// where it is, the transaction recorded among its variants, when the caller saw its own
	// nonce used (a.MayStay); otherwise the adoption waits (ErrNonceTaken).
	resolve := `WITH u AS (
			UPDATE settlements SET state = 'mined', signer = $8, tx_nonce = $2, batch_slot = $3, tx_hash = $4, block_number = $5,
				block_hash = $6, error_reason = NULL, error_message = NULL, adopted_at = now(), updated_at = now()
			WHERE id = $1 RETURNING id)
		INSERT INTO settlement_events (settlement_id, state, detail) SELECT id, 'mined', $7 FROM u`
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, false, false, err
	}
	_, err = sp.Exec(ctx, resolve, id, int64(a.TxNonce), int16(m.Slot), a.Tx.Hash[:], int64(a.BlockNumber), a.BlockHash[:], detail, a.Signer[:])
	if err == nil {
		return id, true, true, sp.Commit(ctx)
	}
	if rerr := sp.Rollback(ctx); rerr != nil || !errors.Is(insertError(err), facilitator.ErrNonceTaken) {
		return 0, false, false, errors.Join(err, rerr)
	}
	if !a.MayStay {
		return 0, false, false, facilitator.ErrNonceTaken
	}
	_, err = tx.Exec(ctx, resolve, id, txNonce, slot, a.Tx.Hash[:], int64(a.BlockNumber), a.BlockHash[:], detail, signer)
	return id, placed, true, err
}

// BindAdopted gives an adopted row that no request made (its fingerprint zero: the adoption
// found it on chain) the request now asking for it: its fingerprint, API key, version and body,
// so that the request and its retries follow it as their own. It reports whether the row took
// them (false: not such a row, or another request's took it first).
func (db *DB) BindAdopted(ctx context.Context, id int64, fp facilitator.Fingerprint, keyID string, x402Version int, request []byte) (bool, error) {
	if request == nil {
		request = []byte("{}")
	}
	tag, err := db.pool.Exec(ctx, `
		UPDATE settlements SET fingerprint = $2, api_key = NULLIF($3, ''), x402_version = $4, request = $5, updated_at = now()
		WHERE id = $1 AND adopted_at IS NOT NULL AND fingerprint = $6`,
		id, fp[:], keyID, int16(x402Version), request, make([]byte, 32))
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}
