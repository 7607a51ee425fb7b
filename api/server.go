// Package api is the HTTP transport of the facilitator: echo routes, request decoding, and the one
// place where domain errors become HTTP statuses.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Verifier is what /verify needs.
type Verifier interface {
	Verify(ctx context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error)
}

// Config configures the HTTP server.
type Config struct {
	Verifier  Verifier
	Settler   Settler
	Status    Status
	Supported facilitator.SupportedResponse
	// VerifyTimeout bounds one /verify, chain reads included.
	VerifyTimeout time.Duration
	// StatusTimeout bounds one status lookup (/v1/authorizations, /v1/payments, /v1/settlements/{tx}),
	// ledger and chain reads included; past it the lookup answers 503 status_timeout (default 10s).
	StatusTimeout time.Duration
	Logger        *slog.Logger
	// Notify serves webhook registration and event streams; nil leaves those routes out.
	Notify Notify
	// Auth guards the routes with merchant API keys and rate limits (auth.go); nil is open mode.
	Auth *AuthConfig
	// Observer hears every /verify and /settle answer (metrics); nil: nobody.
	Observer Observer
	// Metrics serves GET /metrics, open like /healthz; nil leaves the route out.
	Metrics http.Handler
	// Ready lists, by name, what GET /readyz checks (ready.go); none: always ready.
	Ready map[string]ReadyChecker
	// ReadyEndpoints, when set, lists each RPC endpoint's state for the /readyz body (named,
	// never by URL); informational only.
	ReadyEndpoints func() map[string]string
	// ReadySigners, when set, lists each remote signer key's state, and each retiring key's, for the /readyz body
	// ("network/address": "ok, …" or what failed). Like the endpoints, it does not make the process
	// unready: a process whose signer is down still verifies, and /settle answers 503 with
	// Retry-After; every replica shares the signer, so taking them all out of service would stop
	// /verify and the status routes too.
	ReadySigners func() map[string]string
	// ReadyTimeout bounds one /readyz, all checks at once (default 2s).
	ReadyTimeout time.Duration
	// ReadyEvery is how often, at most, /readyz runs its checks (default 1s): in between, and
	// while one runs, every caller gets the last answer (ready.go).
	ReadyEvery time.Duration
	// Console serves the web console under /console (its assets under /console/static/, open
	// like /healthz; its pages need the status scope); nil leaves it out.
	Console Console
	// Lists serves GET /v1/settlements, /v1/settlements.csv and /v1/webhooks/{id}/deliveries
	// (lists.go); nil leaves them out.
	Lists Lists
	// Redeliver serves POST /v1/webhooks/{id}/deliveries/{eventId}/redeliver (webhooks scope; the
	// webhook's owner or an operator key); nil leaves it out.
	Redeliver Redeliverer
	// Ops serves GET /v1/ops/overview (operator scope); nil leaves it out.
	Ops Ops
	// Deliveries serves POST /v1/settlements/{tx}/delivery (settle scope; the settling key only:
	// deliveryrecord.go); nil leaves it out.
	Deliveries Deliveries
	// Limits, when set, is asked after a valid /verify verdict whether /settle's limits would
	// refuse the payment now (read-only); a refusal answers like /settle's (429, Retry-After).
	Limits Limits
	// TrustedProxies are the reverse proxies whose X-Forwarded-For is believed: a request whose
	// TCP peer is in one of them is keyed (rate limits, logs, console logins) on the right-most
	// forwarded address outside them. None: the TCP peer, always (client.go).
	TrustedProxies []netip.Prefix
	// Receipts serves the public view (receipt.go): under --auth keys, GET /v1/authorizations/…
	// and GET /v1/settlements/{tx} sent with no credential at all, and in every mode the receipt
	// pages GET /r/{network}/{asset}/{from}/{nonce}; nil (--public-receipts=false): none, and a
	// status lookup without a key is 401 in keys mode.
	Receipts Receipts
	// PublicPerClient limits the public view's lookups per client address, on top of the
	// per-client limit of every route; a zero Rate is no limit.
	PublicPerClient auth.Limit
	// ReceiptPage renders the receipt pages; nil: /r/… answers JSON only.
	ReceiptPage ReceiptPage
	// PaymentIDs lists, on the full status views, the payment ids that resolved to the
	// authorization; nil: none listed.
	PaymentIDs PaymentIDs
	// Now is the clock a claimed success's deadline (facilitator.SettleOutcome.ClaimBy) and the age
	// of /readyz's last check are read on; nil: time.Now, the settlement engine's own.
	Now func() time.Time
}

