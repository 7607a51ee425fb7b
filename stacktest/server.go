package stacktest

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// ServerOptions shape a server stack; the zero value is the HTTP API verifying over the env's
// chain and network, with no engine (so /settle is absent) and the test's log.
type ServerOptions struct {
	// Network is the network served; default: the engine's, else the env's.
	Network *facilitator.Network
	// Reader is the verifier's view of the chain when there is no engine; default: an
	// ethrpc.Reader on Chain.
	Reader verify.Reader
	// Chain is what the default Reader reads through; default: the env's.
	Chain ethrpc.Chain
	// Engine settles, and its verifier verifies; nil: verify only.
	Engine *Engine
	// PaymentIDs, when set, puts the payment-identifier service in front of the verifier and the
	// engine, as the binary does; its zero Store, Settler, Verifier and Logger are the stack's.
	PaymentIDs *paymentid.Config
	// Signers are the addresses /supported advertises; default: the engine's signers.
	Signers []common.Address
	Logger  *slog.Logger // default: the test's log
	// Config finishes the API's configuration, which has the stack's services already.
	Config func(*api.Config, *Server)
	// Handler wraps the API's handler (a log of the requests, say).
	Handler func(http.Handler) http.Handler
}

// Server is the facilitator's HTTP API over real services, served by httptest until the test
// ends: the server closes before the engine stops, as the binary shuts down.
type Server struct {
	URL      string
	Network  facilitator.Network
	Verifier *verify.Verifier
	Engine   *Engine            // nil without ServerOptions.Engine
	IDs      *paymentid.Service // nil without ServerOptions.PaymentIDs
	Logger   *slog.Logger
}

// NewServer builds and serves a server stack.
func (e *Env) NewServer(t testing.TB, o ServerOptions) *Server {
	t.Helper()
	if o.Logger == nil {
		o.Logger = Logger(t).With("component", "api")
	}
	s := &Server{Network: e.Network(), Engine: o.Engine, Logger: o.Logger}
	if o.Engine != nil {
		s.Network, s.Verifier = o.Engine.Network, o.Engine.Verifier
		if o.Signers == nil {
			for _, k := range o.Engine.Signers {
				o.Signers = append(o.Signers, AddressOf(k))
			}
		}
	}
	if o.Network != nil {
		s.Network = *o.Network
	}
	if s.Verifier == nil {
		if o.Reader == nil {
			if o.Chain == nil {
				o.Chain = e.Chain.RPC
			}
			o.Reader = &ethrpc.Reader{Chain: o.Chain, Timeout: 5 * time.Second}
		}
		v, err := verify.New(verify.Config{Networks: []facilitator.Network{s.Network},
			Readers: map[string]verify.Reader{s.Network.ID: o.Reader}, Logger: o.Logger})
		if err != nil {
			t.Fatal(err)
		}
		s.Verifier = v
	}
	cfg := api.Config{Verifier: s.Verifier, Logger: o.Logger}
	if o.Engine != nil {
		// The engine itself, as the binary wires it: the API confirms a success once written
		// (stacktest.Engine's Settle would confirm it before).
		cfg.Settler = o.Engine.Engine
	}
	var extensions []string
	if o.PaymentIDs != nil {
		c := *o.PaymentIDs
		if c.Store == nil && o.Engine != nil {
			c.Store = o.Engine.DB
		}
		if c.Settler == nil && o.Engine != nil {
			c.Settler = o.Engine.Engine
		}
		if c.Verifier == nil {
			c.Verifier = s.Verifier
		}
		if c.Logger == nil {
			c.Logger = o.Logger
		}
		s.IDs = paymentid.New(c)
		cfg.Verifier, cfg.Settler = s.IDs, s.IDs
		extensions = []string{facilitator.PaymentIdentifierKey}
	}
	cfg.Supported = facilitator.Supported([]facilitator.Network{s.Network}, o.Signers, extensions)
	if o.Config != nil {
		o.Config(&cfg, s)
	}
	h := api.New(cfg).Handler()
	if o.Handler != nil {
		h = o.Handler(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close) // registered after the engine's Stop, so it runs first
	s.URL = hs.URL
	return s
}
