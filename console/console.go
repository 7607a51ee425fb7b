// Package console serves the facilitator's web console: server-rendered pages (html/template) and
// their embedded assets, so that the binary needs nothing else at run time and the pages work
// without JavaScript. JavaScript only makes the numbers that move (confirmations) live.
package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Status answers the lookups: the status API's service, with a settlement's timeline.
type Status interface {
	Authorization(ctx context.Context, key facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error)
	Payment(ctx context.Context, scope, id string) (facilitator.AuthorizationStatus, error)
	Settlement(ctx context.Context, tx common.Hash) (facilitator.AuthorizationStatus, error)
	Timeline(ctx context.Context, key facilitator.AuthorizationKey) ([]facilitator.SettlementEvent, error)
}

// Config configures the console.
type Config struct {
	Status Status
	// HTTPStatus is the HTTP status of an error, by the API's one table (api.HTTPStatus).
	HTTPStatus func(error) int
	// Networks are the networks served: their tokens' decimals and names are what amounts are
	// shown in. An amount of a token not among them is shown in base units.
	Networks []facilitator.Network
	Logger   *slog.Logger
	// QueryTimeout bounds one status read (default 10s).
	QueryTimeout time.Duration
	// Poll is how often a live page's stream reads the status again (default 2s).
	Poll time.Duration
	// StreamFor bounds one live stream (default 5m); the browser's EventSource reconnects.
	StreamFor time.Duration
	// Merchant serves the merchant's pages (merchant.go); nil leaves them out.
	Merchant Merchant
	// PaymentIDs lists on an answer page the payment ids that resolved to it, as the page's viewer
	// may see them (postgres.DB); nil: none listed.
	PaymentIDs PaymentIDs
	// Sessions opens and ends the login sessions (api.ConsoleSessions); nil is open mode, where
	// the login page says no key is needed.
	Sessions Sessions
	// Ops is the operations overview behind /console/ops (ops.go); nil leaves the page out.
	Ops Ops
	// Heads are the networks' head announcements (each network's one shared subscription), by
	// network id: a live page's lookup is read again when its network's head changes, once for all
	// its viewers. A network without one, or while its subscription is down, is read every Poll.
	Heads map[string]Heads
	// MaxStreams bounds the open live streams (default 1000): past it a new one answers 503
	// too_many_streams.
	MaxStreams int
	// MaxStreamsPerKey bounds one API key's open live streams within MaxStreams (default 100; open
	// mode is one key): past it the key's next answers 429 too_many_streams_for_key.
	MaxStreamsPerKey int
}

// CSP is the console's Content-Security-Policy: its own script and styles only, no inline code, no
// other origin, never framed.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console serves /console.
type Console struct {
	cfg    Config
	log    *slog.Logger
	pages  *template.Template
	mux    *http.ServeMux
	static http.Handler
	live   *lookups
}

// New builds the console.
func New(cfg Config) (*Console, error) {
	if cfg.Status == nil || cfg.HTTPStatus == nil {
		return nil, errors.New("console: Status and HTTPStatus are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 10 * time.Second
	}
	if cfg.Poll == 0 {
		cfg.Poll = 2 * time.Second
	}
	if cfg.StreamFor == 0 {
		cfg.StreamFor = 5 * time.Minute
	}
	funcs := template.FuncMap{
		"utc": func(t time.Time) string {
			return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
		},
		"amount": func(network, asset, value string) string { return amount(cfg.Networks, network, asset, value) },
		"short":  shortHex,
	}
	for k, f := range opsFuncs {
		funcs[k] = f
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: cfg.Logger, pages: pages, mux: http.NewServeMux(),
		static: http.StripPrefix("/console/static/", http.FileServerFS(sub))}
	c.live = newLookups(c, cfg.MaxStreams, cfg.MaxStreamsPerKey)
	c.mux.HandleFunc("GET /console", c.search)
	c.mux.HandleFunc("GET /console/{$}", c.search)
	c.mux.HandleFunc("GET /console/authorizations/{network}/{asset}/{from}/{nonce}", c.authorization)
	c.mux.HandleFunc("GET /console/authorizations/{network}/{asset}/{from}/{nonce}/events", c.events)
	c.mux.HandleFunc("GET /console/settlements/{tx}", c.settlement)
	c.mux.HandleFunc("GET /console/payments/{id}", c.payment)
	c.mux.HandleFunc("GET /console/static/", c.serveStatic)
	c.mux.HandleFunc("GET /console/login", c.loginForm)
	c.mux.HandleFunc("POST /console/login", c.login)
	c.mux.HandleFunc("POST /console/logout", c.logout)
	if cfg.Merchant != nil {
		c.mux.HandleFunc("GET /console/settlements", c.settlements)
		c.mux.HandleFunc("GET /console/settlements.csv", c.settlementsCSV)
		c.mux.HandleFunc("GET /console/payers/{address}", c.payer)
		c.mux.HandleFunc("GET /console/webhooks", c.webhooks)
		c.mux.HandleFunc("GET /console/webhooks/{id}", c.webhook)
	}
	if cfg.Ops != nil {
		c.mux.HandleFunc("GET /console/ops", c.opsPage)
		c.mux.HandleFunc("GET /console/ops/overview.json", c.opsJSON)
	}
	c.mux.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		c.errorPage(w, r, "", facilitator.ErrNotFound)
	})
	return c, nil
}

