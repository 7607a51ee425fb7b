package idempotency_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/devchain/devchaintest"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres/postgrestest"
	"github.com/x402-facilitator/x402-facilitator/idempotency"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// The package's tests share one anvil with real USDC and one database of their own.
var (
	chain *devchain.Chain
	dbURL string
)

func TestMain(m *testing.M) {
	devchaintest.Main(m, devchain.Options{}, func(c *devchain.Chain) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u, err := postgrestest.Fresh(ctx, "idempotency")
		if err != nil {
			return 0, err
		}
		chain, dbURL = c, u
		db, err := postgres.Open(ctx, dbURL, nil)
		if err != nil {
			return 0, err
		}
		defer db.Close()
		if _, err := db.Migrate(ctx); err != nil {
			return 0, err
		}
		genesis, err := c.Client.HeaderByNumber(ctx, big.NewInt(0))
		if err != nil {
			return 0, err
		}
		if err := db.BindNetwork(ctx, network().ID, c.ChainID, genesis.Hash()); err != nil {
			return 0, err
		}
		return m.Run(), nil
	})
}

func network() facilitator.Network {
	return facilitator.Network{ID: facilitator.CAIP2(chain.ChainID), ChainID: chain.ChainID,
		Tokens: []facilitator.Token{{Address: chain.USDC.Address, Name: chain.USDC.Name, Version: chain.USDC.Version}}}
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

func (c *countingSettler) Settle(ctx context.Context, p *facilitator.Payment) (settle.Outcome, error) {
	c.calls.Add(1)
	return c.Engine.Settle(ctx, p)
}

// rig is the service over a real verifier, engine (one fresh signer key) and ledger.
type rig struct {
	svc      *idempotency.Service
	engine   *countingSettler
	verifier *verify.Verifier
	db       *postgres.DB
	signer   common.Address
	clock    *clock
}

type rigOptions struct {
	deadline       time.Duration // engine deadline (default 20 s)
	window, margin time.Duration // the service's Window and FinalityMargin (0: its defaults)
	quiet          bool          // no logs (benchmarks)
}

func newRig(tb testing.TB, o rigOptions) *rig {
	tb.Helper()
	ctx := context.Background()
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(db.Close)
	key := newSigner(tb)
	n := network()
	v, err := verify.New(verify.Config{Networks: []facilitator.Network{n},
		Readers: map[string]verify.Reader{n.ID: &verify.RPCReader{Client: chain.RPC, Timeout: 5 * time.Second}}})
	if err != nil {
		tb.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if !o.quiet {
		logger = testLogger(tb)
	}
	if o.deadline == 0 {
		o.deadline = 20 * time.Second
	}
	e, err := settle.New(settle.Config{
		Networks:     []settle.NetworkConfig{{Network: n, Chain: chain.RPC, Signers: []*ecdsa.PrivateKey{key}, FinalityDepth: 1}},
		Store:        db,
		Verifier:     v,
		Deadline:     o.deadline,
		PollInterval: 50 * time.Millisecond,
		Logger:       logger,
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Stop)
	r := &rig{engine: &countingSettler{Engine: e}, verifier: v, db: db, signer: crypto.PubkeyToAddress(key.PublicKey), clock: &clock{}}
	r.svc = idempotency.New(idempotency.Config{
		Store: db, Settler: r.engine, Verifier: v,
		Window: o.window, FinalityMargin: o.margin, Now: r.clock.Now, Logger: logger,
	})
	return r
}

// server is the HTTP API over the rig's service, as the binary wires it.
func (r *rig) server(tb testing.TB) string {
	tb.Helper()
	srv := api.New(api.Config{
		Verifier:  r.svc,
		Settler:   r.svc,
		Supported: facilitator.Supported([]facilitator.Network{network()}, []common.Address{r.signer}, []string{facilitator.PaymentIdentifierKey}),
	})
	hs := httptest.NewServer(srv.Handler())
	tb.Cleanup(hs.Close) // registered after the engine's Stop, so it runs first
	return hs.URL
}

func (r *rig) settle(tb testing.TB, body []byte) (settle.Outcome, error) {
	tb.Helper()
	return r.svc.Settle(context.Background(), decode(tb, body))
}

func (r *rig) verify(tb testing.TB, body []byte) (facilitator.VerifyResponse, error) {
	tb.Helper()
	return r.svc.Verify(context.Background(), decode(tb, body))
}

// nonces is the signer's transaction count at latest and pending: what it has sent.
func (r *rig) nonces(tb testing.TB) [2]uint64 {
	tb.Helper()
	ctx := context.Background()
	latest, err := chain.Client.NonceAt(ctx, r.signer, nil)
	if err != nil {
		tb.Fatal(err)
	}
	pending, err := chain.Client.PendingNonceAt(ctx, r.signer)
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

func decode(tb testing.TB, body []byte) *facilitator.Payment {
	tb.Helper()
	p, err := facilitator.DecodeRequest(body)
	if err != nil {
		tb.Fatalf("decoding: %v", err)
	}
	return p
}

// newSigner is a fresh key holding ETH for gas, so tests never share a nonce stream.
func newSigner(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	if err := chain.SetBalance(context.Background(), crypto.PubkeyToAddress(k.PublicKey), new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))); err != nil {
		tb.Fatal(err)
	}
	return k
}

// fundedPayer is a fresh key holding usdc atomic units of USDC.
func fundedPayer(tb testing.TB, usdc int64) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	if err := chain.USDC.Mint(context.Background(), crypto.PubkeyToAddress(k.PublicKey), big.NewInt(usdc)); err != nil {
		tb.Fatal(err)
	}
	return k
}

func newAddress(tb testing.TB) common.Address {
	tb.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	return crypto.PubkeyToAddress(k.PublicKey)
}

func random32(tb testing.TB) [32]byte {
	tb.Helper()
	var n [32]byte
	if _, err := rand.Read(n[:]); err != nil {
		tb.Fatal(err)
	}
	return n
}

// newID is a fresh payment identifier, as a client makes one.
func newID(tb testing.TB) string {
	n := random32(tb)
	return "pay_" + hex.EncodeToString(n[:12])
}

// pay is a signed payment of value from payer to payTo, under payment id id ("": none).
type pay struct {
	payer       *ecdsa.PrivateKey
	payTo       common.Address
	value       int64
	nonce       [32]byte
	validBefore int64
	id          string
	resource    string
}

func newPay(tb testing.TB, payer *ecdsa.PrivateKey, value int64) pay {
	tb.Helper()
	return pay{payer: payer, payTo: newAddress(tb), value: value, nonce: random32(tb),
		validBefore: time.Now().Unix() + 3600, id: newID(tb), resource: "http://merchant.test/paid"}
}

func (p pay) from() common.Address { return crypto.PubkeyToAddress(p.payer.PublicKey) }

func (p pay) key() facilitator.AuthorizationKey {
	return facilitator.AuthorizationKey{Network: network().ID, Asset: chain.USDC.Address, Payer: p.from(), Nonce: p.nonce}
}

// body is the /settle (or /verify) request for p, as the official client and resource server send
// it, with the payment-identifier extension when p has an id.
func (p pay) body(tb testing.TB) []byte {
	tb.Helper()
	a := devchain.TransferAuthorization{From: p.from(), To: p.payTo, Value: big.NewInt(p.value), ValidAfter: big.NewInt(0),
		ValidBefore: big.NewInt(p.validBefore), Nonce: p.nonce}
	sig, err := chain.USDC.SignTransferAuthorization(p.payer, a)
	if err != nil {
		tb.Fatal(err)
	}
	reqs := map[string]any{"scheme": "exact", "network": network().ID, "amount": a.Value.String(),
		"asset": chain.USDC.Address.Hex(), "payTo": p.payTo.Hex(), "maxTimeoutSeconds": 3600,
		"extra": map[string]any{"name": chain.USDC.Name, "version": chain.USDC.Version}}
	payload := map[string]any{
		"x402Version": 2, "accepted": reqs, "resource": map[string]any{"url": p.resource},
		"payload": map[string]any{"signature": "0x" + hex.EncodeToString(sig), "authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value.String(), "validAfter": "0",
			"validBefore": a.ValidBefore.String(), "nonce": "0x" + hex.EncodeToString(p.nonce[:])}}}
	if p.id != "" {
		payload["extensions"] = map[string]any{facilitator.PaymentIdentifierKey: map[string]any{
			"info": map[string]any{"required": false, "id": p.id}}}
	}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentRequirements": reqs, "paymentPayload": payload})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

func balance(tb testing.TB, addr common.Address) int64 {
	tb.Helper()
	b, err := chain.USDC.BalanceOf(context.Background(), addr)
	if err != nil {
		tb.Fatal(err)
	}
	return b.Int64()
}

func mine(tb testing.TB) {
	tb.Helper()
	if err := chain.Mine(context.Background()); err != nil {
		tb.Fatal(err)
	}
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
	var out facilitator.SettleResponse
	if err := json.Unmarshal(r.Body, &out); err != nil {
		tb.Fatalf("not a SettleResponse (%d): %v: %s", r.Status, err, r.Body)
	}
	return out
}

func (r response) verify(tb testing.TB) facilitator.VerifyResponse {
	tb.Helper()
	var out facilitator.VerifyResponse
	if err := json.Unmarshal(r.Body, &out); err != nil {
		tb.Fatalf("not a VerifyResponse (%d): %v: %s", r.Status, err, r.Body)
	}
	return out
}

// testLogger sends the service's and engine's logs to t.Log.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(string(bytes.TrimSuffix(p, []byte("\n"))))
	return len(p), nil
}

func (p pay) valueBig() *big.Int { return big.NewInt(p.value) }
