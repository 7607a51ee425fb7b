package api_test

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// ledger returns the package's migrated database with the test chain's network bound.
func ledger(t *testing.T) string { return env.Ledger(t, "api") }

// settleStack is the HTTP API with a settlement engine on a fresh signer key, over the shared
// chain (through a counting proxy) and the package's ledger.
type settleStack struct {
	URL    string
	RPC    *rpcCounter
	Logs   *stacktest.SyncBuffer
	DB     *postgres.DB
	Signer common.Address

	// What a server hook may build on.
	Network  facilitator.Network
	Client   *rpc.Client
	Reader   *ethrpc.Reader
	Verifier *verify.Verifier
	Engine   *settle.Engine
	Logger   *slog.Logger
}

type settleOptions struct {
	deadline time.Duration
	// database names the package database to use ("" is the shared "api" one).
	database string
	// paymentIDs puts the payment-identifier service in front of the verifier and the engine.
	paymentIDs bool
	// server finishes the API's configuration, which already has the stack's verifier, engine,
	// supported kinds and logger.
	server func(*api.Config, *settleStack)
	// store wraps the ledger the engine uses.
	store func(*postgres.DB) settle.Store
	// engine adjusts the engine's configuration.
	engine func(*settle.Config)
	// reader builds the verifier's reader on the stack's chain (default: an ethrpc.Reader).
	reader func(ethrpc.Chain) *ethrpc.Reader
}

func newSettleStack(t *testing.T, o settleOptions) *settleStack {
	t.Helper()
	if o.database == "" {
		o.database = "api"
	}
	db, err := postgres.Open(context.Background(), env.Ledger(t, o.database), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	s := &settleStack{RPC: newRPCCounter(t, chain.RPCURL), Logs: &stacktest.SyncBuffer{}, DB: db, Network: testNetwork(v1Name)}
	s.Client = s.RPC.client(t)
	s.Reader = &ethrpc.Reader{Chain: s.Client, Timeout: 5 * time.Second}
	if o.reader != nil {
		s.Reader = o.reader(s.Client)
	}
	s.Logger = slog.New(slog.NewTextHandler(s.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := env.NewEngine(t, stacktest.EngineOptions{Deadline: o.deadline, DB: db, Logger: s.Logger, Chain: s.Client,
		Network: &s.Network, Reader: s.Reader, Config: func(c *settle.Config) {
			if o.store != nil {
				c.Store = o.store(db)
			}
			if o.engine != nil {
				o.engine(c)
			}
		}})
	s.Signer, s.Verifier, s.Engine = stacktest.AddressOf(e.Signer()), e.Verifier, e.Engine
	so := stacktest.ServerOptions{Engine: e, Logger: s.Logger, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Limits = e
		if o.server != nil {
			o.server(c, s)
		}
	}}
	if o.paymentIDs {
		so.PaymentIDs = &paymentid.Config{}
	}
	s.URL = env.NewServer(t, so).URL
	return s
}

func (s *settleStack) settle(tb testing.TB, body []byte) response {
	tb.Helper()
	return do(tb, http.MethodPost, s.URL+"/settle", body)
}

// nonces is the signer's transaction count at latest and pending: what it has sent.
func (s *settleStack) nonces(tb testing.TB) [2]uint64 {
	tb.Helper()
	var out [2]uint64
	for i, block := range []string{"latest", "pending"} {
		var n hexutil.Uint64
		if err := chain.RPC.CallContext(context.Background(), &n, "eth_getTransactionCount", s.Signer, block); err != nil {
			tb.Fatal(err)
		}
		out[i] = uint64(n)
	}
	return out
}

// settlement decodes a SettleResponse-shaped body: JSON, no keys but the SettleResponse's, and
// success, transaction and network always present (the official client's schema requires them).
func settlement(tb testing.TB, r response) (facilitator.SettleResponse, map[string]json.RawMessage) {
	tb.Helper()
	return decodeAnswer[facilitator.SettleResponse](tb, r, "SettleResponse",
		[]string{"success", "errorReason", "errorMessage", "payer", "transaction", "network", "extensions", "extra"},
		"success", "transaction", "network")
}

var txHashRE = regexp.MustCompile(`^0x[0-9a-f]{64}$`)

// paymentFrom is a valid 1 USDC payment from key to a fresh recipient.
func paymentFrom(tb testing.TB, key *ecdsa.PrivateKey) payment {
	tb.Helper()
	p := newPayment(tb, 1)
	p.payer = &devchain.Account{Key: key, Address: crypto.PubkeyToAddress(key.PublicKey)}
	p.auth.From = p.payer.Address
	return p
}

// fundedPayment is paymentFrom a fresh key holding exactly the payment's USDC.
func fundedPayment(tb testing.TB) payment {
	tb.Helper()
	key, err := crypto.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	p := paymentFrom(tb, key)
	if err := chain.USDC.Mint(context.Background(), p.auth.From, p.auth.Value); err != nil {
		tb.Fatal(err)
	}
	return p
}

func usdcOf(tb testing.TB, addr common.Address) int64 {
	tb.Helper()
	b, err := chain.USDC.BalanceOf(context.Background(), addr)
	if err != nil {
		tb.Fatal(err)
	}
	return b.Int64()
}

// TestSettleValid: a valid payment is settled on chain and answered 200 with exactly success,
// transaction, network and payer; the same payload again is not a second success.
func TestSettleValid(t *testing.T) {
	s := newSettleStack(t, settleOptions{})
	for _, version := range []int{2, 1} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			p := fundedPayment(t)
			p.version = version
			wantNetwork := facilitator.CAIP2(chain.ChainID)
			if version == 1 {
				wantNetwork = v1Name
			}
			body := p.body(t)
			before := s.nonces(t)
			r := s.settle(t, body)
			if r.Status != http.StatusOK {
				t.Fatalf("want 200, got %s", r)
			}
			res, keys := settlement(t, r)
			if got := slices.Sorted(maps.Keys(keys)); !reflect.DeepEqual(got, []string{"network", "payer", "success", "transaction"}) {
				t.Fatalf("keys %v, want exactly [network payer success transaction] (%s)", got, r)
			}
			if string(keys["success"]) != "true" || !txHashRE.MatchString(res.Transaction) || res.Network != wantNetwork || res.Payer != p.auth.From.Hex() {
				t.Fatalf("want success with a 0x hash on %s for %s, got %s", wantNetwork, p.auth.From.Hex(), r)
			}
			if r.Header.Get("Retry-After") != "" {
				t.Fatalf("Retry-After on a success")
			}
			rcpt, err := chain.Client.TransactionReceipt(context.Background(), common.HexToHash(res.Transaction))
			if err != nil || rcpt.Status != 1 {
				t.Fatalf("receipt of %s: %+v %v", res.Transaction, rcpt, err)
			}
			if got := usdcOf(t, p.auth.To); got != p.auth.Value.Int64() {
				t.Fatalf("payee holds %d, want %s", got, p.auth.Value)
			}
			if after := s.nonces(t); after[0] != before[0]+1 || after[1] != after[0] {
				t.Fatalf("signer nonces %v -> %v, want exactly one transaction", before, after)
			}

			again := s.settle(t, body)
			res2, _ := settlement(t, again)
			if again.Status != http.StatusOK || res2.Success || res2.ErrorReason != facilitator.ReasonAlreadySettled ||
				res2.Transaction != res.Transaction || res2.Network != wantNetwork {
				t.Fatalf("repeat: want 200 already_settled with %s, got %s", res.Transaction, again)
			}
			if got := usdcOf(t, p.auth.To); got != p.auth.Value.Int64() {
				t.Fatalf("payee holds %d after the repeat", got)
			}
		})
	}
}

