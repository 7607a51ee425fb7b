package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Settler is what /settle needs.
type Settler interface {
	Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error)
	ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error
	// ConfirmDelivery records that out's claimed success was written to its caller: only then
	// does the claim count (a process that dies before it leaves the success to the next
	// identical request). It does not wait for the ledger.
	ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error
}

// releaseTimeout bounds giving an undelivered success back: the caller is gone, so nothing else
// bounds it, and a ledger that does not answer must not hold the handler.
const releaseTimeout = 5 * time.Second

func (s *Server) settle(c echo.Context) error {
	p, err := readPayment(c)
	tagPayment(c, p)
	if err != nil {
		return s.writeError(c, p, err)
	}
	out, err := s.cfg.Settler.Settle(c.Request().Context(), p)
	if err != nil {
		return s.writeError(c, p, err)
	}
	if out.Claimed && !out.ClaimBy.IsZero() && !s.now().Before(out.ClaimBy) {
		// Too late to write: the claim's lease may end before the answer lands, and the success
		// go to another caller as well. This caller asks again.
		s.releaseUndelivered(c, out)
		out = facilitator.SettleOutcome{SettlementID: out.SettlementID, Response: facilitator.SettleResponse{
			ErrorReason: facilitator.ReasonSettlementPending, ErrorMessage: "the transfer is mined; send the same payload again for the answer",
			Transaction: out.Response.Transaction, Network: out.Response.Network, Payer: out.Response.Payer}}
	}
	res := out.Response
	tags := tagsOf(c)
	tags.reason, tags.payer, tags.tx = res.ErrorReason, res.Payer, res.Transaction
	if res.ErrorReason == facilitator.ReasonSettlementPending || res.ErrorReason == facilitator.ReasonPaymentInFlight {
		setRetryAfter(c, 0)
	}
	markReplay(c, res.Extensions)
	// Every outcome, success or not, is 200: v1 clients accept nothing else, and the official v2
	// resource server retries a settlement_pending answer either way.
	delivered := s.writeSettle(c, res)
	switch {
	case delivered && out.Claimed:
		// Written: from now on the claim counts.
		if err := s.cfg.Settler.ConfirmDelivery(context.WithoutCancel(c.Request().Context()), out); err != nil {
			s.log.Error("confirming a written success", "settlement", out.SettlementID, "err", err)
		}
	case out.Claimed:
		// The success never reached the caller: the next identical request gets it instead.
		s.releaseUndelivered(c, out)
	}
	return nil
}

// releaseUndelivered gives back out's claimed success, which is not written to its caller.
func (s *Server) releaseUndelivered(c echo.Context, out facilitator.SettleOutcome) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), releaseTimeout)
	defer cancel()
	if rerr := s.cfg.Settler.ReleaseDelivery(ctx, out); rerr != nil {
		s.log.Error("releasing an undelivered success", "settlement", out.SettlementID, "err", rerr)
	} else {
		s.log.Info("released an undelivered success", "settlement", out.SettlementID, "tx", out.Response.Transaction)
	}
}

// writeSettle writes res and pushes it to the connection at once, and reports whether it can have
// reached the caller. net/http notices a closed connection by cancelling the request context, so
// a context already done when the answer is about to go out means the caller left before it (the
// engine's claim and the payment-id bookkeeping, the slow steps, come before). After that only a
// write or flush error counts: a body this small only lands in net/http's buffer, so the write
// alone never fails for a caller who left, and a context that ends once the answer is flushed
// cannot be told from a caller that read it and closed its connection at once (any client with
// no idle slot for it does); a success that reached its caller must never go to a second one.
func (s *Server) writeSettle(c echo.Context, res facilitator.SettleResponse) bool {
	left := c.Request().Context().Err() != nil
	body, err := json.Marshal(res)
	if err != nil {
		s.log.Error("encoding a settle answer", "err", err)
		return false
	}
	body = append(body, '\n') // what c.JSON writes
	// A known length keeps the answer a plain response rather than a chunked one once flushed.
	c.Response().Header().Set(echo.HeaderContentLength, strconv.Itoa(len(body)))
	if err := c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body); err != nil {
		return false
	}
	// echo's own Flush swallows errors: ask the writer underneath.
	if err := http.NewResponseController(c.Response().Writer).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	return !left
}

func (s *Server) now() time.Time { return s.cfg.Now() }
