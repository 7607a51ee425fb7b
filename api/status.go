package api

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Status answers the /v1 status queries.
type Status interface {
	Authorization(ctx context.Context, key facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error)
	Payment(ctx context.Context, scope, id string) (facilitator.AuthorizationStatus, error)
	Settlement(ctx context.Context, tx common.Hash) (facilitator.AuthorizationStatus, error)
}

var (
	addressParam = regexp.MustCompile(`^0[xX][0-9a-fA-F]{40}$`)
	hashParam    = regexp.MustCompile(`^0[xX][0-9a-fA-F]{64}$`)
	idParam      = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
)

// authorizationKeyParam reads the /{network}/{asset}/{from}/{nonce} path of the status and event routes.
func authorizationKeyParam(c echo.Context) (facilitator.AuthorizationKey, error) {
	network, asset, from, nonce := pathParam(c, "network"), pathParam(c, "asset"), pathParam(c, "from"), pathParam(c, "nonce")
	if _, err := facilitator.ParseCAIP2(network); err != nil {
		return facilitator.AuthorizationKey{}, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network must be eip155:<chain id>, got %q", clipParam(network))
	}
	if !addressParam.MatchString(asset) || !addressParam.MatchString(from) {
		return facilitator.AuthorizationKey{}, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "asset and from must be 0x-prefixed 20-byte hex addresses")
	}
	n, ok := status.ParseNonce(nonce)
	if !ok {
		return facilitator.AuthorizationKey{}, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "nonce must be 0x-prefixed 32-byte hex")
	}
	return facilitator.AuthorizationKey{Network: network, Asset: common.HexToAddress(asset), Payer: common.HexToAddress(from), Nonce: n}, nil
}

func (s *Server) authorizationStatus(c echo.Context) error {
	key, err := authorizationKeyParam(c)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	st, found, err := s.cfg.Status.Authorization(c.Request().Context(), key)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	if !found {
		// Never seen by the ledger or the index: 404, still with the chain's word on it.
		return c.JSON(http.StatusNotFound, st)
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) paymentStatus(c echo.Context) error {
	id := pathParam(c, "id")
	if !idParam.MatchString(id) {
		return s.writeError(c, nil, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidPaymentIdentifier, "a payment id is 16 to 128 characters of A-Z, a-z, 0-9, _ and -"))
	}
	st, err := s.cfg.Status.Payment(c.Request().Context(), idScope(c), id)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) settlementStatus(c echo.Context) error {
	tx := pathParam(c, "tx")
	if !hashParam.MatchString(tx) {
		return s.writeError(c, nil, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "the transaction hash must be 0x-prefixed 32-byte hex"))
	}
	st, err := s.cfg.Status.Settlement(c.Request().Context(), common.HexToHash(tx))
	if err != nil {
		return s.writeError(c, nil, err)
	}
	return c.JSON(http.StatusOK, st)
}

func clipParam(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return strings.TrimSpace(s)
}

// pathParam is a path parameter as the client meant it: echo routes on the raw path and hands
// parameters over still percent-encoded (eip155%3A8453 is what encodeURIComponent and OpenAPI
// generators send for eip155:8453).
func pathParam(c echo.Context, name string) string {
	v := c.Param(name)
	if u, err := url.PathUnescape(v); err == nil {
		return u
	}
	return v
}
