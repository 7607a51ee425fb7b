package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Lists reads the merchant's lists (facilitator/postgres.DB): settlements, and a webhook's
// deliveries. What a caller sees is decided by its facilitator.Viewer, from the request's key.
type Lists interface {
	status.SettlementLister
	WebhookDeliveries(ctx context.Context, v facilitator.Viewer, id string, p facilitator.Page) (facilitator.DeliveryPage, error)
}

// listTimeout bounds one page's read; a CSV export reads many pages, each within it.
const listTimeout = 10 * time.Second

// viewerOf is who the request reads as: the one scoping rule, facilitator.ViewerOf.
func viewerOf(c echo.Context) facilitator.Viewer { return facilitator.ViewerOf(apiKeyOf(c)) }

type settlementsJSON struct {
	Settlements []status.SettlementItem `json:"settlements"`
	NextCursor  *string                 `json:"next_cursor"`
}

func cursorJSON(c *facilitator.Cursor) *string {
	if c == nil {
		return nil
	}
	s := status.CursorText(*c)
	return &s
}

func (s *Server) listSettlements(c echo.Context) error {
	f, p, err := status.ParseSettlementQuery(c.QueryParams())
	if err != nil {
		return s.writeError(c, nil, err)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), listTimeout)
	defer cancel()
	page, err := s.cfg.Lists.ListSettlements(ctx, viewerOf(c), f, p)
	if err != nil {
		return s.writeError(c, nil, listError(err))
	}
	out := settlementsJSON{Settlements: make([]status.SettlementItem, len(page.Items)), NextCursor: cursorJSON(page.Next)}
	for i, it := range page.Items {
		out.Settlements[i] = status.Item(it)
	}
	return c.JSON(http.StatusOK, out)
}

