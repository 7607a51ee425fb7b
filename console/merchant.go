package console

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// The merchant's own view: its settlements (filtered, paged, as CSV), one payer's authorizations,
// and its webhooks with their deliveries. Every page reads the same lists the API answers
// (api/lists.go), as the request's key may see them (facilitator.ViewerFrom).

// Merchant reads the merchant's lists (facilitator/postgres.DB).
type Merchant interface {
	status.SettlementLister
	WebhookDeliveries(ctx context.Context, v facilitator.Viewer, id string, p facilitator.Page) (facilitator.DeliveryPage, error)
	Webhooks(ctx context.Context, owner string) ([]facilitator.Webhook, error)
}

type rowView struct {
	Created, State, Amount, Payer, Payee, Transaction, Lookup string
}

type listView struct {
	Heading  string
	Empty    string
	Rows     []rowView
	Next     string // the next page's URL, "" on the last
	CSV      string // the CSV export of the same filters, "" where none is offered
	Filter   filterView
	ShowForm bool
}

type filterView struct {
	State, Payee, Since, Until string
	States                     []string
}

type webhookView struct {
	ID, URL, Created, Link string
	PayTo                  []string
}

type deliveryView struct {
	Event, At, Lookup, Attempts, LastStatus, LastError, Result string
}

type webhooksView struct {
	Webhooks   []webhookView
	Webhook    *webhookView
	Deliveries []deliveryView
	Next       string
}

// formTime lets the form's datetime-local inputs ("2026-01-02T15:04", read as UTC) stand for
// the RFC 3339 times the list takes.
func formTime(s string) string {
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC().Format(time.RFC3339)
		}
	}
	return s
}

// listQuery is the request's filters in the list's form.
func listQuery(r *http.Request) url.Values {
	q := url.Values{}
	for k, vs := range r.URL.Query() {
		for _, v := range vs {
			if v = strings.TrimSpace(v); v == "" {
				continue
			}
			if k == "since" || k == "until" {
				v = formTime(v)
			}
			q.Add(k, v)
		}
	}
	return q
}

func (c *Console) rows(items []facilitator.ListedSettlement) []rowView {
	out := make([]rowView, len(items))
	for i, s := range items {
		it := status.Item(s)
		out[i] = rowView{Created: s.CreatedAt.UTC().Format("2006-01-02 15:04:05 UTC"), State: it.State,
			Amount: c.amount(it.Network, it.Asset, it.Amount), Payer: it.Payer, Payee: it.Payee,
			Transaction: it.Transaction, Lookup: authorizationPath(it.Network, it.Asset, it.Payer, it.Nonce)}
	}
	return out
}

func (c *Console) settlements(w http.ResponseWriter, r *http.Request) {
	q := listQuery(r)
	f, p, err := status.ParseSettlementQuery(q)
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	res, err := c.cfg.Merchant.ListSettlements(ctx, facilitator.ViewerFrom(r.Context()), f, p)
	if err != nil {
		c.errorPage(w, r, "", facilitator.Bounded(ctx, err))
		return
	}
	filters := url.Values{}
	for _, k := range []string{"state", "payee", "payer", "network", "since", "until"} {
		if q.Has(k) {
			filters[k] = q[k]
		}
	}
	v := listView{Heading: "Settlements", Rows: c.rows(res.Items), ShowForm: true, CSV: "/console/settlements.csv",
		Empty: "No settlements yet: payments settled with this key appear here.",
		Filter: filterView{State: r.URL.Query().Get("state"), Payee: r.URL.Query().Get("payee"),
			Since: r.URL.Query().Get("since"), Until: r.URL.Query().Get("until"), States: stateChoices}}
	if len(filters) > 0 {
		v.CSV += "?" + filters.Encode()
		v.Empty = "No settlements match these filters."
	}
	if res.Next != nil {
		next := url.Values{}
		for k, vs := range filters {
			next[k] = vs
		}
		next.Set("cursor", status.CursorText(*res.Next))
		if q.Has("limit") {
			next.Set("limit", q.Get("limit"))
		}
		v.Next = "/console/settlements?" + next.Encode()
	}
	c.render(w, http.StatusOK, "settlements", page{Title: "Settlements", Nav: "settlements", List: &v})
}

// stateChoices are the filter form's states: the coarse ones, then the ledger's.
var stateChoices = func() []string {
	out := []string{"pending", "settled", "failed"}
	for _, s := range facilitator.LedgerStates {
		out = append(out, string(s))
	}
	return out
}()

func (c *Console) settlementsCSV(w http.ResponseWriter, r *http.Request) {
	f, err := status.ParseCSVQuery(listQuery(r))
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	begun, err := status.ServeCSV(r.Context(), w, c.cfg.Merchant, facilitator.ViewerFrom(r.Context()), f, c.cfg.QueryTimeout, time.Now())
	if err != nil {
		if !begun {
			c.errorPage(w, r, "", err)
			return
		}
		c.log.ErrorContext(r.Context(), "console: CSV export failed midway", "err", err)
		panic(http.ErrAbortHandler) // a broken transfer, never a short file that looks whole
	}
}

