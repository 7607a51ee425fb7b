package api

import (
	"context"
	"net/http"
	"net/url"

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

// authorizationKeyParam reads the /{network}/{asset}/{from}/{nonce} path of the status and event routes.
func authorizationKeyParam(c echo.Context) (facilitator.AuthorizationKey, error) {
	return status.ParseKey(pathParam(c, "network"), pathParam(c, "asset"), pathParam(c, "from"), pathParam(c, "nonce"))
}

func (s *Server) authorizationStatus(c echo.Context) error {
	key, err := authorizationKeyParam(c)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StatusTimeout)
	defer cancel()
	if isPublicView(c) {
		rc, found, err := s.cfg.Receipts.Public(ctx, key)
		if err != nil {
			return s.writeError(c, nil, facilitator.Bounded(ctx, err))
		}
		if !found {
			return c.JSON(http.StatusNotFound, rc)
		}
		return c.JSON(http.StatusOK, rc)
	}
	st, found, err := s.cfg.Status.Authorization(ctx, key)
	if err == nil {
		err = s.withPaymentIDs(ctx, c, &st)
	}
	if err != nil {
		return s.writeError(c, nil, facilitator.Bounded(ctx, err))
	}
	if !found {
		// Never seen by the ledger or the index: 404, still with the chain's word on it.
		return c.JSON(http.StatusNotFound, st)
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) paymentStatus(c echo.Context) error {
	id := pathParam(c, "id")
	if err := status.CheckPaymentID(id); err != nil {
		return s.writeError(c, nil, err)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StatusTimeout)
	defer cancel()
	st, err := s.cfg.Status.Payment(ctx, idScope(c), id)
	if err == nil {
		err = s.withPaymentIDs(ctx, c, &st)
	}
	if err != nil {
		return s.writeError(c, nil, facilitator.Bounded(ctx, err))
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) settlementStatus(c echo.Context) error {
	tx, err := status.ParseTx(pathParam(c, "tx"))
	if err != nil {
		return s.writeError(c, nil, err)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StatusTimeout)
	defer cancel()
	if isPublicView(c) {
		rc, err := s.cfg.Receipts.PublicSettlement(ctx, tx)
		if err != nil {
			return s.writeError(c, nil, facilitator.Bounded(ctx, err))
		}
		return c.JSON(http.StatusOK, rc)
	}
	st, err := s.cfg.Status.Settlement(ctx, tx)
	if err == nil {
		err = s.withPaymentIDs(ctx, c, &st)
	}
	if err != nil {
		return s.writeError(c, nil, facilitator.Bounded(ctx, err))
	}
	return c.JSON(http.StatusOK, st)
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
