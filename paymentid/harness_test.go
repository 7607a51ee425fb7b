package paymentid_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// The package's tests share one anvil with real USDC and one database of their own.
var env *stacktest.Env

func TestMain(m *testing.M) {
	stacktest.Main(m, "paymentid", func(e *stacktest.Env) int { env = e; return m.Run() })
}

// clock is the service's injected clock: real time plus an offset the test moves.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// countingSettler is the engine, counting the Settle calls the service makes: a replay answered
// from the stored answer makes none.
type countingSettler struct {
	*settle.Engine
	calls atomic.Int64
}

func (c *countingSettler) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	c.calls.Add(1)
	return c.Engine.Settle(ctx, p)
}

// rig is the service over a real verifier, engine (one fresh signer key) and ledger, and the HTTP
// API over the service, as the binary wires it.
type rig struct {
	svc      *paymentid.Service
	url      string // the HTTP API's
	engine   *countingSettler
	verifier *verify.Verifier
	db       *postgres.DB
	signer   common.Address
	clock    *clock
}

type rigOptions struct {
	deadline       time.Duration // engine deadline (default 20 s)
	window, margin time.Duration // the service's Window and FinalityMargin (0: its defaults)
	depth          uint64        // the engine's finality depth (0: stacktest's default)
	quiet          bool          // no logs (benchmarks)
}

func newRig(tb testing.TB, o rigOptions) *rig {
	tb.Helper()
	logger := slog.New(slog.DiscardHandler)
	if !o.quiet {
		logger = stacktest.Logger(tb)
	}
	e := env.NewEngine(tb, stacktest.EngineOptions{Deadline: o.deadline, Depth: o.depth, Logger: logger})
	r := &rig{engine: &countingSettler{Engine: e.Engine}, verifier: e.Verifier, db: e.DB, signer: stacktest.AddressOf(e.Signer()), clock: &clock{}}
	srv := env.NewServer(tb, stacktest.ServerOptions{Engine: e, Logger: logger, PaymentIDs: &paymentid.Config{
		Settler: r.engine, Window: o.window, FinalityMargin: o.margin, Now: r.clock.Now, Logger: logger}})
	r.svc, r.url = srv.IDs, srv.URL
	return r
}

func (r *rig) settle(tb testing.TB, body []byte) (facilitator.SettleOutcome, error) {
	tb.Helper()
	return r.settlePayment(context.Background(), stacktest.Decode(tb, body))
}

// settlePayment is the service's Settle for a caller that reads its answer: a claimed success is
// confirmed as written, as the API does once it has written it.
func (r *rig) settlePayment(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	out, err := r.svc.Settle(ctx, p)
	if err == nil && out.Claimed {
		err = r.svc.ConfirmDelivery(ctx, out)
	}
	return out, err
}

func (r *rig) verify(tb testing.TB, body []byte) (facilitator.VerifyResponse, error) {
	tb.Helper()
	return r.svc.Verify(context.Background(), stacktest.Decode(tb, body))
}

// nonces is the signer's transaction count at latest and pending: what it has sent.
func (r *rig) nonces(tb testing.TB) [2]uint64 {
	tb.Helper()
	ctx := context.Background()
	latest, err := env.Chain.Client.NonceAt(ctx, r.signer, nil)
	if err != nil {
		tb.Fatal(err)
	}
	pending, err := env.Chain.Client.PendingNonceAt(ctx, r.signer)
	if err != nil {
		tb.Fatal(err)
	}
	return [2]uint64{latest, pending}
}

func (r *rig) record(tb testing.TB, id string) *facilitator.PaymentIDRecord {
	tb.Helper()
	rec, err := r.db.PaymentID(context.Background(), "", id)
	if err != nil {
		tb.Fatalf("payment id %s: %v", id, err)
	}
	return rec
}

// newPay is a payment of value from payer to a fresh payTo under a fresh payment id.
func newPay(tb testing.TB, payer *ecdsa.PrivateKey, value int64) stacktest.Pay {
	tb.Helper()
	p := env.NewPay(tb, payer, value)
	p.ID = stacktest.RandomID(tb)
	return p
}

// replayID is the id an answer's extensions mark as replayed, "" when it is not a replay.
func replayID(ext map[string]any) string {
	if !facilitator.IsReplay(ext) {
		return ""
	}
	pi, _ := ext[facilitator.PaymentIdentifierKey].(map[string]any)
	info, _ := pi["info"].(map[string]any)
	id, _ := info["id"].(string)
	return id
}

// response is an HTTP answer.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

func post(tb testing.TB, url string, body []byte) response {
	tb.Helper()
	res, err := httpClient.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return response{Status: res.StatusCode, Header: res.Header, Body: raw}
}

func (r response) settle(tb testing.TB) facilitator.SettleResponse {
	tb.Helper()
	return decodeAs[facilitator.SettleResponse](tb, r, "SettleResponse")
}

func (r response) verify(tb testing.TB) facilitator.VerifyResponse {
	tb.Helper()
	return decodeAs[facilitator.VerifyResponse](tb, r, "VerifyResponse")
}

// decodeAs decodes r's body as a T (kind names it in failures).
func decodeAs[T any](tb testing.TB, r response, kind string) T {
	tb.Helper()
	var out T
	if err := json.Unmarshal(r.Body, &out); err != nil {
		tb.Fatalf("not a %s (%d): %v: %s", kind, r.Status, err, r.Body)
	}
	return out
}
