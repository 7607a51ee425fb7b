package demo

import (
	"context"
	"crypto/ecdsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// paymentHeader signs auth and wraps it as the official client would: a v2 PaymentPayload
// echoing the accepted requirements, with the payment id in the payment-identifier extension,
// base64 JSON for the PAYMENT-SIGNATURE header.
func paymentHeader(token *devchain.USDC, key *ecdsa.PrivateKey, auth devchain.TransferAuthorization,
	accepted facilitator.PaymentRequirements, resource *facilitator.ResourceInfo, paymentID string) (string, error) {
	sig, err := token.SignTransferAuthorization(key, auth)
	if err != nil {
		return "", err
	}
	payload := mustJSON(facilitator.ExactEVMPayload{
		Signature: hexutil.Encode(sig),
		Authorization: &facilitator.ExactEVMAuthorization{
			From: auth.From.Hex(), To: auth.To.Hex(), Value: auth.Value.String(),
			ValidAfter: auth.ValidAfter.String(), ValidBefore: auth.ValidBefore.String(), Nonce: hexutil.Encode(auth.Nonce[:]),
		},
	})
	pp := facilitator.PaymentPayload{
		X402Version: 2, Resource: resource, Accepted: accepted, Payload: payload,
		Extensions: map[string]json.RawMessage{
			facilitator.PaymentIdentifierKey: mustJSON(map[string]any{"info": map[string]any{"required": false, "id": paymentID}}),
		},
	}
	return base64.StdEncoding.EncodeToString(mustJSON(pp)), nil
}

func decodePaymentRequired(h string) (*paymentRequired, error) {
	raw, err := base64.StdEncoding.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("the 402's %s header is not base64: %w", headerPaymentRequired, err)
	}
	var pr paymentRequired
	if err := json.Unmarshal(raw, &pr); err != nil {
		return nil, fmt.Errorf("the 402's %s header: %w", headerPaymentRequired, err)
	}
	if pr.X402Version != 2 || len(pr.Accepts) == 0 {
		return nil, fmt.Errorf("the 402's %s header is not an x402 v2 PaymentRequired: %s", headerPaymentRequired, raw)
	}
	return &pr, nil
}

func decodePaymentResponse(h string) (*facilitator.SettleResponse, error) {
	if h == "" {
		return nil, fmt.Errorf("the 200 has no %s header", headerPaymentResponse)
	}
	raw, err := base64.StdEncoding.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("the %s header is not base64: %w", headerPaymentResponse, err)
	}
	var sr facilitator.SettleResponse
	if err := json.Unmarshal(raw, &sr); err != nil {
		return nil, fmt.Errorf("the %s header: %w", headerPaymentResponse, err)
	}
	return &sr, nil
}

// get sends GET url, with a PAYMENT-SIGNATURE header when one is given, and reads the answer.
func get(ctx context.Context, c *http.Client, url, payment string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	if payment != "" {
		req.Header.Set(headerPaymentSignature, payment)
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res, body, err
}

// netError says what the agent saw when the connection closed, without the URL around it.
func netError(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed without a response (EOF)"
	default:
		return err.Error()
	}
}
