package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Auth modes.
const (
	// AuthOpen lets every request through, without keys: local development only.
	AuthOpen = "open"
	// AuthKeys requires a merchant API key with the route's scope.
	AuthKeys = "keys"
)

// AuthConfig configures merchant API keys and rate limits.
//
// In keys mode a key is sent as "Authorization: Bearer x402_<id>_<secret>" (what the official
// clients' per-endpoint auth headers carry) or as "X-API-Key: <key>". /verify needs the verify
// scope, /settle settle, /v1/authorizations, /v1/payments, /v1/settlements and the console's pages
// (/console) status, /v1/webhooks and /v1/events webhooks, /v1/ops and /console/ops operator;
// /console/static/, /console/login, /console/logout, /supported,
// /healthz, /readyz, /metrics and /openapi.json need no key.
// A key with a payTo allow-list is refused (403) for payments to any other address.
// Payment-identifier ids are scoped to the key that sent them, and webhooks to the key that
// registered them; a webhook registered with a key must name its payTo addresses (within the
// key's allow-list, if it has one).
//
// Rate limits are token buckets held in this process: with several replicas, a client gets up to
// the limit times the number of replicas.
type AuthConfig struct {
	Mode string // AuthOpen or AuthKeys
	// Keys looks keys up (keys mode).
	Keys auth.Store
	// PerKey and PerClient limit the keyed routes per key and per client IP (the TCP peer's
	// address, or behind a trusted proxy the address it forwarded for: Config.TrustedProxies).
	// A zero Rate is no limit.
	PerKey    auth.Limit
	PerClient auth.Limit
	// Now is the clock of the limiters and of the console's sessions (nil: time.Now).
	Now func() time.Time

	// Sessions keeps the console's login sessions (keys mode); nil: the console's cookie opens
	// nothing. SessionTTL is how long a session lasts from its login (0: DefaultSessionTTL).
	Sessions   auth.SessionStore
	SessionTTL time.Duration
	// LoginPerClient and LoginPerKey limit the console's login attempts per client IP and per key
	// id (the public part of the key typed in). A zero Rate is no limit.
	LoginPerClient auth.Limit
	LoginPerKey    auth.Limit
}

// DefaultSessionTTL is how long a console session lasts when AuthConfig.SessionTTL is zero.
const DefaultSessionTTL = 12 * time.Hour

// apiKeyKey is where the middleware leaves the request's *facilitator.APIKey.
const apiKeyKey = "x402.apikey"

type authGuard struct {
	cfg       AuthConfig
	perKey    *auth.Limiter
	perClient *auth.Limiter
}

func newAuthGuard(cfg AuthConfig) *authGuard {
	return &authGuard{cfg: cfg, perKey: auth.NewLimiter(cfg.PerKey, cfg.Now), perClient: auth.NewLimiter(cfg.PerClient, cfg.Now)}
}

// presentedKey returns the key sent in the request's headers, "" if none.
func presentedKey(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, rest, ok := strings.Cut(strings.TrimSpace(h), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(rest)
		}
		return ""
	}
	return strings.TrimSpace(r.Header.Get("X-API-Key"))
}

// credential is the key a request is made with: the one in its headers or, on the console's
// pages only (console) and without one, the key of the console session its cookie names, with
// the session's scopes. Elsewhere a browser's ambient credential must not authorize an API call
// a third-party page could make it send.
func (g *authGuard) credential(r *http.Request, console bool) (*facilitator.APIKey, error) {
	text := presentedKey(r)
	if text == "" && console && g.cfg.Sessions != nil && r.Header.Get("Authorization") == "" {
		if ck, err := r.Cookie(facilitator.ConsoleSessionCookie); err == nil {
			return auth.ResolveSession(r.Context(), g.cfg.Keys, g.cfg.Sessions, ck.Value, g.now())
		}
	}
	if text == "" {
		return nil, &facilitator.Error{Code: facilitator.EUnauthenticated, Reason: facilitator.ReasonUnauthorized,
			Message: "an API key is required (Authorization: Bearer <key>)"}
	}
	return auth.Authenticate(r.Context(), g.cfg.Keys, text, g.now())
}

