package facilitator

import (
	"math/big"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// Merchants' API keys as the ledger stores them; auth issues and checks them.

// Scope is what a key may do.
type Scope string

const (
	ScopeVerify   Scope = "verify"
	ScopeSettle   Scope = "settle"
	ScopeStatus   Scope = "status"
	ScopeWebhooks Scope = "webhooks"
	// ScopeOperator reads the operations overview and every merchant's settlements and webhooks;
	// without it a key sees only what it settled and registered.
	ScopeOperator Scope = "operator"
)

// AllScopes lists every scope, in a stable order.
var AllScopes = []Scope{ScopeVerify, ScopeSettle, ScopeStatus, ScopeWebhooks, ScopeOperator}

// APIKey is a stored API key. It never holds the secret, only its hash.
type APIKey struct {
	ID     string
	Hash   [32]byte
	Name   string
	Scopes []Scope
	PayTo  []common.Address // empty: any payTo
	// GasBudgetWei is the key's gas budget per rolling 24 hours (worst-case gas cost of its
	// settlements); nil: the server's default; 0: unlimited.
	GasBudgetWei *big.Int
	CreatedAt    time.Time
	RevokedAt    *time.Time
	// RotatedAt is when the key last had its secret replaced (`facilitator keys rotate`), nil if
	// never. PreviousHash is the hash of the secret that rotation replaced, still accepted until
	// PreviousUntil (the grace, so that a merchant can deploy the new secret before the old one
	// stops); both nil when it was refused at once.
	RotatedAt     *time.Time
	PreviousHash  *[32]byte
	PreviousUntil *time.Time
}

// Has reports whether k carries scope.
func (k *APIKey) Has(scope Scope) bool { return slices.Contains(k.Scopes, scope) }

// AllowsPayTo reports whether k may be used for payments to addr.
func (k *APIKey) AllowsPayTo(addr common.Address) bool {
	return len(k.PayTo) == 0 || slices.Contains(k.PayTo, addr)
}

// Revoked reports whether k has been revoked.
func (k *APIKey) Revoked() bool { return k.RevokedAt != nil }

// InGrace reports whether k's previous secret is still accepted at now.
func (k *APIKey) InGrace(now time.Time) bool {
	return k.PreviousHash != nil && k.PreviousUntil != nil && now.Before(*k.PreviousUntil)
}

// ConsoleSession is a console login as the ledger stores it: the hash of its random token (the
// token itself lives only in the browser's cookie), the key that logged in and the scopes it had
// then. A session counts for no more than its key can still do.
type ConsoleSession struct {
	Hash      [32]byte
	KeyID     string
	Scopes    []Scope
	CreatedAt time.Time
	ExpiresAt time.Time
	RevokedAt *time.Time
}

// Live reports whether s may be used at now: not revoked, not expired.
func (s *ConsoleSession) Live(now time.Time) bool {
	return s.RevokedAt == nil && now.Before(s.ExpiresAt)
}
