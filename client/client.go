// Package client is a Go client for this facilitator's HTTP API: /verify, /settle, /supported and
// the /v1 status endpoints. It never signs anything: it carries a payload someone else signed, and
// its retries resend exactly that payload (same authorization, same payment id), honouring
// Retry-After, so that a retry can never become a second payment.
package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Client talks to one facilitator.
type Client struct {
	base    string
	http    *http.Client
	retries int
	maxWait time.Duration
	headers http.Header
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (default: one with a 100 s timeout, above the server's bound
// on a settle).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithRetries sets how many times Settle resends a payload whose outcome is not known yet
// (settlement_pending, payment_in_flight, 503), and how many times a lookup asks again after a
// 503 (the node did not answer in time); default 5.
func WithRetries(n int) Option { return func(c *Client) { c.retries = n } }

// WithMaxRetryWait caps the wait between retries, whatever Retry-After says (default 30 s).
func WithMaxRetryWait(d time.Duration) Option { return func(c *Client) { c.maxWait = d } }

// WithHeader adds a header to every request (an API key, when the facilitator requires one).
func WithHeader(key, value string) Option { return func(c *Client) { c.headers.Add(key, value) } }

// New returns a client for the facilitator at baseURL.
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{Timeout: 100 * time.Second},
		retries: 5, maxWait: 30 * time.Second, headers: http.Header{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Error is an answer that carries no result: a 4xx or 5xx with the facilitator's reason.
type Error struct {
	Status  int
	Reason  string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("facilitator: HTTP %d %s: %s", e.Status, e.Reason, e.Message)
}

// Verify posts body (a {x402Version, paymentPayload, paymentRequirements} request) to /verify.
// A verdict, valid or not, is a response; an error means no verdict was given.
func (c *Client) Verify(ctx context.Context, body []byte) (*facilitator.VerifyResponse, error) {
	var res facilitator.VerifyResponse
	status, _, err := c.do(ctx, http.MethodPost, "/verify", body, &res)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return &res, &Error{Status: status, Reason: res.InvalidReason, Message: res.InvalidMessage}
	}
	return &res, nil
}

// Settle posts body to /settle and, while the outcome is not known yet (settlement_pending,
// payment_in_flight, or a 503 that sent nothing), resends the very same body after Retry-After,
// up to the retry limit or ctx's deadline. The last answer is returned: a success, a definite
// failure, or still pending (then ask the status endpoints later; never sign again).
func (c *Client) Settle(ctx context.Context, body []byte) (*facilitator.SettleResponse, error) {
	for attempt := 0; ; attempt++ {
		var res facilitator.SettleResponse
		status, h, err := c.do(ctx, http.MethodPost, "/settle", body, &res)
		if err != nil {
			return nil, err
		}
		retry := status == http.StatusServiceUnavailable ||
			(status == http.StatusOK && (res.ErrorReason == facilitator.ReasonSettlementPending || res.ErrorReason == facilitator.ReasonPaymentInFlight))
		if !retry || attempt >= c.retries {
			if status != http.StatusOK {
				return &res, &Error{Status: status, Reason: res.ErrorReason, Message: res.ErrorMessage}
			}
			return &res, nil
		}
		if !c.wait(ctx, h.Get("Retry-After"), attempt) {
			return &res, nil // out of time: the caller gets the pending answer, with its hash
		}
	}
}

// wait sleeps per Retry-After (seconds), or backs off 1 s, 2 s, 4 s… when there is none.
func (c *Client) wait(ctx context.Context, retryAfter string, attempt int) bool {
	d := time.Duration(1<<min(attempt, 5)) * time.Second
	if s, err := strconv.Atoi(strings.TrimSpace(retryAfter)); err == nil && s >= 0 {
		d = time.Duration(s) * time.Second
	}
	d = min(d, c.maxWait)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	return facilitator.Sleep(ctx, d)
}

// Supported returns /supported.
func (c *Client) Supported(ctx context.Context) (*facilitator.SupportedResponse, error) {
	var res facilitator.SupportedResponse
	if err := c.get(ctx, "/supported", &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Authorization returns what happened to an authorization. An authorization the facilitator has
// never seen is answered too (found is false), with the chain's word on it.
func (c *Client) Authorization(ctx context.Context, key facilitator.AuthorizationKey) (st *facilitator.AuthorizationStatus, found bool, err error) {
	path := "/v1/authorizations/" + url.PathEscape(key.Network) + "/" + key.Asset.Hex() + "/" + key.Payer.Hex() + "/" + hexutil.Encode(key.Nonce[:])
	var res facilitator.AuthorizationStatus
	status, err := c.lookup(ctx, path, &res)
	switch {
	case err != nil:
		return nil, false, err
	case status == http.StatusOK:
		return &res, true, nil
	case status == http.StatusNotFound && res.State != "":
		return &res, false, nil
	default:
		return nil, false, c.statusError(status, path)
	}
}

// Payment returns the status of the settlement made under a payment-identifier id.
func (c *Client) Payment(ctx context.Context, id string) (*facilitator.AuthorizationStatus, error) {
	var res facilitator.AuthorizationStatus
	return &res, c.get(ctx, "/v1/payments/"+url.PathEscape(id), &res)
}

// Settlement returns the status of the settlement one of whose transactions is tx.
func (c *Client) Settlement(ctx context.Context, tx common.Hash) (*facilitator.AuthorizationStatus, error) {
	var res facilitator.AuthorizationStatus
	return &res, c.get(ctx, "/v1/settlements/"+tx.Hex(), &res)
}

// AttachDelivery records, with the key that made the settlement of transaction tx, what the
// merchant served for it: body's SHA-256 and size, and contentType ("" for none). auth names the
// settlement among a batch's (nil: the transaction's only one). The record is kept once: the same
// record again answers the one kept (a retry after a lost answer is safe, and 503s are retried
// like a lookup's), a different one is an *Error with reason delivery_conflict. Call it after
// the paid response was written: the payer can then hash what it received and compare with the
// record on the authorization's status.
func (c *Client) AttachDelivery(ctx context.Context, tx common.Hash, auth *facilitator.AuthorizationKey, body []byte, contentType string) (*facilitator.DeliveryAnswer, error) {
	digest := sha256.Sum256(body)
	size := int64(len(body))
	req := facilitator.DeliveryRequest{SHA256: hexutil.Encode(digest[:]), ContentType: contentType, Size: &size}
	if auth != nil {
		req.Authorization = &facilitator.DeliveryAuthorization{Network: auth.Network, Asset: auth.Asset.Hex(), From: auth.Payer.Hex(), Nonce: hexutil.Encode(auth.Nonce[:])}
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	path := "/v1/settlements/" + tx.Hex() + "/delivery"
	for attempt := 0; ; attempt++ {
		// One of the two shapes: the answer, or a refusal's {error, message}.
		var res struct {
			facilitator.DeliveryAnswer
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		status, h, err := c.do(ctx, http.MethodPost, path, raw, &res)
		switch {
		case err != nil:
			return nil, err
		case status == http.StatusOK || status == http.StatusCreated:
			return &res.DeliveryAnswer, nil
		case status == http.StatusServiceUnavailable && attempt < c.retries && c.wait(ctx, h.Get("Retry-After"), attempt):
			continue
		}
		if res.Error == "" {
			res.Error, res.Message = http.StatusText(status), "POST "+path
		}
		return nil, &Error{Status: status, Reason: res.Error, Message: res.Message}
	}
}

// ErrNotFound is returned by the status lookups for what the facilitator has never seen.
var ErrNotFound = errors.New("facilitator: not found")

func (c *Client) get(ctx context.Context, path string, out any) error {
	status, err := c.lookup(ctx, path, out)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return c.statusError(status, path)
	}
	return nil
}

// lookup GETs path, asking again after Retry-After while the answer is 503: a lookup changes
// nothing, and a 503 says the facilitator could not read the chain just then, not what happened.
func (c *Client) lookup(ctx context.Context, path string, out any) (int, error) {
	for attempt := 0; ; attempt++ {
		status, h, err := c.do(ctx, http.MethodGet, path, nil, out)
		if err != nil || status != http.StatusServiceUnavailable || attempt >= c.retries ||
			!c.wait(ctx, h.Get("Retry-After"), attempt) {
			return status, err
		}
	}
}

func (c *Client) statusError(status int, path string) error {
	if status == http.StatusNotFound {
		return ErrNotFound
	}
	return &Error{Status: status, Reason: http.StatusText(status), Message: "GET " + path}
}

// do sends one request and decodes a JSON body into out whatever the status.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) (int, http.Header, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range c.headers {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return 0, nil, err
	}
	if len(raw) > 0 && json.Valid(raw) {
		if err := decodeStrict(raw, out); err != nil && res.StatusCode == http.StatusOK {
			return 0, nil, fmt.Errorf("facilitator: %s %s answered 200 with an unexpected body: %w", method, path, err)
		}
	} else if res.StatusCode == http.StatusOK {
		return 0, nil, fmt.Errorf("facilitator: %s %s answered 200 without JSON", method, path)
	}
	return res.StatusCode, res.Header, nil
}

// decodeStrict decodes raw into out (a pointer to a struct) the way the x402 schema reads it: a
// JSON object whose values have the fields' types and whose keys match the fields exactly
// (encoding/json alone also reads "Success" as "success", and goes on past a mistyped field).
func decodeStrict(raw []byte, out any) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil || keys == nil {
		return errors.New("not a JSON object")
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return err
	}
	t := reflect.TypeOf(out).Elem()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		for k := range keys {
			if k != name && strings.EqualFold(k, name) {
				return fmt.Errorf("key %q where %q is expected", k, name)
			}
		}
	}
	return nil
}