func (g *authGuard) now() time.Time {
	if g.cfg.Now != nil {
		return g.cfg.Now()
	}
	return time.Now()
}

// isConsolePage reports whether route is one of the console's pages (the lookup pages, the
// Operations page and its data): where the login cookie counts, and where a refusal is a page.
// The console's open routes (assets, login) never ask for a key.
func isConsolePage(route string) bool {
	return route == "/console" || strings.HasPrefix(route, "/console/")
}

// authenticate is the middleware guarding keyed routes. A refused request never reaches a handler,
// so nothing is verified or broadcast for it.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	g := s.guard
	return func(c echo.Context) error {
		// The one access decision (access.go), on the path as the handlers serve it.
		scope := accessScope(c.Request().URL.Path)
		if scope == "" {
			return next(c)
		}
		req := c.Request()
		if ok, wait := g.perClient.Allow(clientAddressOf(req)); !ok {
			return s.refuse(c, rateLimited("too many requests from this address", wait))
		}
		if g.cfg.Mode != AuthKeys {
			return next(c)
		}
		if s.cfg.Receipts != nil && publicRoute(c.Path()) && noCredential(req) {
			// No credential at all: the public view, under its own limit (receipt.go).
			if err := s.allowPublic(c); err != nil {
				return s.refuse(c, err)
			}
			c.Set(publicViewKey, true)
			return next(c)
		}
		key, err := g.credential(req, isConsolePage(c.Path()))
		if err != nil {
			return s.refuse(c, err)
		}
		c.Set(apiKeyKey, key)
		if !key.Has(scope) {
			return s.refuse(c, facilitator.Errorf(facilitator.EForbidden, facilitator.ReasonForbiddenScope, "the API key lacks the %s scope", scope))
		}
		if ok, wait := g.perKey.Allow(key.ID); !ok {
			return s.refuse(c, rateLimited("too many requests with this API key", wait))
		}
		if len(key.PayTo) > 0 && (scope == facilitator.ScopeVerify || scope == facilitator.ScopeSettle) {
			// An undecodable body is left to the handler, which answers 400 without acting on it.
			if p := peekPayment(c); p != nil && !key.AllowsPayTo(p.Requirements.PayTo) {
				return s.refuse(c, payToNotAllowed(p.Requirements.PayTo))
			}
		}
		return next(c)
	}
}

// ConsoleLogin opens and ends the console's login sessions (console.Sessions).
type ConsoleLogin interface {
	// Login checks a key typed into the login form from the client address client, by the
	// middleware's rule for the console's pages, and opens a session for it: its token, for the
	// cookie, and when it expires.
	Login(ctx context.Context, client, key string) (token string, expires time.Time, err error)
	// Logout revokes the session of token: its cookie opens nothing from then on.
	Logout(ctx context.Context, token string) error
}

// ConsoleSessions is the console's login in keys mode; nil in open mode (no key is needed). The
// login attempts are rate-limited per client address and per key id, so that keys cannot be
// tried at the form faster than at the API.
func ConsoleSessions(cfg *AuthConfig) ConsoleLogin {
	if cfg == nil || cfg.Mode != AuthKeys {
		return nil
	}
	ttl := cfg.SessionTTL
	if ttl <= 0 {
		ttl = DefaultSessionTTL
	}
	return &consoleSessions{guard: authGuard{cfg: *cfg}, ttl: ttl,
		perClient: auth.NewLimiter(cfg.LoginPerClient, cfg.Now), perKey: auth.NewLimiter(cfg.LoginPerKey, cfg.Now)}
}

type consoleSessions struct {
	guard     authGuard // its clock and stores
	ttl       time.Duration
	perClient *auth.Limiter
	perKey    *auth.Limiter
}