// TestSettleFailure: a payment that cannot settle is an outcome, 200 with the reason, an empty
// transaction and the network; nothing is sent.
func TestSettleFailure(t *testing.T) {
	s := newSettleStack(t, settleOptions{})
	key, err := crypto.GenerateKey() // holds no USDC
	if err != nil {
		t.Fatal(err)
	}
	p := paymentFrom(t, key)
	r := s.settle(t, p.body(t))
	if r.Status != http.StatusOK {
		t.Fatalf("want 200, got %s", r)
	}
	res, keys := settlement(t, r)
	if string(keys["success"]) != "false" || res.ErrorReason != facilitator.ReasonInsufficientBalance {
		t.Fatalf("want success false %s, got %s", facilitator.ReasonInsufficientBalance, r)
	}
	if string(keys["transaction"]) != `""` || res.Network != facilitator.CAIP2(chain.ChainID) || res.Payer != p.auth.From.Hex() {
		t.Fatalf("want transaction \"\", the network and the payer, got %s", r)
	}
	if n := s.nonces(t); n != [2]uint64{0, 0} {
		t.Fatalf("signer nonces %v: something was sent", n)
	}
}

// TestSettleBadInput: what cannot be processed is a 400 with a SettleResponse-shaped body, and
// reaches neither the chain nor the ledger.
func TestSettleBadInput(t *testing.T) {
	s := newSettleStack(t, settleOptions{})
	for _, tc := range badInputs(t) {
		t.Run(tc.name, func(t *testing.T) {
			r := sendBadInput(t, s.RPC, func() response { return s.settle(t, tc.body) })
			res, keys := settlement(t, r)
			if string(keys["success"]) != "false" || res.ErrorReason != tc.reason || res.ErrorMessage == "" {
				t.Fatalf("want success false %s with a message, got %s", tc.reason, r)
			}
			if string(keys["transaction"]) != `""` {
				t.Fatalf("want transaction \"\", got %s", r)
			}
		})
	}
	if n := s.nonces(t); n != [2]uint64{0, 0} {
		t.Fatalf("signer nonces %v: something was sent", n)
	}
	if strings.Contains(s.Logs.String(), "level=ERROR") {
		t.Fatalf("client errors logged as server errors:\n%s", s.Logs)
	}
}

