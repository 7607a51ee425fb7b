package api

import (
	"bytes"
	"context"
	"io"
	"net"
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
	// address: behind a proxy that is the proxy). A zero Rate is no limit.
	PerKey    auth.Limit
	PerClient auth.Limit
	// Now is the limiters' clock (nil: time.Now).
	Now func() time.Time
}

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

// presentedKey returns the key sent with the request, "" if none. The console's login cookie
// counts only on the console's pages (console): elsewhere a browser's ambient credential must
// not authorize an API call a third-party page could make it send.
func presentedKey(r *http.Request, console bool) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, rest, ok := strings.Cut(strings.TrimSpace(h), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(rest)
		}
		return ""
	}
	if h := strings.TrimSpace(r.Header.Get("X-API-Key")); h != "" || !console {
		return h
	}
	if ck, err := r.Cookie(facilitator.ConsoleKeyCookie); err == nil {
		return strings.TrimSpace(ck.Value)
	}
	return ""
}

// isConsolePage reports whether route is one of the console's pages (the lookup pages, the
// Operations page and its data): where the login cookie counts, and where a refusal is a page.
// The console's open routes (assets, login) never ask for a key.
func isConsolePage(route string) bool {
	return route == "/console" || strings.HasPrefix(route, "/console/")
}

// clientAddress is the TCP peer's IP. Forwarding headers are not trusted: a client could set them.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
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
		if ok, wait := g.perClient.Allow(clientAddress(req)); !ok {
			return s.refuse(c, rateLimited("too many requests from this address", wait))
		}
		if g.cfg.Mode != AuthKeys {
			return next(c)
		}
		text := presentedKey(req, isConsolePage(c.Path()))
		if text == "" {
			return s.refuse(c, &facilitator.Error{Code: facilitator.EUnauthenticated, Reason: facilitator.ReasonUnauthorized,
				Message: "an API key is required (Authorization: Bearer <key>)"})
		}
		key, err := auth.Authenticate(req.Context(), g.cfg.Keys, text)
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

// ConsoleKeyCheck is how the console's login form checks a key before keeping it in a cookie:
// the same lookup and scope rule as the middleware's for the console's pages. Nil in open mode
// (no key is needed).
func ConsoleKeyCheck(cfg *AuthConfig) func(ctx context.Context, key string) error {
	if cfg == nil || cfg.Mode != AuthKeys {
		return nil
	}
	return func(ctx context.Context, text string) error {
		key, err := auth.Authenticate(ctx, cfg.Keys, text)
		if err != nil {
			return err
		}
		if !key.Has(facilitator.ScopeStatus) {
			return facilitator.Errorf(facilitator.EForbidden, facilitator.ReasonForbiddenScope, "the API key lacks the %s scope", facilitator.ScopeStatus)
		}
		return nil
	}
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