// Console serves the web console (console.Console); idScope is the request's payment-identifier
// scope (its API key's id, "" without one).
type Console interface {
	ServeConsole(w http.ResponseWriter, r *http.Request, idScope string)
	// Refused answers a console page the auth guard turned away (err): the login page for a
	// missing or bad key, an error page otherwise.
	Refused(w http.ResponseWriter, r *http.Request, err error)
}

// Limits is the read-only limit check /verify makes.
type Limits interface {
	CheckLimits(ctx context.Context, p *facilitator.Payment) error
}

// Observer hears the answers to /verify and /settle. network is the payment's network when it is
// one /supported lists, else "unknown" (a client's free text must not mint label values); reason
// is the x402 reason of the answer, "valid" for a valid /verify and "ok" for a successful /settle.
type Observer interface {
	Verified(network, reason string, took time.Duration)
	Settled(network, reason string, took time.Duration)
}

// Server serves the facilitator's HTTP API.
type Server struct {
	cfg   Config
	log   *slog.Logger
	echo  *echo.Echo
	guard *authGuard
	ready readyCache
	// publicLimit is the public view's per-client limit (Config.PublicPerClient).
	publicLimit *auth.Limiter
	// networks are the network names /supported lists: the values the Observer's network takes.
	networks map[string]bool
}

// New builds the server and its routes.
func New(cfg Config) *Server {
	if cfg.VerifyTimeout == 0 {
		cfg.VerifyTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Supported.Kinds == nil {
		cfg.Supported.Kinds = []facilitator.SupportedKind{}
	}
	if cfg.Supported.Extensions == nil {
		cfg.Supported.Extensions = []string{}
	}
	if cfg.Supported.Signers == nil {
		cfg.Supported.Signers = map[string][]string{}
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 2 * time.Second
	}
	if cfg.ReadyEvery == 0 {
		cfg.ReadyEvery = time.Second
	}
	if cfg.StatusTimeout == 0 {
		cfg.StatusTimeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, log: cfg.Logger, networks: map[string]bool{}, publicLimit: auth.NewLimiter(cfg.PublicPerClient, cfg.Now)}
	for _, k := range cfg.Supported.Kinds {
		s.networks[k.Network] = true
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleHTTPError
	// Before routing: the headers every answer carries, then the path's one canonical form
	// (access.go), which both routers and the guard read alike.
	e.Pre(securityHeaders, s.canonical, s.clientAddress)
	e.Use(s.accessLog)
	// A panic in a handler is a bug: answer 500 through the one error path instead of dropping the
	// connection, and keep serving.
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
		s.log.ErrorContext(c.Request().Context(), "panic in handler", "path", c.Path(), "err", err, "stack", string(stack))
		return err
	}}))
	if cfg.Auth != nil {
		s.guard = newAuthGuard(*cfg.Auth)
		e.Use(s.authenticate)
	}

	e.POST("/verify", s.verify)
	if cfg.Settler != nil {
		e.POST("/settle", s.settle)
	}
	e.GET("/supported", s.supported)
	if cfg.Status != nil {
		e.GET("/v1/authorizations/:network/:asset/:from/:nonce", s.authorizationStatus)
		e.GET("/v1/payments/:id", s.paymentStatus)
		e.GET("/v1/settlements/:tx", s.settlementStatus)
	}
	if cfg.Deliveries != nil {
		e.POST("/v1/settlements/:tx/delivery", s.attachDelivery)
	}
	if cfg.Receipts != nil {
		e.GET("/r/:network/:asset/:from/:nonce", s.receipt)
	}
	if cfg.Lists != nil {
		e.GET("/v1/settlements", s.listSettlements)
		e.GET("/v1/settlements.csv", s.settlementsCSV)
		e.GET("/v1/webhooks/:id/deliveries", s.webhookDeliveries)
	}
	if cfg.Redeliver != nil {
		e.POST("/v1/webhooks/:id/deliveries/:eventId/redeliver", s.redeliver)
	}
	if cfg.Notify != nil {
		e.POST("/v1/webhooks", s.createWebhook)
		e.GET("/v1/webhooks", s.listWebhooks)
		e.DELETE("/v1/webhooks/:id", s.deleteWebhook)
		e.GET("/v1/events/authorizations/:network/:asset/:from/:nonce", s.authorizationEvents)
		e.GET("/v1/events/payments/:id", s.paymentEvents)
	}
	if cfg.Console != nil {
		serve := func(c echo.Context) error {
			// The console reads its lists as the request's key may (facilitator.ViewerOf).
			r := c.Request()
			cfg.Console.ServeConsole(c.Response(), r.WithContext(facilitator.WithViewer(r.Context(), viewerOf(c))), idScope(c))
			return nil
		}
		e.GET("/console", serve)
		e.GET("/console/*", serve)
		e.GET("/console/static/*", serve)
		// The login form and logout need no key (access.go's accessScope): they set and clear it.
		e.GET("/console/login", serve)
		e.POST("/console/login", serve)
		e.POST("/console/logout", serve)
		// The operations page has routes of its own: it needs the operator scope (access.go).
		e.GET("/console/ops", serve)
		e.GET("/console/ops/*", serve)
	}
	if cfg.Ops != nil {
		e.GET("/v1/ops/overview", s.opsOverview)
	}
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	if cfg.Metrics != nil {
		e.GET("/metrics", echo.WrapHandler(cfg.Metrics))
	}
	e.GET("/openapi.json", s.openAPI)
	s.echo = e
	return s
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.echo }

