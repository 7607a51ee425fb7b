package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Console sessions. Logging in to the console with a key opens a session: a random token (32
// bytes, base64url) that the browser keeps in a cookie and that the ledger knows only by its
// SHA-256, bound to the key and to the scopes the key had then. The session ends when it expires,
// when it is logged out (revoked) or when its key is revoked; while it lasts it can do only what
// both it and its key, as it is now, may do.

// sessionTokenLen is a token's length: 32 bytes in unpadded base64url.
const sessionTokenLen = 43

// SessionStore keeps console sessions by their token's hash; an unknown hash is
// facilitator.ErrNotFound.
type SessionStore interface {
	InsertConsoleSession(ctx context.Context, s *facilitator.ConsoleSession) error
	ConsoleSession(ctx context.Context, hash [32]byte) (*facilitator.ConsoleSession, error)
	RevokeConsoleSession(ctx context.Context, hash [32]byte, at time.Time) error
}

// SessionHash is what is stored for a session token.
func SessionHash(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// OpenSession opens a session for an authenticated key, lasting ttl from now. It returns the
// session's token, which only the browser's cookie holds.
func OpenSession(ctx context.Context, sessions SessionStore, key *facilitator.APIKey, now time.Time, ttl time.Duration) (string, *facilitator.ConsoleSession, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, fmt.Errorf("auth: making a session token: %w", err)
	}
	token := base64.RawURLEncoding.EncodeToString(b[:])
	s := &facilitator.ConsoleSession{Hash: SessionHash(token), KeyID: key.ID, Scopes: slices.Clone(key.Scopes),
		CreatedAt: now, ExpiresAt: now.Add(ttl)}
	if err := sessions.InsertConsoleSession(ctx, s); err != nil {
		return "", nil, facilitator.Unavailable("", "opening a session failed; retry later", fmt.Errorf("auth: storing a session of key %s: %w", key.ID, err))
	}
	return token, s, nil
}

// ResolveSession returns the key a session token stands for, its scopes narrowed to those both
// the session and the key have now. An unknown, expired or revoked session, or one whose key is
// gone or revoked, is refused like a bad key.
func ResolveSession(ctx context.Context, keys Store, sessions SessionStore, token string, now time.Time) (*facilitator.APIKey, error) {
	if len(token) != sessionTokenLen {
		return nil, refused()
	}
	s, err := sessions.ConsoleSession(ctx, SessionHash(token))
	if errors.Is(err, facilitator.ErrNotFound) {
		return nil, refused()
	}
	if err != nil {
		return nil, facilitator.Unavailable("", "checking the session failed; retry later", fmt.Errorf("auth: looking up a session: %w", err))
	}
	if !s.Live(now) {
		return nil, refused()
	}
	k, err := keys.APIKey(ctx, s.KeyID)
	if errors.Is(err, facilitator.ErrNotFound) {
		return nil, refused()
	}
	if err != nil {
		return nil, facilitator.Unavailable("", "checking the API key failed; retry later", fmt.Errorf("auth: looking up key %s: %w", s.KeyID, err))
	}
	if k.Revoked() {
		return nil, refused()
	}
	narrowed := *k
	narrowed.Scopes = nil
	for _, sc := range k.Scopes {
		if slices.Contains(s.Scopes, sc) {
			narrowed.Scopes = append(narrowed.Scopes, sc)
		}
	}
	return &narrowed, nil
}

// EndSession revokes the session of token from now on (logout). An unknown token is no error.
func EndSession(ctx context.Context, sessions SessionStore, token string, now time.Time) error {
	if len(token) != sessionTokenLen {
		return nil
	}
	if err := sessions.RevokeConsoleSession(ctx, SessionHash(token), now); err != nil {
		return facilitator.Unavailable("", "logging out failed; retry later", fmt.Errorf("auth: revoking a session: %w", err))
	}
	return nil
}
