package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Notify serves webhook registration and event streams (notify.Dispatcher). A webhook's owner is
// the id of the API key that registered it, "" in open mode: only its owner lists or deletes it.
type Notify interface {
	CreateWebhook(ctx context.Context, owner, url string, payTo []string) (facilitator.Webhook, error)
	Webhooks(ctx context.Context, owner string) ([]facilitator.Webhook, error)
	DisableWebhook(ctx context.Context, owner, id string) error
	OpenStream(ctx context.Context, t notify.Target, lastEventID string) (*notify.Stream, error)
}

// maxWebhookBody bounds a registration body: a URL and up to a hundred addresses.
const maxWebhookBody = 16 << 10

// webhookJSON is a webhook on the wire. Secret appears only in the answer to its creation.
type webhookJSON struct {
	ID        string    `json:"id"`
	Secret    string    `json:"secret,omitempty"`
	URL       string    `json:"url"`
	PayTo     []string  `json:"payTo"`
	CreatedAt time.Time `json:"createdAt"`
}

func toWebhookJSON(w facilitator.Webhook) webhookJSON {
	out := webhookJSON{ID: w.ID, Secret: w.Secret, URL: w.URL, PayTo: make([]string, len(w.PayTo)), CreatedAt: w.CreatedAt.UTC()}
	for i, a := range w.PayTo {
		out.PayTo[i] = a.Hex()
	}
	return out
}

func (s *Server) createWebhook(c echo.Context) error {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxWebhookBody+1))
	if err != nil || len(body) > maxWebhookBody {
		return s.writeError(c, nil, facilitator.Errorf(facilitator.EInvalid, notify.ReasonInvalidWebhook, "the body must be JSON of at most 16 KiB"))
	}
	var req struct {
		URL   string   `json:"url"`
		PayTo []string `json:"payTo"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(body), &req); err != nil {
		return s.writeError(c, nil, facilitator.Errorf(facilitator.EInvalid, notify.ReasonInvalidWebhook, `the body must be {"url": "https://…", "payTo": ["0x…"]}`))
	}
	if key := apiKeyOf(c); key != nil {
		if err := webhookPayToRefusal(key, req.PayTo); err != nil {
			return s.writeError(c, nil, err)
		}
	}
	w, err := s.cfg.Notify.CreateWebhook(c.Request().Context(), idScope(c), req.URL, req.PayTo)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	c.Response().Header().Set("Cache-Control", "no-store") // it carries the secret
	return c.JSON(http.StatusCreated, toWebhookJSON(w))
}

func (s *Server) listWebhooks(c echo.Context) error {
	ws, err := s.cfg.Notify.Webhooks(c.Request().Context(), idScope(c))
	if err != nil {
		return s.writeError(c, nil, err)
	}
	out := make([]webhookJSON, len(ws))
	for i, w := range ws {
		w.Secret = "" // never listed, whatever the store returned
		out[i] = toWebhookJSON(w)
	}
	return c.JSON(http.StatusOK, map[string]any{"webhooks": out})
}

func (s *Server) deleteWebhook(c echo.Context) error {
	if err := s.cfg.Notify.DisableWebhook(c.Request().Context(), idScope(c), pathParam(c, "id")); err != nil {
		return s.writeError(c, nil, err)
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) authorizationEvents(c echo.Context) error {
	key, err := authorizationKeyParam(c)
	if err != nil {
		return s.writeError(c, nil, err)
	}
	return s.stream(c, notify.Target{Key: key, Owner: idScope(c)})
}

func (s *Server) paymentEvents(c echo.Context) error {
	id := pathParam(c, "id")
	if err := status.CheckPaymentID(id); err != nil {
		return s.writeError(c, nil, err)
	}
	return s.stream(c, notify.Target{PaymentID: id, IDScope: idScope(c), Owner: idScope(c)})
}

// stream answers text/event-stream, as one of the request's key's streams: errors before the first byte are JSON like the status
// routes'; after it, the stream just ends and the client reconnects with Last-Event-ID.
func (s *Server) stream(c echo.Context, t notify.Target) error {
	ctx := c.Request().Context()
	st, err := s.cfg.Notify.OpenStream(ctx, t, c.Request().Header.Get("Last-Event-ID"))
	if err != nil {
		return s.writeError(c, nil, err)
	}
	defer st.Close()
	res := c.Response()
	h := res.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx would otherwise hold the events back
	res.WriteHeader(http.StatusOK)
	// A client that lost the connection retries after a second, not the browser's default 3.
	if _, err := io.WriteString(res, "retry: 1000\n\n"); err != nil {
		return nil
	}
	res.Flush()
	err = st.Run(ctx, func(f notify.Frame) error {
		var b bytes.Buffer
		if f.Comment != "" {
			b.WriteString(": " + f.Comment + "\n\n")
		} else {
			b.WriteString("id: " + f.ID + "\nevent: " + f.Event + "\ndata: ")
			b.Write(f.Data) // one line: JSON from encoding/json holds no raw newline
			b.WriteString("\n\n")
		}
		if _, err := res.Write(b.Bytes()); err != nil {
			return err
		}
		res.Flush()
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.log.WarnContext(ctx, "event stream ended early", "path", c.Path(), "err", err)
	}
	return nil
}
