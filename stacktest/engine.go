package stacktest

import (
	"context"
	"crypto/ecdsa"
	"log/slog"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// EngineOptions shape an engine; the zero value is one fresh funded signer, a 20 s deadline and
// finality depth 1 over the env's chain and network and a ledger handle of its own.
type EngineOptions struct {
	Signers  []*ecdsa.PrivateKey  // default: one fresh funded key (none when Remote is set)
	Remote   []settle.Signer      // signers whose keys are elsewhere (a Clef, the narrow signer)
	Deadline time.Duration        // default: 20 s (1 s gets pending answers with mining off)
	Depth    uint64               // finality depth; default 1
	Tag      string               // finality tag ("finalized", "safe"); default none (by depth)
	DB       *postgres.DB         // default: a handle of its own, as a process of its own has
	Logger   *slog.Logger         // default: the test's log
	Config   func(*settle.Config) // edits the configuration before the engine is built
	// Chain is what the engine and its verifier read and send through (a counting proxy, say);
	// default: the env's.
	Chain ethrpc.Chain
	// Network is the network settled on; default: the env's (another V1Name, say).
	Network *facilitator.Network
	// Reader is the verifier's view of the chain (one a test also reads through, say); default:
	// an ethrpc.Reader on Chain.
	Reader verify.Reader
}

// Engine is a started settle engine over the env's chain and ledger, stopped when the test ends;
// stop it sooner to play a process that died with its settlements in flight.
type Engine struct {
	*settle.Engine
	DB       *postgres.DB
	Verifier *verify.Verifier
	Signers  []*ecdsa.PrivateKey
	Network  facilitator.Network
}

// NewEngine builds and starts an engine.
func (e *Env) NewEngine(t testing.TB, o EngineOptions) *Engine {
	t.Helper()
	ctx := context.Background()
	if o.Signers == nil && o.Remote == nil {
		o.Signers = []*ecdsa.PrivateKey{e.NewSigner(t)}
	}
	if o.Deadline == 0 {
		o.Deadline = 20 * time.Second
	}
	if o.DB == nil {
		o.DB = e.OpenDB(t)
	}
	if o.Logger == nil {
		o.Logger = Logger(t).With("component", "engine")
	}
	if o.Chain == nil {
		o.Chain = e.Chain.RPC
	}
	n := e.Network()
	if o.Network != nil {
		n = *o.Network
	}
	if o.Depth != 0 || n.Finality.Depth == 0 {
		n.Finality.Depth = max(o.Depth, 1)
	}
	if o.Tag != "" {
		n.Finality.Tag = o.Tag
	}
	if o.Reader == nil {
		o.Reader = &ethrpc.Reader{Chain: o.Chain, Timeout: 5 * time.Second}
	}
	v, err := verify.New(verify.Config{Networks: []facilitator.Network{n}, Readers: map[string]verify.Reader{n.ID: o.Reader}, Logger: o.Logger})
	if err != nil {
		t.Fatal(err)
	}
	cfg := settle.Config{
		Networks:     []settle.NetworkConfig{{Network: n, Chain: o.Chain, Signers: o.Signers, Remote: o.Remote}},
		Store:        o.DB,
		Verifier:     v,
		Deadline:     o.Deadline,
		PollInterval: 50 * time.Millisecond,
		Logger:       o.Logger,
	}
	if o.Config != nil {
		o.Config(&cfg)
	}
	s, err := settle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	StopAtCleanup(t, s)
	return &Engine{Engine: s, DB: o.DB, Verifier: v, Signers: o.Signers, Network: n}
}

// Settle is the engine's Settle for a caller that reads its answer at once: a claimed success is
// confirmed as written, as the API does once it has written it (a test playing a caller that
// never got its answer calls the engine's own, r.Engine.Settle).
func (e *Engine) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	out, err := e.Engine.Settle(ctx, p)
	if err == nil && out.Claimed {
		err = e.ConfirmDelivery(ctx, out)
	}
	return out, err
}

// Signer is the engine's first signer key.
func (e *Engine) Signer() *ecdsa.PrivateKey { return e.Signers[0] }

// SettleBody decodes and settles one request body, as the API does.
func (e *Engine) SettleBody(ctx context.Context, t testing.TB, body []byte) (facilitator.SettleOutcome, error) {
	t.Helper()
	return e.Settle(ctx, Decode(t, body))
}

// MustSettle is SettleBody that fails the test on an error (not on a failed settlement).
func (e *Engine) MustSettle(t testing.TB, body []byte) facilitator.SettleOutcome {
	t.Helper()
	out, err := e.SettleBody(context.Background(), t, body)
	if err != nil {
		t.Fatalf("settle: %v", err)
	}
	return out
}

// MustSucceed is MustSettle that also fails the test unless the settlement succeeded.
func (e *Engine) MustSucceed(t testing.TB, body []byte) facilitator.SettleOutcome {
	t.Helper()
	out := e.MustSettle(t, body)
	if !out.Response.Success {
		t.Fatalf("settle: %+v, want success", out.Response)
	}
	return out
}

// SettlePending settles body with mining off and requires the settlement_pending answer; it
// returns the transaction's hash.
func (e *Engine) SettlePending(t testing.TB, body []byte) common.Hash {
	t.Helper()
	out := e.MustSettle(t, body)
	if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonSettlementPending || out.Response.Transaction == "" {
		t.Fatalf("want settlement_pending with a hash, got %+v", out.Response)
	}
	return common.HexToHash(out.Response.Transaction)
}

// SettleAndStop settles body through an engine of its own, which keeps it mined, not final
// (depth 10), requires success, and stops the engine: nothing watches the row from there on.
func (e *Env) SettleAndStop(t testing.TB, body []byte) facilitator.SettleOutcome {
	t.Helper()
	eng := e.NewEngine(t, EngineOptions{Depth: 10, Deadline: 10 * time.Second})
	out := eng.MustSucceed(t, body)
	eng.Stop(context.Background())
	return out
}

// SettlePendingAndStop turns mining off and settles body through an engine of its own, which
// answers settlement_pending and is then stopped, as a process that dies after the broadcast: the
// ledger holds the pending settlement and nothing watches it. Mining stays off. It returns the
// stopped engine (a restarted one takes its signers) and the transaction's hash.
func (e *Env) SettlePendingAndStop(t testing.TB, body []byte, o EngineOptions) (*Engine, common.Hash) {
	t.Helper()
	e.ManualMining(t)
	eng := e.NewEngine(t, o)
	hash := eng.SettlePending(t, body)
	eng.Stop(context.Background())
	return eng, hash
}

// StopAtCleanup stops a service (an engine, an indexer) when the test ends, and fails the test
// when it does not stop within 20 s or stops with an error.
func StopAtCleanup(t testing.TB, s interface{ Stop(context.Context) error }) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stopping %T: %v", s, err)
		}
	})
}
