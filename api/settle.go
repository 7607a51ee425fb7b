package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// Settler is what /settle needs.
type Settler interface {
	Settle(ctx context.Context, p *facilitator.Payment) (settle.Outcome, error)
	ReleaseDelivery(ctx context.Context, id int64) error
}

func (s *Server) settle(c echo.Context) error {
	p, err := readPayment(c)
	tagPayment(c, p)
	if err != nil {
		return s.settleError(c, p, err)
	}
	out, err := s.cfg.Settler.Settle(c.Request().Context(), p)
	if err != nil {
		return s.settleError(c, p, err)
	}
	res := out.Response
	c.Set(reasonKey, res.ErrorReason)
	c.Set(payerKey, res.Payer)
	c.Set(txKey, res.Transaction)
	if res.ErrorReason == facilitator.ReasonSettlementPending || res.ErrorReason == facilitator.ReasonPaymentInFlight {
		c.Response().Header().Set("Retry-After", retryAfterSeconds)
	}
	markReplay(c, res.Extensions)
	// Every outcome, success or not, is 200: v1 clients accept nothing else, and the official v2
	// resource server retries a settlement_pending answer either way.
	if err := c.JSON(http.StatusOK, res); err != nil && out.Claimed {
		// The success never reached the caller: the next identical request gets it instead.
		if rerr := s.cfg.Settler.ReleaseDelivery(context.WithoutCancel(c.Request().Context()), out.SettlementID); rerr != nil {
			s.log.Error("releasing an undelivered success", "settlement", out.SettlementID, "err", rerr)
		}
		return nil
	}
	return nil
}
