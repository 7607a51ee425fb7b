package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// InsertConsoleSession stores a new console session (its token's hash, never the token).
func (db *DB) InsertConsoleSession(ctx context.Context, s *facilitator.ConsoleSession) error {
	scopes := make([]string, len(s.Scopes))
	for i, sc := range s.Scopes {
		scopes[i] = string(sc)
	}
	_, err := db.pool.Exec(ctx, `INSERT INTO console_sessions (token_hash, key_id, scopes, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5)`, s.Hash[:], s.KeyID, scopes, s.CreatedAt, s.ExpiresAt)
	return err
}

// ConsoleSession returns the session whose token hashes to hash, expired or revoked or not;
// facilitator.ErrNotFound if there is none.
func (db *DB) ConsoleSession(ctx context.Context, hash [32]byte) (*facilitator.ConsoleSession, error) {
	var (
		s      facilitator.ConsoleSession
		stored []byte
		scopes []string
	)
	err := db.pool.QueryRow(ctx, `SELECT token_hash, key_id, scopes, created_at, expires_at, revoked_at
		FROM console_sessions WHERE token_hash = $1`, hash[:]).Scan(&stored, &s.KeyID, &scopes, &s.CreatedAt, &s.ExpiresAt, &s.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, facilitator.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if len(stored) != len(s.Hash) {
		return nil, fmt.Errorf("postgres: console session of key %s: stored hash has %d bytes", s.KeyID, len(stored))
	}
	copy(s.Hash[:], stored)
	for _, sc := range scopes {
		s.Scopes = append(s.Scopes, facilitator.Scope(sc))
	}
	return &s, nil
}

// RevokeConsoleSession ends a session from at on (logout). Revoking a revoked or unknown session
// changes nothing and is no error: logging out twice is logged out.
func (db *DB) RevokeConsoleSession(ctx context.Context, hash [32]byte, at time.Time) error {
	_, err := db.pool.Exec(ctx, `UPDATE console_sessions SET revoked_at = COALESCE(revoked_at, $2) WHERE token_hash = $1`, hash[:], at)
	return err
}

// PruneConsoleSessions deletes up to limit sessions that expired or were revoked by at (a session
// is live only before its expiry); it returns how many it deleted.
func (db *DB) PruneConsoleSessions(ctx context.Context, at time.Time, limit int) (int64, error) {
	tag, err := db.pool.Exec(ctx, `
		DELETE FROM console_sessions WHERE token_hash IN (
			SELECT token_hash FROM console_sessions
			WHERE expires_at <= $1 OR revoked_at <= $1
			LIMIT $2)`, at, limit)
	return tag.RowsAffected(), err
}
