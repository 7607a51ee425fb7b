package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// statusOf is the one table from error categories to HTTP statuses.
var statusOf = map[facilitator.Code]int{
	facilitator.EInvalid:     http.StatusBadRequest,
	facilitator.EConflict:    http.StatusConflict,
	facilitator.ELimited:     http.StatusTooManyRequests,
	facilitator.EUnavailable: http.StatusServiceUnavailable,
	facilitator.EInternal:    http.StatusInternalServerError,
}

// retryAfterSeconds is sent with 503s: the dependency that failed is usually back within seconds.
const retryAfterSeconds = "1"

// setRetryAfter sets Retry-After on a 429 or 503: the error's own advice (rounded up to whole
// seconds) when it has one, else retryAfterSeconds.
func setRetryAfter(c echo.Context, status int, err error) {
	if status != http.StatusServiceUnavailable && status != http.StatusTooManyRequests {
		return
	}
	v := retryAfterSeconds
	if d := facilitator.ErrorRetryAfter(err); d > 0 {
		v = strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
	}
	c.Response().Header().Set("Retry-After", v)
}

// verifyError answers a /verify that got no verdict with a VerifyResponse-shaped body, so that both
// client generations surface the reason instead of a parse error.
func (s *Server) verifyError(c echo.Context, p *facilitator.Payment, err error) error {
	code := facilitator.ErrorCode(err)
	status := statusOf[code]
	res := facilitator.VerifyResponse{
		IsValid:        false,
		InvalidReason:  facilitator.ErrorReason(err, facilitator.ReasonUnexpectedVerifyError),
		InvalidMessage: facilitator.ErrorMessage(err),
	}
	if p != nil {
		res.Payer = p.Payer
	}
	s.logError(c, status, err)
	c.Set(reasonKey, res.InvalidReason)
	setRetryAfter(c, status, err)
	return c.JSON(status, res)
}

// logError logs what the operator must look at; a client's bad request is only counted in the
// access log.
func (s *Server) logError(c echo.Context, status int, err error) {
	if status < 500 {
		return
	}
	s.log.ErrorContext(c.Request().Context(), "request failed", "path", c.Path(), "status", status, "err", err)
}

// handleHTTPError answers what never reached a handler (unknown route, wrong method) and anything
// a handler returned unhandled.
func (s *Server) handleHTTPError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status := http.StatusInternalServerError
	msg := "internal error"
	var he *echo.HTTPError
	if errors.As(err, &he) {
		status = he.Code
		msg = http.StatusText(status)
	}
	s.logError(c, status, err)
	_ = c.JSON(status, map[string]string{"error": msg})
}

// settleError answers a /settle that got no outcome with a SettleResponse-shaped body: transaction
// and network are always present, as the official client's schema requires. Nothing was broadcast.
func (s *Server) settleError(c echo.Context, p *facilitator.Payment, err error) error {
	code := facilitator.ErrorCode(err)
	status := statusOf[code]
	res := facilitator.SettleResponse{
		Success:      false,
		ErrorReason:  facilitator.ErrorReason(err, facilitator.ReasonUnexpectedSettleError),
		ErrorMessage: facilitator.ErrorMessage(err),
		Transaction:  "",
	}
	if p != nil {
		res.Payer, res.Network = p.Payer, p.Network
	}
	s.logError(c, status, err)
	c.Set(reasonKey, res.ErrorReason)
	setRetryAfter(c, status, err)
	return c.JSON(status, res)
}