func (s *consoleSessions) Login(ctx context.Context, client, text string) (string, time.Time, error) {
	if ok, wait := s.perClient.Allow(client); !ok {
		return "", time.Time{}, rateLimited("too many login attempts from this address", wait)
	}
	if id, ok := auth.ParseID(text); ok {
		if ok, wait := s.perKey.Allow(id); !ok {
			return "", time.Time{}, rateLimited("too many login attempts with this key", wait)
		}
	}
	if s.guard.cfg.Sessions == nil {
		return "", time.Time{}, facilitator.Unavailable("", "console sessions are not configured", errors.New("api: AuthConfig.Sessions is nil"))
	}
	now := s.guard.now()
	key, err := auth.Authenticate(ctx, s.guard.cfg.Keys, text, now)
	if err != nil {
		return "", time.Time{}, err
	}
	if !key.Has(facilitator.ScopeStatus) {
		return "", time.Time{}, facilitator.Errorf(facilitator.EForbidden, facilitator.ReasonForbiddenScope, "the API key lacks the %s scope", facilitator.ScopeStatus)
	}
	ttl := s.ttl
	if end, ok := auth.GraceEnd(key, text, now); ok && end.Sub(now) < ttl {
		// A rotated key's old secret opens no session that outlives it.
		ttl = end.Sub(now)
	}
	token, session, err := auth.OpenSession(ctx, s.guard.cfg.Sessions, key, now, ttl)
	if err != nil {
		return "", time.Time{}, err
	}
	return token, session.ExpiresAt, nil
}

func (s *consoleSessions) Logout(ctx context.Context, token string) error {
	if s.guard.cfg.Sessions == nil {
		return nil
	}
	return auth.EndSession(ctx, s.guard.cfg.Sessions, token, s.guard.now())
}

// rateLimited refuses a request past a rate limit until wait has passed.
func rateLimited(msg string, wait time.Duration) error {
	return &facilitator.Error{Code: facilitator.ELimited, Reason: facilitator.ReasonRateLimited, Message: msg, RetryAfter: wait}
}

// payToNotAllowed refuses a payment, or a webhook, for a payee outside the key's allow-list.
func payToNotAllowed(addr common.Address) error {
	return facilitator.Errorf(facilitator.EForbidden, facilitator.ReasonPayToNotAllowed, "the API key may not be used for payments to %s", addr.Hex())
}

// apiKeyOf returns the request's authenticated key, nil in open mode.
func apiKeyOf(c echo.Context) *facilitator.APIKey {
	k, _ := c.Get(apiKeyKey).(*facilitator.APIKey)
	return k
}

// webhookPayToRefusal refuses a webhook key may not register for payTo; nil if it may. With a key,
// a webhook must name its payees: without a filter it would hear every merchant's settlements
// (payers, amounts, transactions). A key with an allow-list may name only addresses on it.
// Entries that are not addresses are left to notify, which refuses the whole request (400).
func webhookPayToRefusal(key *facilitator.APIKey, payTo []string) error {
	if len(payTo) == 0 {
		return &facilitator.Error{Code: facilitator.EForbidden, Reason: facilitator.ReasonPayToNotAllowed,
			Message: "with an API key, a webhook must name the payTo addresses it is for"}
	}
	for _, a := range payTo {
		if len(a) == 2+2*common.AddressLength && common.IsHexAddress(a) && !key.AllowsPayTo(common.HexToAddress(a)) {
			return payToNotAllowed(common.HexToAddress(a))
		}
	}
	return nil
}

// idScope is the payment-identifier scope of the request: its key's id, "" without a key.
func idScope(c echo.Context) string {
	if k := apiKeyOf(c); k != nil {
		return k.ID
	}
	return ""
}

// peekPayment decodes a /verify or /settle body without consuming it; nil if it does not decode.
func peekPayment(c echo.Context) *facilitator.Payment {
	req := c.Request()
	if req.Body == nil {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, facilitator.MaxBodyBytes+1))
	req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), req.Body))
	if err != nil {
		return nil
	}
	p, err := facilitator.DecodeRequest(body)
	if err != nil {
		return nil
	}
	return p
}

// refuse answers a request the guard turned away. The body of a /verify or /settle is peeked at
// for its payer (and network), which the route's answer carries.
func (s *Server) refuse(c echo.Context, err error) error {
	if isConsolePage(c.Path()) && s.cfg.Console != nil {
		// A person at a browser: the login page, or an error page, rather than JSON.
		s.cfg.Console.Refused(c.Response(), c.Request(), err)
		return nil
	}
	var p *facilitator.Payment
	if path := c.Path(); path == "/verify" || path == "/settle" {
		p = peekPayment(c)
	}
	return s.writeError(c, p, err)
}