// brokenLedger is the real ledger behind a switch: while down, every call fails (or only the
// write before the broadcast, with insertOnly), as when Postgres is unreachable.
type brokenLedger struct {
	settle.Store
	down, insertOnly atomic.Bool
	refused          atomic.Int64
}

const ledgerSecret = "postgres://x402:s3cr3t@10.9.8.7:5432/ledger"

func (b *brokenLedger) fail(insert bool) error {
	if b.down.Load() && (insert || !b.insertOnly.Load()) {
		b.refused.Add(1)
		return fmt.Errorf("failed to connect to %s: dial tcp 10.9.8.7:5432: connect: connection refused", ledgerSecret)
	}
	return nil
}

func (b *brokenLedger) SettlementByKey(ctx context.Context, k facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	if err := b.fail(false); err != nil {
		return nil, err
	}
	return b.Store.SettlementByKey(ctx, k)
}

func (b *brokenLedger) SettlementByID(ctx context.Context, id int64) (*facilitator.Settlement, error) {
	if err := b.fail(false); err != nil {
		return nil, err
	}
	return b.Store.SettlementByID(ctx, id)
}

func (b *brokenLedger) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	if err := b.fail(true); err != nil {
		return 0, err
	}
	return b.Store.InsertSettlement(ctx, s)
}

func (b *brokenLedger) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	if err := b.fail(true); err != nil {
		return nil, err
	}
	return b.Store.InsertSettlements(ctx, rows)
}

func (b *brokenLedger) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	if err := b.fail(false); err != nil {
		return err
	}
	return b.Store.AddTx(ctx, id, tx)
}

func (b *brokenLedger) MarkBroadcast(ctx context.Context, ids []int64) error {
	if err := b.fail(false); err != nil {
		return err
	}
	return b.Store.MarkBroadcast(ctx, ids)
}

func (b *brokenLedger) Resolve(ctx context.Context, rs []facilitator.Resolution) ([]int64, []int64, error) {
	if err := b.fail(false); err != nil {
		return nil, nil, err
	}
	return b.Store.Resolve(ctx, rs)
}

func (b *brokenLedger) Reopen(ctx context.Context, m facilitator.MinedIn, detail string) error {
	if err := b.fail(false); err != nil {
		return err
	}
	return b.Store.Reopen(ctx, m, detail)
}

func (b *brokenLedger) MarkFinal(ctx context.Context, finals []facilitator.MinedIn) ([]int64, error) {
	if err := b.fail(false); err != nil {
		return nil, err
	}
	return b.Store.MarkFinal(ctx, finals)
}

func (b *brokenLedger) ClaimDelivery(ctx context.Context, id int64, keyID string, claim []byte, lease time.Duration) (bool, error) {
	if err := b.fail(false); err != nil {
		return false, err
	}
	return b.Store.ClaimDelivery(ctx, id, keyID, claim, lease)
}

func (b *brokenLedger) ConfirmDeliveries(ctx context.Context, ds []facilitator.Delivery) ([]int64, error) {
	if err := b.fail(false); err != nil {
		return nil, err
	}
	return b.Store.ConfirmDeliveries(ctx, ds)
}

func (b *brokenLedger) ReleaseDelivery(ctx context.Context, id int64, claim []byte) error {
	if err := b.fail(false); err != nil {
		return err
	}
	return b.Store.ReleaseDelivery(ctx, id, claim)
}

func (b *brokenLedger) OpenSettlements(ctx context.Context, network string, signer common.Address) ([]facilitator.OpenSettlement, error) {
	if err := b.fail(false); err != nil {
		return nil, err
	}
	return b.Store.OpenSettlements(ctx, network, signer)
}

func (b *brokenLedger) NoncesHeld(ctx context.Context, network string, signer common.Address, from uint64) ([]uint64, error) {
	if err := b.fail(false); err != nil {
		return nil, err
	}
	return b.Store.NoncesHeld(ctx, network, signer, from)
}

