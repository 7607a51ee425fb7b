package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

func (s *Server) verify(c echo.Context) error {
	p, err := readPayment(c)
	tagPayment(c, p)
	if err != nil {
		return s.writeError(c, p, err)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.VerifyTimeout)
	defer cancel()
	res, err := s.cfg.Verifier.Verify(ctx, p)
	if err == nil && res.IsValid && s.cfg.Limits != nil && !facilitator.IsReplay(res.Extensions) {
		err = s.cfg.Limits.CheckLimits(ctx, p)
	}
	if err != nil {
		return s.writeError(c, p, err)
	}
	tags := tagsOf(c)
	tags.reason, tags.payer = res.InvalidReason, res.Payer
	markReplay(c, res.Extensions)
	// Every verdict, valid or not, is 200: v1 clients accept nothing else.
	return c.JSON(http.StatusOK, res)
}

// readPayment reads and decodes a /verify or /settle body. The body is read through a limit so a
// huge upload costs us at most MaxBodyBytes.
func readPayment(c echo.Context) (*facilitator.Payment, error) {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, facilitator.MaxBodyBytes+1))
	if err != nil {
		return nil, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidPayload, "reading the request body failed")
	}
	p, err := facilitator.DecodeRequest(body)
	if err == nil {
		p.IDScope = idScope(c) // payment ids are scoped per API key
		p.KeyID = idScope(c)   // and the key's gas budget pays for its settlements
	}
	return p, err
}

// tagPayment leaves what the access log and the Observer carry about the payment.
func tagPayment(c echo.Context, p *facilitator.Payment) {
	if p == nil {
		return
	}
	tags := tagsOf(c)
	tags.network, tags.payer, tags.paymentID = p.Network, p.Payer, p.PaymentID
	tags.nonce, tags.hasNonce = p.Authorization.Nonce, true
}

// markReplay sets the replay header, and the official packages' EXTENSION-RESPONSES header (base64
// JSON keyed by extension), which their HTTP client attaches to the result as extensionResponses.
func markReplay(c echo.Context, extensions map[string]any) {
	if !facilitator.IsReplay(extensions) {
		return
	}
	h := c.Response().Header()
	h.Set(facilitator.ReplayHeader, "true")
	if b, err := json.Marshal(extensions); err == nil {
		h.Set("EXTENSION-RESPONSES", base64.StdEncoding.EncodeToString(b))
	}
}
