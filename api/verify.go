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
	if b, ok := validAnswer(res); ok && c.Request().URL.RawQuery == "" { // c.JSON indents for ?pretty
		return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, b)
	}
	return c.JSON(http.StatusOK, res)
}

// validAnswer is what c.JSON writes for the common answer, {"isValid":true,"payer":"0x…"} and a
// newline, without the encoder's reflection; ok is false for any other answer, and for a payer
// that is not plain letters and digits (which the encoder might escape).
func validAnswer(res facilitator.VerifyResponse) ([]byte, bool) {
	if !res.IsValid || res.InvalidReason != "" || res.InvalidMessage != "" || res.Extensions != nil || res.Extra != nil {
		return nil, false
	}
	if res.Payer == "" {
		return []byte("{\"isValid\":true}\n"), true
	}
	for i := 0; i < len(res.Payer); i++ {
		if c := res.Payer[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return nil, false
		}
	}
	b := make([]byte, 0, 32+len(res.Payer))
	b = append(b, `{"isValid":true,"payer":"`...)
	b = append(b, res.Payer...)
	return append(b, "\"}\n"...), true
}

// readPayment reads and decodes a /verify or /settle body. The body is read through a limit so a
// huge upload costs us at most MaxBodyBytes.
func readPayment(c echo.Context) (*facilitator.Payment, error) {
	r := c.Request()
	body, err := readAll(io.LimitReader(r.Body, facilitator.MaxBodyBytes+1), min(r.ContentLength, facilitator.MaxBodyBytes))
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

// readAll is io.ReadAll with room for size bytes from the start (the request's Content-Length,
// when sent): io.ReadAll starts at 512 bytes and grows, four allocations and copies for a
// typical 2 KiB payment.
func readAll(r io.Reader, size int64) ([]byte, error) {
	b := make([]byte, 0, max(512, size+1)) // +1: the read that finds EOF needs room
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
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
