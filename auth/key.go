// Package auth holds merchant API keys: their format, how they are checked against the stored
// (hashed) form, their scopes and payTo allow-lists, and the in-process rate limits applied per key
// and per client address.
//
// A key is x402_<id>_<secret>: id is 12 hex characters (public, it names the key in logs, the CLI
// and as the payment-identifier scope), secret is 32 random bytes in hex. Only the SHA-256 of the
// whole key is stored; the key itself is shown once, when it is created. A rotation gives the key
// a new secret under the same id (so that everything bound to the id, its payment ids, webhooks
// and budget, stays the key's), and the secret it replaced keeps working through a grace.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const (
	prefix    = "x402_"
	idLen     = 12 // hex characters
	secretLen = 64 // hex characters (32 bytes)
)

// Generate makes a new key: the full text (to show once) and its id and hash (to store).
func Generate() (full, id string, hash [32]byte, err error) {
	var idb [idLen / 2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", "", hash, fmt.Errorf("auth: generating a key: %w", err)
	}
	id = hex.EncodeToString(idb[:])
	full, hash, err = NewSecret(id)
	return full, id, hash, err
}

// NewSecret makes a new secret for the key id: the full text (to show once) and its hash (to
// store). Generate uses it for a new key, a rotation for an existing one.
func NewSecret(id string) (full string, hash [32]byte, err error) {
	var secret [secretLen / 2]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", hash, fmt.Errorf("auth: generating a key: %w", err)
	}
	full = prefix + id + "_" + hex.EncodeToString(secret[:])
	return full, Hash(full), nil
}

// Hash is what is stored for a key.
func Hash(full string) [32]byte { return sha256.Sum256([]byte(full)) }

// ParseID returns the id of a well-formed key text; ok is false for anything else.
func ParseID(full string) (id string, ok bool) {
	rest, found := strings.CutPrefix(full, prefix)
	if !found || len(rest) != idLen+1+secretLen || rest[idLen] != '_' {
		return "", false
	}
	id, secret := rest[:idLen], rest[idLen+1:]
	if !isLowerHex(id) || !isLowerHex(secret) {
		return "", false
	}
	return id, true
}

// ValidID reports whether id has the shape of a key id.
func ValidID(id string) bool { return len(id) == idLen && isLowerHex(id) }

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// matches reports, in constant time, whether full is k's key at now: its secret, or the one its
// latest rotation replaced while the grace runs.
func matches(k *facilitator.APIKey, full string, now time.Time) bool {
	h := Hash(full)
	current := subtle.ConstantTimeCompare(h[:], k.Hash[:]) == 1
	return current || isPrevious(k, h, now)
}

func isPrevious(k *facilitator.APIKey, h [32]byte, now time.Time) bool {
	return k.InGrace(now) && subtle.ConstantTimeCompare(h[:], k.PreviousHash[:]) == 1
}

// GraceEnd is when full stops opening k: the end of the grace when it is the secret k's rotation
// replaced; ok is false for k's current secret (which lasts until it is rotated or revoked). A
// console session opened with the old secret ends with it.
func GraceEnd(k *facilitator.APIKey, full string, now time.Time) (end time.Time, ok bool) {
	if isPrevious(k, Hash(full), now) {
		return *k.PreviousUntil, true
	}
	return time.Time{}, false
}

// ParseScopes reads a comma-separated scope list; it must name at least one known scope.
func ParseScopes(s string) ([]facilitator.Scope, error) {
	var out []facilitator.Scope
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		sc := facilitator.Scope(part)
		if !slices.Contains(facilitator.AllScopes, sc) {
			return nil, fmt.Errorf("unknown scope %q (want verify, settle, status, webhooks or operator)", part)
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("at least one scope is required (verify, settle, status, webhooks, operator)")
	}
	return out, nil
}

// ParsePayTo reads a comma-separated address list (empty: no allow-list).
func ParsePayTo(s string) ([]common.Address, error) {
	var out []common.Address
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if !common.IsHexAddress(part) || !strings.HasPrefix(part, "0x") {
			return nil, fmt.Errorf("pay-to %q is not a 0x address", part)
		}
		a := common.HexToAddress(part)
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// ErrUnauthorized: the key is malformed, unknown, wrong or revoked. Callers must not tell these
// apart in what they answer.
var ErrUnauthorized = errors.New("auth: invalid or revoked API key")

// Store looks keys up by id; an unknown id is facilitator.ErrNotFound.
type Store interface {
	APIKey(ctx context.Context, id string) (*facilitator.APIKey, error)
}

// Authenticate checks a presented key text against store at now (the previous secret of a rotated
// key opens it until its grace ends). A key that must be refused is an
// unauthenticated facilitator.Error wrapping ErrUnauthorized; a store that could not answer is an
// unavailable one wrapping the store's error, whose text stays out of the answer.
func Authenticate(ctx context.Context, store Store, presented string, now time.Time) (*facilitator.APIKey, error) {
	id, ok := ParseID(presented)
	if !ok {
		return nil, refused()
	}
	k, err := store.APIKey(ctx, id)
	if errors.Is(err, facilitator.ErrNotFound) {
		return nil, refused()
	}
	if err != nil {
		return nil, facilitator.Unavailable("", "checking the API key failed; retry later", fmt.Errorf("auth: looking up key %s: %w", id, err))
	}
	if !matches(k, presented, now) || k.Revoked() {
		return nil, refused()
	}
	return k, nil
}

// refused is the one answer to every key that must be refused, so that none can be told apart.
func refused() error {
	return &facilitator.Error{Code: facilitator.EUnauthenticated, Reason: facilitator.ReasonUnauthorized,
		Message: "the API key is invalid or revoked", Err: ErrUnauthorized}
}