// PaymentIDs lists the payment-identifier ids that resolved to an authorization, as v may see them.
type PaymentIDs interface {
	PaymentIDsOf(ctx context.Context, key facilitator.AuthorizationKey, v facilitator.Viewer) ([]string, error)
}

type scopeKey struct{}

// ServeConsole serves one request; idScope is the payment-identifier scope of the request's API
// key ("" without one), which a payment id is looked up under.
func (c *Console) ServeConsole(w http.ResponseWriter, r *http.Request, idScope string) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	c.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, idScope)))
}

func (c *Console) serveStatic(w http.ResponseWriter, r *http.Request) {
	// The assets change only with the binary; an hour keeps a page's reloads cheap.
	w.Header().Set("Cache-Control", "public, max-age=3600")
	c.static.ServeHTTP(w, r)
}

// search is the search box; with a query, it sends the browser to the answer's stable URL.
func (c *Console) search(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" {
		c.render(w, http.StatusOK, "search", page{Title: "Lookup"})
		return
	}
	to, err := resolve(q)
	if err != nil {
		c.errorPage(w, r, q, err)
		return
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// resolve reads a search: "network asset payer nonce" (spaces or slashes between), a transaction
// hash, a payer's address, or a payment id; it returns the answer's path.
func resolve(q string) (string, error) {
	f := strings.FieldsFunc(q, func(r rune) bool { return r == ' ' || r == '/' || r == '\t' || r == ',' })
	switch {
	case len(f) == 4:
		k, err := status.ParseKey(f[0], f[1], f[2], f[3])
		if err != nil {
			return "", err
		}
		return authorizationPath(k.Network, k.Asset.Hex(), k.Payer.Hex(), "0x"+common.Bytes2Hex(k.Nonce[:])), nil
	case len(f) == 1 && status.IsAddress(f[0]):
		return "/console/payers/" + common.HexToAddress(f[0]).Hex(), nil
	case len(f) == 1 && len(f[0]) == 66 && strings.HasPrefix(strings.ToLower(f[0]), "0x"):
		tx, err := status.ParseTx(f[0])
		if err != nil {
			return "", err
		}
		return "/console/settlements/" + tx.Hex(), nil
	case len(f) == 1:
		if err := status.CheckPaymentID(f[0]); err != nil {
			return "", facilitator.Errorf(facilitator.EInvalid, "invalid_parameter",
				"search for a transaction hash, a payment id, a payer address, or an authorization as: network asset payer nonce")
		}
		return "/console/payments/" + f[0], nil
	}
	return "", facilitator.Errorf(facilitator.EInvalid, "invalid_parameter",
		"search for a transaction hash, a payment id, a payer address, or an authorization as: network asset payer nonce")
}

func authorizationPath(network, asset, from, nonce string) string {
	return "/console/authorizations/" + url.PathEscape(network) + "/" + asset + "/" + from + "/" + nonce
}

func (c *Console) authorization(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	st, found, err := c.cfg.Status.Authorization(ctx, key)
	c.answer(w, r, ctx, st, found, err)
}

func (c *Console) settlement(w http.ResponseWriter, r *http.Request) {
	tx, err := status.ParseTx(r.PathValue("tx"))
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	st, err := c.cfg.Status.Settlement(ctx, tx)
	c.answer(w, r, ctx, st, true, err)
}

func (c *Console) payment(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := status.CheckPaymentID(id); err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	scope, _ := r.Context().Value(scopeKey{}).(string)
	st, err := c.cfg.Status.Payment(ctx, scope, id)
	c.answer(w, r, ctx, st, true, err)
}

func keyOf(r *http.Request) (facilitator.AuthorizationKey, error) {
	return status.ParseKey(r.PathValue("network"), r.PathValue("asset"), r.PathValue("from"), r.PathValue("nonce"))
}

// answer renders a status answer with its timeline; an authorization neither the ledger nor the
// index has seen is a 404 that still says what the chain says.
func (c *Console) answer(w http.ResponseWriter, r *http.Request, ctx context.Context, st facilitator.AuthorizationStatus, found bool, err error) {
	if err != nil {
		c.errorPage(w, r, "", facilitator.Bounded(ctx, err))
		return
	}
	key, err := status.ParseKey(st.Network, st.Asset, st.Authorizer, st.Nonce)
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	var evs []facilitator.SettlementEvent
	if found {
		if evs, err = c.cfg.Status.Timeline(ctx, key); err != nil {
			c.errorPage(w, r, "", facilitator.Bounded(ctx, err))
			return
		}
		if c.cfg.PaymentIDs != nil {
			// The ids of the page's viewer (the API's guard put it on the request): a merchant's own.
			if st.PaymentIDs, err = c.cfg.PaymentIDs.PaymentIDsOf(ctx, key, facilitator.ViewerFrom(r.Context())); err != nil {
				c.errorPage(w, r, "", facilitator.Unavailable("status_unavailable", "the ledger is unavailable, retry", err))
				return
			}
		}
	}
	self := authorizationPath(st.Network, st.Asset, st.Authorizer, st.Nonce)
	p := page{Title: "Authorization " + shortHex(st.Nonce), Query: strings.Join([]string{st.Network, st.Asset, st.Authorizer, st.Nonce}, " "),
		Answer: &answerView{Status: st, Live: liveOf(st), Found: found, Self: self, Events: self + "/events", Timeline: evs}}
	for _, m := range st.Batch {
		p.Answer.Batch = append(p.Answer.Batch, batchRow{BatchSettlement: m, Link: authorizationPath(m.Network, m.Asset, m.Authorizer, m.Nonce)})
	}
	code := http.StatusOK
	if !found {
		code = http.StatusNotFound
	}
	c.render(w, code, "answer", p)
}

// errorPage renders an error in words with the search box, under the API's status for it. The
// message is the one the API would answer with: it never carries a cause's text (a URL, a DSN).
func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, q string, err error) {
	code := c.cfg.HTTPStatus(err)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	if code >= 500 {
		c.log.ErrorContext(r.Context(), "console", "path", r.URL.Path, "status", code, "err", err)
		w.Header().Set("Retry-After", "5")
	}
	msg := facilitator.ErrorMessage(err)
	title := "Invalid search"
	switch {
	case code == http.StatusNotFound:
		title, msg = "Not found", "Nothing is known here under this name: check the transaction hash or payment id, or search for the authorization itself."
	case code == http.StatusServiceUnavailable:
		title, msg = "Temporarily unavailable", "The facilitator cannot read its ledger or the chain right now. Nothing has changed; try again in a few seconds."
	case code >= 500:
		title, msg = "Something went wrong", "The facilitator could not answer. Try again; if it persists, tell the operator."
	}
	c.render(w, code, "error", page{Title: title, Query: q, Error: &errorView{Status: code, Title: title, Message: msg}})
}

