package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const apiKeyColumns = `id, key_hash, name, scopes, pay_to, gas_budget_wei, created_at, revoked_at, rotated_at, previous_hash, previous_until`

func scanAPIKey(row pgx.Row) (*facilitator.APIKey, error) {
	var (
		k      facilitator.APIKey
		hash   []byte
		scopes []string
		payTo  [][]byte
		budget pgtype.Numeric
		prev   []byte
	)
	if err := row.Scan(&k.ID, &hash, &k.Name, &scopes, &payTo, &budget, &k.CreatedAt, &k.RevokedAt, &k.RotatedAt, &prev, &k.PreviousUntil); err != nil {
		return nil, err
	}
	if len(hash) != len(k.Hash) {
		return nil, fmt.Errorf("postgres: api key %s: stored hash has %d bytes", k.ID, len(hash))
	}
	copy(k.Hash[:], hash)
	if prev != nil {
		k.PreviousHash = new([32]byte)
		copy(k.PreviousHash[:], prev)
	}
	k.GasBudgetWei = numericInt(budget)
	for _, s := range scopes {
		k.Scopes = append(k.Scopes, facilitator.Scope(s))
	}
	for _, a := range payTo {
		k.PayTo = append(k.PayTo, common.BytesToAddress(a))
	}
	return &k, nil
}

// APIKey returns a key by id, revoked or not; facilitator.ErrNotFound if there is none.
func (db *DB) APIKey(ctx context.Context, id string) (*facilitator.APIKey, error) {
	k, err := scanAPIKey(db.pool.QueryRow(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, facilitator.ErrNotFound
	}
	return k, err
}

// InsertAPIKey stores a new key (its hash, never its text).
func (db *DB) InsertAPIKey(ctx context.Context, k *facilitator.APIKey) error {
	scopes := make([]string, len(k.Scopes))
	for i, s := range k.Scopes {
		scopes[i] = string(s)
	}
	payTo := make([][]byte, len(k.PayTo))
	for i, a := range k.PayTo {
		payTo[i] = a.Bytes()
	}
	var budget *pgtype.Numeric
	if k.GasBudgetWei != nil {
		n := numeric(k.GasBudgetWei)
		budget = &n
	}
	return db.pool.QueryRow(ctx, `INSERT INTO api_keys (id, key_hash, name, scopes, pay_to, gas_budget_wei)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`, k.ID, k.Hash[:], k.Name, scopes, payTo, budget).Scan(&k.CreatedAt)
}

// SetAPIKeyGasBudget sets a key's gas budget (wei per rolling 24 hours; nil: the server's default,
// 0: unlimited). It applies to the key's next settlement. An unknown id is facilitator.ErrNotFound.
func (db *DB) SetAPIKeyGasBudget(ctx context.Context, id string, wei *big.Int) error {
	var budget *pgtype.Numeric
	if wei != nil {
		n := numeric(wei)
		budget = &n
	}
	tag, err := db.pool.Exec(ctx, `UPDATE api_keys SET gas_budget_wei = $2 WHERE id = $1`, id, budget)
	if err == nil && tag.RowsAffected() == 0 {
		return facilitator.ErrNotFound
	}
	return err
}

// APIKeys lists every key, oldest first.
func (db *DB) APIKeys(ctx context.Context) ([]*facilitator.APIKey, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+apiKeyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*facilitator.APIKey
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeAPIKey revokes a key from now on, and ends its console sessions. Revoking a revoked key
// keeps its first revocation time; an unknown id is facilitator.ErrNotFound.
func (db *DB) RevokeAPIKey(ctx context.Context, id string, now time.Time) (time.Time, error) {
	var at time.Time
	err := db.pool.QueryRow(ctx, `WITH sessions AS (
			UPDATE console_sessions SET revoked_at = COALESCE(revoked_at, $2) WHERE key_id = $1)
		UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2)
		WHERE id = $1 RETURNING revoked_at`, id, now).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, facilitator.ErrNotFound
	}
	return at, err
}

// CountAPIKeys counts the keys, and those not revoked. It reads only what every schema since the
// keys' first migration has, so that a check run before pending migrations can still count them.
func (db *DB) CountAPIKeys(ctx context.Context) (all, live int, err error) {
	err = db.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE revoked_at IS NULL) FROM api_keys`).Scan(&all, &live)
	return all, live, err
}

// RotateAPIKey gives a key that is not revoked a new secret (its hash) at now, keeping everything
// else of it. The secret it replaces stays accepted until now+grace (grace 0: refused at once),
// and a secret an earlier rotation replaced stops at once: a key has at most two. The key's
// console sessions, opened with either old secret, end when the replaced secret does. It returns
// the key as rotated; an unknown or revoked id is facilitator.ErrNotFound.
func (db *DB) RotateAPIKey(ctx context.Context, id string, hash [32]byte, now time.Time, grace time.Duration) (*facilitator.APIKey, error) {
	var until *time.Time
	if grace > 0 {
		u := now.Add(grace)
		until = &u
	}
	// The SET expressions read the row as it was: previous_hash takes the replaced key_hash.
	k, err := scanAPIKey(db.pool.QueryRow(ctx, `WITH sessions AS (
			UPDATE console_sessions SET expires_at = LEAST(expires_at, COALESCE($4, $3))
			WHERE key_id = $1 AND revoked_at IS NULL AND expires_at > $3)
		UPDATE api_keys SET key_hash = $2, rotated_at = $3,
			previous_hash = CASE WHEN $4::timestamptz IS NULL THEN NULL ELSE key_hash END, previous_until = $4
		WHERE id = $1 AND revoked_at IS NULL RETURNING `+apiKeyColumns, id, hash[:], now, until))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, facilitator.ErrNotFound
	}
	return k, err
}