// TestSettleLedgerDown: without the ledger there is no settlement: 503 with Retry-After and a
// SettleResponse-shaped body, nothing broadcast, the cause logged but not shown; once the ledger
// is back, the same payload settles.
func TestSettleLedgerDown(t *testing.T) {
	ledger(t)
	for _, tc := range []struct {
		name       string
		insertOnly bool
	}{
		{"every call fails", false},
		{"the write before the broadcast fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := &brokenLedger{}
			s := newSettleStack(t, settleOptions{store: func(db *postgres.DB) settle.Store {
				broken.Store = db
				return broken
			}})
			broken.insertOnly.Store(tc.insertOnly)
			broken.down.Store(true)
			p := fundedPayment(t)
			body := p.body(t)

			r := s.settle(t, body)
			wantUnavailable(t, r)
			res, keys := settlement(t, r)
			if string(keys["success"]) != "false" || res.ErrorReason != facilitator.ReasonUnexpectedSettleError || res.ErrorMessage == "" {
				t.Fatalf("want success false %s with a message, got %s", facilitator.ReasonUnexpectedSettleError, r)
			}
			if string(keys["transaction"]) != `""` || res.Network != facilitator.CAIP2(chain.ChainID) || res.Payer != p.auth.From.Hex() {
				t.Fatalf("want transaction \"\", the network and the payer, got %s", r)
			}
			if broken.refused.Load() == 0 {
				t.Fatalf("the ledger was never asked")
			}
			for _, secret := range []string{"s3cr3t", "10.9.8.7", "connection refused", "dial tcp"} {
				if strings.Contains(string(r.Body), secret) {
					t.Fatalf("body leaks %q: %s", secret, r)
				}
			}
			if logs := s.Logs.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "connection refused") {
				t.Fatalf("the cause is not in the error log:\n%s", logs)
			}
			if n := s.nonces(t); n != [2]uint64{0, 0} {
				t.Fatalf("signer nonces %v: a transaction left without a ledger row", n)
			}
			if got := usdcOf(t, p.auth.To); got != 0 {
				t.Fatalf("payee holds %d", got)
			}
			used, err := chain.USDC.AuthorizationState(context.Background(), p.auth.From, p.auth.Nonce)
			if err != nil || used {
				t.Fatalf("authorization used %v (%v)", used, err)
			}
			if _, err := s.DB.SettlementByKey(context.Background(), facilitator.AuthorizationKey{Network: facilitator.CAIP2(chain.ChainID),
				Asset: chain.USDC.Address, Payer: p.auth.From, Nonce: p.auth.Nonce}); !errors.Is(err, facilitator.ErrNotFound) {
				t.Fatalf("a ledger row exists: %v", err)
			}

			// The ledger is back: the same payload settles, once.
			broken.down.Store(false)
			r = s.settle(t, body)
			if res, _ := settlement(t, r); r.Status != http.StatusOK || !res.Success || !txHashRE.MatchString(res.Transaction) {
				t.Fatalf("after recovery: want 200 success, got %s", r)
			}
			if got := usdcOf(t, p.auth.To); got != p.auth.Value.Int64() {
				t.Fatalf("payee holds %d, want %s", got, p.auth.Value)
			}
			if n := s.nonces(t); n != [2]uint64{1, 1} {
				t.Fatalf("signer nonces %v, want exactly one transaction (nonce 0 reused after the refusal)", n)
			}
		})
	}
}

// TestSettlePendingRetryAfter: a settlement outliving the deadline is 200 settlement_pending with
// its hash and a Retry-After; the retry after the block is the success with that hash.
func TestSettlePendingRetryAfter(t *testing.T) {
	ledger(t) // skip before touching the chain
	// Minted while anvil still mines.
	p := fundedPayment(t)
	body := p.body(t)
	ctx := context.Background()
	stacktest.ManualMining(t, chain)
	s := newSettleStack(t, settleOptions{deadline: time.Second}) // registered after: stops first

	r := s.settle(t, body)
	if r.Status != http.StatusOK {
		t.Fatalf("want 200, got %s", r)
	}
	res, _ := settlement(t, r)
	if res.Success || res.ErrorReason != facilitator.ReasonSettlementPending || !txHashRE.MatchString(res.Transaction) ||
		res.Network != facilitator.CAIP2(chain.ChainID) {
		t.Fatalf("want settlement_pending with a hash, got %s", r)
	}
	if r.Header.Get("Retry-After") == "" {
		t.Fatalf("settlement_pending without Retry-After")
	}
	if err := chain.Mine(ctx); err != nil {
		t.Fatal(err)
	}
	again := s.settle(t, body)
	res2, _ := settlement(t, again)
	if again.Status != http.StatusOK || !res2.Success || res2.Transaction != res.Transaction {
		t.Fatalf("retry after the block: want 200 success with %s, got %s", res.Transaction, again)
	}
	if again.Header.Get("Retry-After") != "" {
		t.Fatalf("Retry-After on a success")
	}
	if got := usdcOf(t, p.auth.To); got != p.auth.Value.Int64() {
		t.Fatalf("payee holds %d, want %s", got, p.auth.Value)
	}
}
