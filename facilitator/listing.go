package facilitator

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// The merchant's lists: settlements and webhook deliveries, filtered, newest first, a page at a
// time, and never more than the caller may see.

// Viewer is who reads a list. A merchant key sees only the settlements it made and the webhooks
// it registered; an operator key and open mode see everything.
type Viewer struct {
	// All: every merchant's rows (an operator key, or open mode).
	All bool
	// Key is the id of the merchant key reading ("" in open mode).
	Key string
	// Scopes are the reading key's scopes (every scope in open mode): a handler serving operator
	// data checks ScopeOperator itself (Has), whatever the guard in front of it decided.
	Scopes []Scope
}

// Has reports whether the viewer's key has scope.
func (v Viewer) Has(scope Scope) bool { return slices.Contains(v.Scopes, scope) }

// ViewerOf is the one rule of who sees what: key nil is open mode.
func ViewerOf(key *APIKey) Viewer {
	if key == nil {
		return Viewer{All: true, Scopes: AllScopes}
	}
	return Viewer{All: key.Has(ScopeOperator), Key: key.ID, Scopes: slices.Clone(key.Scopes)}
}

// ConsoleSessionCookie is the cookie the console's login form keeps a session token in (never the
// API key); the API's guard reads it on the console's pages only.
const ConsoleSessionCookie = "x402_console_session"

type viewerKey struct{}

// WithViewer carries the request's Viewer to a handler mounted outside the API's own routes (the
// console), which cannot read the API's request state.
func WithViewer(ctx context.Context, v Viewer) context.Context {
	return context.WithValue(ctx, viewerKey{}, v)
}

// ViewerFrom is the Viewer WithViewer left; without one, a viewer that sees nothing of anyone's
// (no key matches ""), never everything.
func ViewerFrom(ctx context.Context) Viewer {
	v, _ := ctx.Value(viewerKey{}).(Viewer)
	return v
}

// Cursor is a position in a list ordered newest first: the last row of the page before.
type Cursor struct {
	At time.Time
	ID int64
}

// SettlementFilter selects settlements. Zero fields select everything.
type SettlementFilter struct {
	States  []State
	PayTo   *common.Address
	Payer   *common.Address
	Network string
	Since   time.Time // created at or after
	Until   time.Time // created before
}

// Page bounds one read of a list.
type Page struct {
	Limit int
	After *Cursor // nil: from the newest
}

// List limits: the API's page sizes.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// ListedSettlement is a settlement as the lists show it.
type ListedSettlement struct {
	Settlement
	UpdatedAt time.Time
}

// SettlementPage is one page of settlements, and where the next starts (nil: this was the last).
type SettlementPage struct {
	Items []ListedSettlement
	Next  *Cursor
}

// ListedDelivery is one webhook delivery as the lists show it: the event, and every attempt's
// outcome so far.
type ListedDelivery struct {
	Event       SettlementEvent
	Key         AuthorizationKey
	Attempts    int
	LastStatus  int // 0: no answer (or no attempt yet)
	LastError   string
	CreatedAt   time.Time
	DeliveredAt *time.Time
	GaveUpAt    *time.Time
	NextAttempt *time.Time
}

// DeliveryPage is one page of a webhook's deliveries.
type DeliveryPage struct {
	Webhook Webhook
	Items   []ListedDelivery
	Next    *Cursor
}

// Coarse states a filter may name for several ledger states.
var coarseStates = map[string][]State{
	"pending": {StateSigned, StateBroadcast},
	"settled": {StateMined, StateFinal},
	"failed":  {StateReverted, StateExpired, StateSettledElsewhere, StateCanceled},
}

// LedgerStates lists the ledger's states, in a settlement's order.
var LedgerStates = []State{StateSigned, StateBroadcast, StateMined, StateFinal, StateReverted, StateExpired, StateSettledElsewhere, StateCanceled}

// ParseStates reads a state filter: ledger states and the coarse pending, settled and failed,
// comma-separated; ok is false for a name that is neither.
func ParseStates(s string) (states []State, ok bool) {
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if c, found := coarseStates[name]; found {
			states = append(states, c...)
			continue
		}
		found := false
		for _, st := range LedgerStates {
			if string(st) == name {
				states, found = append(states, st), true
			}
		}
		if !found {
			return nil, false
		}
	}
	return states, true
}

type clientAddressKey struct{}

// WithClientAddress carries the address a request comes from, as the API resolved it (its TCP
// peer, or behind a trusted proxy the address the proxy saw), to a handler mounted outside the
// API's own routes (the console), so that both limit the same client by the same key.
func WithClientAddress(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, clientAddressKey{}, addr)
}

// ClientAddressFrom is the address WithClientAddress left; "" without one.
func ClientAddressFrom(ctx context.Context) string {
	a, _ := ctx.Value(clientAddressKey{}).(string)
	return a
}
