package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Public receipts: an agent that paid holds its authorization's key (network, asset, payer,
// nonce) and nothing else, no API key; it reads what happened to its payment in the public view
// (facilitator.Receipt, whose rule status.Service.Public states). Under --auth keys the status
// routes answer a request without any credential in that view; a request with a credential is
// judged as before (a bad key is 401, never a quiet downgrade to the public view). The receipt
// pages (/r/…) answer the public view in every mode.

// Receipts answers the public view (status.Service).
type Receipts interface {
	Public(ctx context.Context, key facilitator.AuthorizationKey) (facilitator.Receipt, bool, error)
	PublicSettlement(ctx context.Context, tx common.Hash) (facilitator.Receipt, error)
}

// PaymentIDs lists the payment-identifier ids that resolved to an authorization, as a viewer may
// see them (postgres.DB): the merchant's full view carries them, the public view never does.
type PaymentIDs interface {
	PaymentIDsOf(ctx context.Context, key facilitator.AuthorizationKey, v facilitator.Viewer) ([]string, error)
}

// ReceiptPage renders the public view for a person (console.Console): a page that reads and prints
// without JavaScript.
type ReceiptPage interface {
	// ServeReceipt writes the receipt page; found is false for an authorization known only by the
	// chain's word (404, still with that word).
	ServeReceipt(w http.ResponseWriter, r *http.Request, rc facilitator.Receipt, found bool)
	// ReceiptError writes the page of a lookup that failed (err: its status by the API's table).
	ReceiptError(w http.ResponseWriter, r *http.Request, err error)
}

// publicViewKey marks a request the guard let through without a key, for the public view.
const publicViewKey = "x402.public"

// isPublicView reports whether the request is answered in the public view.
func isPublicView(c echo.Context) bool {
	v, _ := c.Get(publicViewKey).(bool)
	return v
}

// publicRoute reports whether route (echo's route path) answers the public view without a key.
func publicRoute(route string) bool {
	return route == "/v1/authorizations/:network/:asset/:from/:nonce" || route == "/v1/settlements/:tx"
}

// noCredential reports whether the request carries no credential at all: no Authorization header
// and no X-API-Key. Only such a request gets the public view.
func noCredential(r *http.Request) bool {
	return r.Header.Get("Authorization") == "" && strings.TrimSpace(r.Header.Get("X-API-Key")) == ""
}

// allowPublic is the public view's own rate limit, per client address (behind a trusted proxy,
// the address it forwarded for): a lookup of an unknown nonce costs chain reads, and anyone may
// make one.
func (s *Server) allowPublic(c echo.Context) error {
	if ok, wait := s.publicLimit.Allow(clientAddressOf(c.Request())); !ok {
		return rateLimited("too many receipt lookups from this address", wait)
	}
	return nil
}

// receipt serves /r/{network}/{asset}/{from}/{nonce}: the page, or with ".json" after the nonce or
// "Accept: application/json", the public view's JSON (what the status route answers without a key).
func (s *Server) receipt(c echo.Context) error {
	req := c.Request()
	nonce, asJSON := strings.CutSuffix(pathParam(c, "nonce"), ".json")
	asJSON = asJSON || s.cfg.ReceiptPage == nil || wantsJSON(req)
	c.Response().Header().Add("Vary", "Accept")
	fail := func(err error) error {
		if asJSON {
			return s.writeError(c, nil, err)
		}
		s.cfg.ReceiptPage.ReceiptError(c.Response(), req, err)
		return nil
	}
	if err := s.allowPublic(c); err != nil {
		return fail(err)
	}
	key, err := status.ParseKey(pathParam(c, "network"), pathParam(c, "asset"), pathParam(c, "from"), nonce)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(req.Context(), s.cfg.StatusTimeout)
	defer cancel()
	rc, found, err := s.cfg.Receipts.Public(ctx, key)
	if err != nil {
		return fail(facilitator.Bounded(ctx, err))
	}
	if !asJSON {
		s.cfg.ReceiptPage.ServeReceipt(c.Response(), req, rc, found)
		return nil
	}
	if !found {
		return c.JSON(http.StatusNotFound, rc)
	}
	return c.JSON(http.StatusOK, rc)
}

// wantsJSON reports whether the request asks for JSON before HTML.
func wantsJSON(r *http.Request) bool {
	accept := r.Header.Get("Accept")
	json := strings.Index(accept, "application/json")
	html := strings.Index(accept, "text/html")
	return json >= 0 && (html < 0 || json < html)
}

// withPaymentIDs adds to a full view the payment ids that resolved to it, as the request's key may
// see them.
func (s *Server) withPaymentIDs(ctx context.Context, c echo.Context, st *facilitator.AuthorizationStatus) error {
	if s.cfg.PaymentIDs == nil || st.Network == "" {
		return nil
	}
	key, err := status.ParseKey(st.Network, st.Asset, st.Authorizer, st.Nonce)
	if err != nil {
		return err
	}
	ids, err := s.cfg.PaymentIDs.PaymentIDsOf(ctx, key, viewerOf(c))
	if err != nil {
		return facilitator.Unavailable("status_unavailable", "the ledger is unavailable, retry", err)
	}
	st.PaymentIDs = ids
	return nil
}