func (c *Console) payer(w http.ResponseWriter, r *http.Request) {
	addr := r.PathValue("address")
	if !status.IsAddress(addr) {
		c.errorPage(w, r, addr, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "a payer is a 0x-prefixed 20-byte hex address"))
		return
	}
	payer := common.HexToAddress(addr)
	p := facilitator.Page{Limit: facilitator.DefaultPageLimit}
	if s := r.URL.Query().Get("cursor"); s != "" {
		cur, ok := status.ParseCursor(s)
		if !ok {
			c.errorPage(w, r, addr, facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "cursor must be a next page's link"))
			return
		}
		p.After = &cur
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	res, err := c.cfg.Merchant.ListSettlements(ctx, facilitator.ViewerFrom(r.Context()), facilitator.SettlementFilter{Payer: &payer}, p)
	if err != nil {
		c.errorPage(w, r, addr, facilitator.Bounded(ctx, err))
		return
	}
	self := "/console/payers/" + payer.Hex()
	v := listView{Heading: "Payer " + payer.Hex(), Rows: c.rows(res.Items),
		Empty: "No authorizations from this payer that this key may see."}
	if res.Next != nil {
		v.Next = self + "?cursor=" + url.QueryEscape(status.CursorText(*res.Next))
	}
	c.render(w, http.StatusOK, "settlements", page{Title: "Payer " + shortHex(payer.Hex()), Query: payer.Hex(), List: &v})
}

func webhookViewOf(wh facilitator.Webhook) webhookView {
	v := webhookView{ID: wh.ID, URL: wh.URL, Created: wh.CreatedAt.UTC().Format("2006-01-02 15:04 UTC"), Link: "/console/webhooks/" + wh.ID}
	for _, a := range wh.PayTo {
		v.PayTo = append(v.PayTo, a.Hex())
	}
	return v
}

func (c *Console) webhooks(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	ws, err := c.cfg.Merchant.Webhooks(ctx, facilitator.ViewerFrom(r.Context()).Key)
	if err != nil {
		c.errorPage(w, r, "", facilitator.Bounded(ctx, err))
		return
	}
	v := webhooksView{}
	for _, wh := range ws {
		v.Webhooks = append(v.Webhooks, webhookViewOf(wh))
	}
	c.render(w, http.StatusOK, "webhooks", page{Title: "Webhooks", Nav: "webhooks", Webhooks: &v})
}

func (c *Console) webhook(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p := facilitator.Page{Limit: facilitator.DefaultPageLimit}
	if s := r.URL.Query().Get("cursor"); s != "" {
		cur, ok := status.ParseCursor(s)
		if !ok {
			c.errorPage(w, r, "", facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", "cursor must be a next page's link"))
			return
		}
		p.After = &cur
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	res, err := c.cfg.Merchant.WebhookDeliveries(ctx, facilitator.ViewerFrom(r.Context()), id, p)
	if err != nil {
		c.errorPage(w, r, "", facilitator.Bounded(ctx, err))
		return
	}
	wv := webhookViewOf(res.Webhook)
	v := webhooksView{Webhook: &wv}
	for _, d := range res.Items {
		it := status.Item(facilitator.ListedSettlement{Settlement: facilitator.Settlement{Key: d.Key}})
		dv := deliveryView{Event: string(d.Event.State), At: d.Event.At.UTC().Format("2006-01-02 15:04:05 UTC"),
			Lookup: authorizationPath(it.Network, it.Asset, it.Payer, it.Nonce), Attempts: strconv.Itoa(d.Attempts), LastStatus: "—", LastError: d.LastError}
		if d.LastStatus != 0 {
			dv.LastStatus = strconv.Itoa(d.LastStatus)
		}
		switch {
		case d.DeliveredAt != nil:
			dv.Result = "delivered " + d.DeliveredAt.UTC().Format("2006-01-02 15:04:05 UTC")
		case d.GaveUpAt != nil:
			dv.Result = "gave up " + d.GaveUpAt.UTC().Format("2006-01-02 15:04:05 UTC")
		case d.NextAttempt != nil:
			dv.Result = "next attempt " + d.NextAttempt.UTC().Format("2006-01-02 15:04:05 UTC")
		default:
			dv.Result = "not sent (webhook disabled)"
		}
		v.Deliveries = append(v.Deliveries, dv)
	}
	if res.Next != nil {
		v.Next = wv.Link + "?cursor=" + url.QueryEscape(status.CursorText(*res.Next))
	}
	c.render(w, http.StatusOK, "webhook", page{Title: "Webhook " + res.Webhook.ID, Nav: "webhooks", Webhooks: &v})
}
