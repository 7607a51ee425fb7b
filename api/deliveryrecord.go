package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Deliveries records what a merchant delivered for a settlement (postgres.DB): the settlement it
// picked among the transaction's, the record kept, and whether this request created it.
type Deliveries interface {
	AttachDelivery(ctx context.Context, a facilitator.DeliveryAttachment) (facilitator.DeliveryCandidate, facilitator.DeliveryRecord, bool, error)
}

// maxDeliveryBody bounds a delivery body: a digest, a media type and an authorization's key.
const maxDeliveryBody = 4 << 10

// maxContentType bounds a recorded content type: it is shown on a public receipt.
const maxContentType = 255

// decodeDelivery reads a delivery body into an attachment (its transaction and key are the
// caller's). Every failure is a 400 invalid_delivery saying what is wrong, except an
// authorization's part, which says which part as the status routes do.
func decodeDelivery(body []byte) (facilitator.DeliveryAttachment, error) {
	var a facilitator.DeliveryAttachment
	invalid := func(msg string) error {
		return &facilitator.Error{Code: facilitator.EInvalid, Reason: facilitator.ReasonInvalidDelivery, Message: msg}
	}
	if len(body) > maxDeliveryBody {
		return a, invalid("the body must be JSON of at most 4 KiB")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var b facilitator.DeliveryRequest
	if err := dec.Decode(&b); err != nil {
		return a, invalid(`the body must be {"sha256": "0x…", "contentType": "…", "size": n, "authorization": {"network", "asset", "from", "nonce"}} (contentType, size and authorization optional)`)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return a, invalid("the body must be one JSON object")
	}
	d, err := hexutil.Decode(b.SHA256)
	if err != nil || len(d) != sha256.Size {
		return a, invalid("sha256 must be 0x-prefixed 32-byte hex: the SHA-256 of the response body served")
	}
	a.Record.SHA256 = facilitator.DigestHex([32]byte(d))
	if b.ContentType != "" {
		if err := checkContentType(b.ContentType); err != nil {
			return a, invalid(err.Error())
		}
		a.Record.ContentType = b.ContentType
	}
	if b.Size != nil && *b.Size < 0 {
		return a, invalid("size must be the body's length in bytes, 0 or more")
	}
	a.Record.Size = b.Size
	if b.Authorization != nil {
		k, err := status.ParseKey(b.Authorization.Network, b.Authorization.Asset, b.Authorization.From, b.Authorization.Nonce)
		if err != nil {
			return a, err
		}
		a.Authorization = &k
	}
	return a, nil
}

// checkContentType accepts a media type as a Content-Type header carries it, parameters included.
func checkContentType(ct string) error {
	if len(ct) > maxContentType {
		return errors.New("contentType must be at most 255 characters")
	}
	for i := 0; i < len(ct); i++ {
		if ct[i] < 0x20 || ct[i] > 0x7e {
			return errors.New("contentType must be printable ASCII")
		}
	}
	mt, _, err := mime.ParseMediaType(ct)
	if typ, sub, ok := strings.Cut(mt, "/"); err != nil || !ok || typ == "" || sub == "" || ct != strings.TrimSpace(ct) {
		return errors.New(`contentType must be a media type, e.g. "application/json; charset=utf-8"`)
	}
	return nil
}

// attachDelivery serves POST /v1/settlements/{tx}/delivery.
func (s *Server) attachDelivery(c echo.Context) error {
	tx, err := status.ParseTx(pathParam(c, "tx"))
	if err != nil {
		return s.writeError(c, nil, err)
	}
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxDeliveryBody+1))
	if err != nil {
		return s.writeError(c, nil, &facilitator.Error{Code: facilitator.EInvalid, Reason: facilitator.ReasonInvalidDelivery, Message: "the body could not be read"})
	}
	a, err := decodeDelivery(body)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	a.Tx, a.KeyID = tx, idScope(c)
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StatusTimeout)
	defer cancel()
	target, rec, created, err := s.cfg.Deliveries.AttachDelivery(ctx, a)
	var fe *facilitator.Error
	if err != nil && !errors.As(err, &fe) && !errors.Is(err, facilitator.ErrNotFound) {
		// The ledger did not answer: nothing or the whole record was written, and the same
		// request may be sent again.
		err = facilitator.Unavailable("ledger_unavailable", "the ledger is unavailable; send the same record again", err)
	}
	if err != nil {
		return s.writeError(c, nil, facilitator.Bounded(ctx, err))
	}
	k := target.Key
	ans := facilitator.NewDeliveryAnswer(k, status.AuthorizationPath(k.Network, k.Asset.Hex(), k.Payer.Hex(), hexutil.Encode(k.Nonce[:])), rec)
	if created {
		return c.JSON(http.StatusCreated, ans)
	}
	return c.JSON(http.StatusOK, ans)
}
