package api

import (
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Access to the API and to the console is decided here, once, on the path as it is served. Two
// routers serve it: echo routes the percent-encoded path, and the console's http.ServeMux decodes
// it segment by segment. They agree on every canonical path (below), so every other path is
// refused before either sees it, and the scope is read from the decoded path both then serve.

// accessScope is the scope a request for path (decoded, canonical) needs; "" for the routes
// anyone may call. It matches without regard to case, so no router that folds case, now or
// later, can serve an operator's page under a spelling the guard reads as a merchant's; only the
// open routes must be spelled exactly.
func accessScope(path string) facilitator.Scope {
	if path == "/console/login" || path == "/console/logout" || strings.HasPrefix(path, "/console/static/") {
		// The login form and logout set and clear the key; the assets are the same for everyone.
		return ""
	}
	p := strings.ToLower(path)
	switch {
	case within(p, "/verify"):
		return facilitator.ScopeVerify
	case within(p, "/settle"):
		return facilitator.ScopeSettle
	case isDeliveryPath(p):
		// What a merchant delivered for its settlement is recorded with the key that settled it.
		return facilitator.ScopeSettle
	case strings.HasPrefix(p, "/v1/ops"), strings.HasPrefix(p, "/console/ops"):
		// Operator data, and anything spelled like it.
		return facilitator.ScopeOperator
	case within(p, "/v1/authorizations"), within(p, "/v1/payments"), within(p, "/v1/settlements"), p == "/v1/settlements.csv":
		return facilitator.ScopeStatus
	case within(p, "/v1/webhooks"), within(p, "/v1/events"):
		return facilitator.ScopeWebhooks
	case within(p, "/console"):
		// The console's pages answer what the status routes answer.
		return facilitator.ScopeStatus
	}
	return ""
}

// isDeliveryPath reports whether path (lower case) is /v1/settlements/{tx}/delivery.
func isDeliveryPath(p string) bool {
	segs := strings.Split(p, "/")
	return len(segs) == 5 && segs[1] == "v1" && segs[2] == "settlements" && segs[4] == "delivery"
}

// within reports whether path is prefix or lies under it.
func within(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// canonicalPath checks that escaped, a request's path as sent (percent-encoded), is in its one
// canonical form: no empty segment but a trailing slash, no "." or ".." segment, no encoded
// slash, and no letter, digit or "-._~" percent-encoded (RFC 3986 §6.2.2.2: they mean what they
// would unencoded, and no client sends them so). Such a path has the same segments, and the same
// literal segments, encoded and decoded, which is what makes both routers and the guard read it
// alike. Encoded reserved characters (%3A, what encodeURIComponent makes of eip155:8453) stay.
func canonicalPath(escaped string) bool {
	if !strings.HasPrefix(escaped, "/") {
		return false
	}
	segs := strings.Split(escaped[1:], "/")
	for i, seg := range segs {
		if (seg == "" && i != len(segs)-1) || seg == "." || seg == ".." {
			return false
		}
	}
	for i := 0; i < len(escaped); i++ {
		if escaped[i] != '%' {
			continue
		}
		if i+2 >= len(escaped) || !isHex(escaped[i+1]) || !isHex(escaped[i+2]) {
			return false
		}
		if b := unhex(escaped[i+1])<<4 | unhex(escaped[i+2]); b == '/' || isUnreserved(b) {
			return false
		}
		i += 2
	}
	return true
}

func isUnreserved(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '.' || b == '_' || b == '~'
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

func unhex(b byte) byte {
	switch {
	case '0' <= b && b <= '9':
		return b - '0'
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10
	}
	return b - 'A' + 10
}

// errNonCanonical refuses a path that is not in its canonical form.
var errNonCanonical = &facilitator.Error{Code: facilitator.EInvalid, Reason: facilitator.ReasonNonCanonicalPath,
	Message: "send the path in its canonical form: no doubled slashes, no . or .. segments, no encoded slash, and no letter, digit or -._~ percent-encoded"}

// canonical runs before routing: it refuses a path not in its canonical form, and has echo route
// the percent-encoded path the console's ServeMux reads (echo takes URL.RawPath when set, else
// the decoded URL.Path: after a %25, those differ), so that a path parameter is decoded once.
func (s *Server) canonical(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		escaped := req.URL.EscapedPath()
		if !canonicalPath(escaped) {
			if within(strings.ToLower(req.URL.Path), "/console") && s.cfg.Console != nil {
				s.cfg.Console.Refused(c.Response(), req, errNonCanonical)
				return nil
			}
			return s.writeError(c, nil, errNonCanonical)
		}
		req.URL.RawPath = escaped
		return next(c)
	}
}

// securityHeaders are on every answer, errors included: a JSON answer is never sniffed into a
// page, never framed, and loads nothing. The console sets its own policy for its pages.
func securityHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", apiCSP)
		return next(c)
	}
}

// apiCSP is the Content-Security-Policy of the API's answers: nothing to load, never framed.
const apiCSP = "default-src 'none'; frame-ancestors 'none'"

// requireOperator is the operator scope check a handler serving operator data makes itself,
// whatever the guard in front of it decided (open mode has every scope).
func requireOperator(v facilitator.Viewer) error {
	if v.Has(facilitator.ScopeOperator) {
		return nil
	}
	return facilitator.Errorf(facilitator.EForbidden, facilitator.ReasonForbiddenScope, "the API key lacks the %s scope", facilitator.ScopeOperator)
}