func (s *Server) supported(c echo.Context) error {
	return c.JSON(http.StatusOK, s.cfg.Supported)
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) accessLog(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		tags := &requestTags{}
		c.Set(tagsKey, tags)
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		took := time.Since(start)
		s.observe(c, tags, took)
		req := c.Request()
		level := slog.LevelInfo
		switch c.Path() {
		case "/healthz", "/readyz", "/metrics":
			level = slog.LevelDebug // polled by probes and scrapers every few seconds
		}
		// The line's attributes are built only when it is written: at warn, under load, that is
		// every /verify's cost saved.
		if !s.log.Enabled(req.Context(), level) {
			return nil
		}
		attrs := []any{"method", req.Method, "path", req.URL.Path, "status", c.Response().Status,
			"duration_ms", float64(took.Microseconds()) / 1000, "client", clientAddressOf(req)}
		if tags.reason != "" {
			attrs = append(attrs, "reason", tags.reason)
		}
		var nonce string
		if tags.hasNonce {
			nonce = hexutil.Encode(tags.nonce[:])
		}
		for _, kv := range [...][2]string{{"payer", tags.payer}, {"nonce", nonce}, {"payment_id", tags.paymentID}, {"tx", tags.tx}} {
			if kv[1] != "" {
				attrs = append(attrs, kv[0], kv[1])
			}
		}
		s.log.Log(req.Context(), level, "http", attrs...)
		return nil
	}
}

// observe tells the Observer about a /verify or /settle answer.
func (s *Server) observe(c echo.Context, tags *requestTags, took time.Duration) {
	if s.cfg.Observer == nil {
		return
	}
	path := c.Path()
	if path != "/verify" && path != "/settle" {
		return
	}
	network := tags.network
	if !s.networks[network] {
		network = "unknown"
	}
	reason := tags.reason
	if status := c.Response().Status; reason == "" && status != http.StatusOK {
		reason = "http_" + strconv.Itoa(status) // an answer no handler gave a reason (a panic)
	}
	if path == "/verify" {
		s.cfg.Observer.Verified(network, orDefault(reason, "valid"), took)
	} else {
		s.cfg.Observer.Settled(network, orDefault(reason, "ok"), took)
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// requestTags is what handlers leave for the access log and the Observer, one value per request
// under tagsKey (a c.Set per field boxed each value, and the nonce was hex-encoded for a log line
// that, at warn, is never written).
type requestTags struct {
	reason    string
	payer     string
	nonce     [32]byte // the authorization's nonce, when hasNonce
	hasNonce  bool
	paymentID string // the payment-identifier id, when sent
	tx        string // the settlement transaction's hash
	network   string
}

const tagsKey = "x402.tags"

// tagsOf is the request's tags; a handler served without the access log gets a fresh, unread set.
func tagsOf(c echo.Context) *requestTags {
	if t, ok := c.Get(tagsKey).(*requestTags); ok {
		return t
	}
	t := &requestTags{}
	c.Set(tagsKey, t)
	return t
}