// settlementsCSV streams the same list as CSV (status.ServeCSV).
func (s *Server) settlementsCSV(c echo.Context) error {
	f, err := status.ParseCSVQuery(c.QueryParams())
	if err != nil {
		return s.writeError(c, nil, err)
	}
	begun, err := status.ServeCSV(c.Request().Context(), c.Response(), s.cfg.Lists, viewerOf(c), f, listTimeout, time.Now())
	if err != nil {
		if !begun {
			return s.writeError(c, nil, listError(err))
		}
		s.log.ErrorContext(c.Request().Context(), "CSV export failed midway", "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

type deliveryJSON struct {
	EventID       int64      `json:"eventId"`
	State         string     `json:"state"`
	At            time.Time  `json:"at"`
	Network       string     `json:"network"`
	Asset         string     `json:"asset"`
	Payer         string     `json:"payer"`
	Nonce         string     `json:"nonce"`
	StatusURL     string     `json:"statusUrl"`
	Attempts      int        `json:"attempts"`
	LastStatus    int        `json:"lastStatus,omitempty"`
	LastError     string     `json:"lastError,omitempty"`
	CreatedAt     time.Time  `json:"createdAt"`
	DeliveredAt   *time.Time `json:"deliveredAt,omitempty"`
	GaveUpAt      *time.Time `json:"gaveUpAt,omitempty"`
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
}

type deliveriesJSON struct {
	Webhook    webhookJSON    `json:"webhook"`
	Deliveries []deliveryJSON `json:"deliveries"`
	NextCursor *string        `json:"next_cursor"`
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (s *Server) webhookDeliveries(c echo.Context) error {
	q := c.QueryParams()
	for name := range q {
		if name != "limit" && name != "cursor" {
			return s.writeError(c, nil, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "unknown parameter (known: limit, cursor)"))
		}
	}
	// The same limit and cursor forms as the settlements list.
	_, p, err := status.ParseSettlementQuery(q)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), listTimeout)
	defer cancel()
	page, err := s.cfg.Lists.WebhookDeliveries(ctx, viewerOf(c), pathParam(c, "id"), p)
	if err != nil {
		return s.writeError(c, nil, listError(err))
	}
	page.Webhook.Secret = ""
	out := deliveriesJSON{Webhook: toWebhookJSON(page.Webhook), Deliveries: make([]deliveryJSON, len(page.Items)), NextCursor: cursorJSON(page.Next)}
	for i, d := range page.Items {
		it := status.Item(facilitator.ListedSettlement{Settlement: facilitator.Settlement{Key: d.Key}})
		out.Deliveries[i] = deliveryJSON{EventID: d.Event.ID, State: string(d.Event.State), At: d.Event.At.UTC(),
			Network: it.Network, Asset: it.Asset, Payer: it.Payer, Nonce: it.Nonce, StatusURL: it.StatusURL,
			Attempts: d.Attempts, LastStatus: d.LastStatus, LastError: d.LastError, CreatedAt: d.CreatedAt.UTC(),
			DeliveredAt: utcPtr(d.DeliveredAt), GaveUpAt: utcPtr(d.GaveUpAt), NextAttemptAt: utcPtr(d.NextAttempt)}
	}
	return c.JSON(http.StatusOK, out)
}

// Redeliverer sends a given-up webhook delivery again (postgres.DB.RedeliverWebhook): due at
// once, with a fresh count of attempts. It returns when the delivery is due.
type Redeliverer interface {
	RedeliverWebhook(ctx context.Context, v facilitator.Viewer, webhookID string, eventID int64) (time.Time, error)
}

// The refusals of a redelivery.
const (
	// ReasonDeliveryNotGivenUp: the delivery was delivered, or is still being tried.
	ReasonDeliveryNotGivenUp = "delivery_not_given_up"
	// ReasonWebhookDisabled: the webhook was deleted; nothing is sent to it.
	ReasonWebhookDisabled = "webhook_disabled"
)

type redeliveryJSON struct {
	WebhookID     string    `json:"webhookId"`
	EventID       int64     `json:"eventId"`
	NextAttemptAt time.Time `json:"nextAttemptAt"`
}

// redeliver answers POST /v1/webhooks/{id}/deliveries/{eventId}/redeliver: the webhook's owner
// (or an operator key) sends a given-up delivery again.
func (s *Server) redeliver(c echo.Context) error {
	id := pathParam(c, "id")
	ev, err := strconv.ParseInt(pathParam(c, "eventId"), 10, 64)
	if err != nil || ev <= 0 {
		// No delivery has such an event id: answered like an unknown one.
		return s.writeError(c, nil, facilitator.ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), listTimeout)
	defer cancel()
	due, err := s.cfg.Redeliver.RedeliverWebhook(ctx, viewerOf(c), id, ev)
	switch {
	case errors.Is(err, facilitator.ErrDeliveryNotGivenUp):
		err = facilitator.Errorf(facilitator.EConflict, ReasonDeliveryNotGivenUp, "the delivery was not given up: it was delivered, or is still being tried")
	case errors.Is(err, facilitator.ErrWebhookDisabled):
		err = facilitator.Errorf(facilitator.EConflict, ReasonWebhookDisabled, "the webhook is deleted: nothing is sent to it")
	case err != nil && !errors.Is(err, facilitator.ErrNotFound) && facilitator.ErrorCode(err) == facilitator.EInternal:
		err = facilitator.Unavailable("webhooks_unavailable", "the ledger is unavailable, retry", err)
	}
	if err != nil {
		return s.writeError(c, nil, err)
	}
	s.log.InfoContext(c.Request().Context(), "webhook delivery scheduled again", "webhook", id, "event", ev, "api_key", idScope(c))
	return c.JSON(http.StatusAccepted, redeliveryJSON{WebhookID: id, EventID: ev, NextAttemptAt: due.UTC()})
}

// listError is a store's failure as the lists answer it: not found stays so, anything else is
// the ledger being unavailable (the cause goes to the log only).
func listError(err error) error {
	if errors.Is(err, facilitator.ErrNotFound) || facilitator.ErrorCode(err) != facilitator.EInternal {
		return err
	}
	return facilitator.Unavailable("status_unavailable", "the ledger cannot be read right now; retry", err)
}
