package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// statusOf is the one table from error categories to HTTP statuses.
var statusOf = map[facilitator.Code]int{
	facilitator.EInvalid:         http.StatusBadRequest,
	facilitator.EUnauthenticated: http.StatusUnauthorized,
	facilitator.EForbidden:       http.StatusForbidden,
	facilitator.ENotFound:        http.StatusNotFound,
	facilitator.EConflict:        http.StatusConflict,
	facilitator.ELimited:         http.StatusTooManyRequests,
	facilitator.EUnavailable:     http.StatusServiceUnavailable,
	facilitator.EInternal:        http.StatusInternalServerError,
}

// challenge is the WWW-Authenticate of a 401 (RFC 6750): invalid_token only when a key was sent.
func challenge(err error) string {
	if errors.Is(err, auth.ErrUnauthorized) {
		return `Bearer realm="x402-facilitator", error="invalid_token"`
	}
	return `Bearer realm="x402-facilitator"`
}

// setRetryAfter is the one place Retry-After is set: wait rounded up to whole seconds, and at
// least one, since what failed (a dependency, a settlement still in flight) is usually done within
// seconds.
func setRetryAfter(c echo.Context, wait time.Duration) {
	secs := max(1, int64((wait+time.Second-1)/time.Second))
	c.Response().Header().Set("Retry-After", strconv.FormatInt(secs, 10))
}

// writeError is the one writer of error answers: the status from the table, Retry-After on a 429
// or 503, a challenge on a 401, and the body in the shape the route's clients parse: a
// VerifyResponse for /verify and a SettleResponse for /settle (with p's payer and network when the
// body decoded, so that both client generations surface the reason instead of a parse error;
// nothing was broadcast), {"error": reason, "message": …} elsewhere. An *echo.HTTPError, what never
// reached a handler or failed in one outright, answers only {"error": its text}, whatever the route.
func (s *Server) writeError(c echo.Context, p *facilitator.Payment, err error) error {
	var he *echo.HTTPError
	if errors.As(err, &he) {
		s.logError(c, he.Code, err)
		return c.JSON(he.Code, map[string]string{"error": fmt.Sprint(he.Message)})
	}
	if errors.Is(err, facilitator.ErrNotFound) {
		err = &facilitator.Error{Code: facilitator.ENotFound, Reason: facilitator.ReasonNotFound, Message: "nothing is known here under this key", Err: err}
	}
	code := facilitator.ErrorCode(err)
	status := statusOf[code]
	s.logError(c, status, err)
	switch status {
	case http.StatusUnauthorized:
		c.Response().Header().Set("WWW-Authenticate", challenge(err))
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		setRetryAfter(c, facilitator.ErrorRetryAfter(err))
	}
	msg := facilitator.ErrorMessage(err)
	switch c.Path() {
	case "/verify":
		res := facilitator.VerifyResponse{
			IsValid:        false,
			InvalidReason:  facilitator.ErrorReason(err, facilitator.ReasonUnexpectedVerifyError),
			InvalidMessage: msg,
		}
		if p != nil {
			res.Payer = p.Payer
		}
		tagsOf(c).reason = res.InvalidReason
		return c.JSON(status, res)
	case "/settle":
		// transaction and network are always present, as the official client's schema requires.
		res := facilitator.SettleResponse{
			Success:      false,
			ErrorReason:  facilitator.ErrorReason(err, facilitator.ReasonUnexpectedSettleError),
			ErrorMessage: msg,
			Transaction:  "",
		}
		if p != nil {
			res.Payer, res.Network = p.Payer, p.Network
		}
		tagsOf(c).reason = res.ErrorReason
		return c.JSON(status, res)
	}
	fallback := "internal_error"
	if code == facilitator.EUnavailable {
		fallback = "unavailable"
	}
	reason := facilitator.ErrorReason(err, fallback)
	tagsOf(c).reason = reason
	return c.JSON(status, map[string]string{"error": reason, "message": msg})
}

// logError logs what the operator must look at; a client's bad request is only counted in the
// access log.
func (s *Server) logError(c echo.Context, status int, err error) {
	if status < 500 {
		return
	}
	s.log.ErrorContext(c.Request().Context(), "request failed", "path", c.Path(), "status", status, "err", err)
}

// handleHTTPError answers what never reached a handler (unknown route, wrong method; echo's own
// errors carry their status's text) and anything a handler returned unanswered (a panic, a bug),
// which says no more than "internal error".
func (s *Server) handleHTTPError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	if !errors.As(err, &he) {
		he = echo.NewHTTPError(http.StatusInternalServerError, "internal error").SetInternal(err)
	}
	_ = s.writeError(c, nil, he)
}

// HTTPStatus is the HTTP status an error answers with, by the same table as the API's answers:
// the console's pages use it too.
func HTTPStatus(err error) int {
	if errors.Is(err, facilitator.ErrNotFound) {
		return http.StatusNotFound
	}
	return statusOf[facilitator.ErrorCode(err)]
}