type page struct {
	Title  string
	Query  string
	Answer *answerView
	Error  *errorView
	// Nav names the header's current section ("settlements", "webhooks"); Keys: the console
	// needs a key (the header offers Log out); render sets it.
	Nav      string
	Keys     bool
	Login    *loginView
	List     *listView
	Webhooks *webhooksView
	Ops      *opsView
	Receipt  *receiptView
}

type answerView struct {
	Status   facilitator.AuthorizationStatus
	Live     Live
	Found    bool
	Self     string
	Events   string
	Timeline []facilitator.SettlementEvent
	// Batch is every settlement of a batch's transaction, on a page by transaction.
	Batch []batchRow
}

// batchRow is a batch's settlement with the link to its own page.
type batchRow struct {
	facilitator.BatchSettlement
	Link string
}

type errorView struct {
	Status  int
	Title   string
	Message string
}

func (c *Console) render(w http.ResponseWriter, code int, name string, p page) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	p.Keys = c.cfg.Sessions != nil
	if err := c.pages.ExecuteTemplate(w, name, p); err != nil {
		c.log.Error("console: rendering", "page", name, "err", err)
	}
}

// amount shows an amount of a network's token in whole tokens with the token's name ("0.25 USD
// Coin"), or in base units when the token is not one served: the one place amounts are written
// for people.
func amount(networks []facilitator.Network, network, asset, value string) string {
	if value == "" {
		return "—"
	}
	for _, n := range networks {
		if n.ID != network || !common.IsHexAddress(asset) {
			continue
		}
		if t, ok := n.Token(common.HexToAddress(asset)); ok {
			return facilitator.FormatUnits(value, t.Decimals) + " " + t.Name
		}
	}
	return value + " base units"
}

func (c *Console) amount(network, asset, value string) string {
	return amount(c.cfg.Networks, network, asset, value)
}

func shortHex(s string) string {
	if len(s) > 14 {
		return s[:8] + "…" + s[len(s)-4:]
	}
	return s
}
