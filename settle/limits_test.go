package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// settleAs settles a body sent with the API key keyID ("" for none), as the API does.
func settleAs(ctx context.Context, t testing.TB, r *stacktest.Engine, body []byte, keyID string) (facilitator.SettleOutcome, error) {
	t.Helper()
	p := stacktest.Decode(t, body)
	p.KeyID, p.IDScope = keyID, keyID
	return r.Settle(ctx, p)
}

// wantLimited checks err is a refusal by a limit with reason and a Retry-After within (0, most].
func wantLimited(t *testing.T, err error, reason string, most time.Duration) {
	t.Helper()
	var fe *facilitator.Error
	if !errors.As(err, &fe) || fe.Code != facilitator.ELimited || fe.Reason != reason {
		t.Fatalf("err %v, want a %s refusal", err, reason)
	}
	if fe.RetryAfter <= 0 || fe.RetryAfter > most {
		t.Fatalf("RetryAfter %s, want within (0, %s]", fe.RetryAfter, most)
	}
}

func mustSucceed(t *testing.T, out facilitator.SettleOutcome, err error) {
	t.Helper()
	if err != nil || !out.Response.Success {
		t.Fatalf("settle: %+v, %v", out.Response, err)
	}
}

// TestWalletCapCount: with a cap of two settlements per wallet, the third is refused (429-class,
// with a Retry-After within the window), nothing is signed or written for it, the tx nonce it
// would have used goes to the next settlement, and another wallet is not affected.
func TestWalletCapCount(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{Config: func(c *settle.Config) {
		c.Limits = facilitator.Limits{WalletCapCount: 2, WalletWindow: time.Hour}
	}})
	ctx := context.Background()
	signer := crypto.PubkeyToAddress(r.Signers[0].PublicKey)
	payer := env.FundedPayer(t, 10_000)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	for i := 0; i < 2; i++ {
		out, err := r.SettleBody(ctx, t, env.NewPay(t, payer, 1_000).Body(t))
		mustSucceed(t, out, err)
	}
	third := env.NewPay(t, payer, 1_000)
	_, err := r.SettleBody(ctx, t, third.Body(t))
	wantLimited(t, err, facilitator.ReasonWalletCapExceeded, time.Hour)
	if got := env.Balance(t, from); got != 8_000 {
		t.Fatalf("payer holds %d, want 8000: exactly two transfers", got)
	}
	if got := env.Balance(t, third.PayTo); got != 0 {
		t.Fatalf("the refused payment's payee holds %d", got)
	}
	key := facilitator.AuthorizationKey{Network: env.Network().ID, Asset: env.Chain.USDC.Address, Payer: from, Nonce: third.Nonce}
	if _, err := r.DB.SettlementByKey(ctx, key); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("ledger row for the refused payment: %v", err)
	}
	if n := nonceOf(t, signer, "pending"); n != 2 {
		t.Fatalf("signer sent %d transactions, want 2", n)
	}
	// The same refusal again (a retry before the window passed), then another wallet settles on
	// the nonce the refused one did not take.
	_, err = r.SettleBody(ctx, t, third.Body(t))
	wantLimited(t, err, facilitator.ReasonWalletCapExceeded, time.Hour)
	out, err := r.SettleBody(ctx, t, env.NewPay(t, env.FundedPayer(t, 1_000), 1_000).Body(t))
	mustSucceed(t, out, err)
	s, err := r.DB.SettlementByID(ctx, out.SettlementID)
	if err != nil {
		t.Fatal(err)
	}
	if s.TxNonce != 2 {
		t.Fatalf("next settlement has tx nonce %d, want 2 (the refused one took none)", s.TxNonce)
	}
}

// TestWalletCapAmount: a cap of 250 base units admits 100 + 100, refuses a third 100, and still
// admits 50 (the exact remainder).
func TestWalletCapAmount(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{Config: func(c *settle.Config) {
		c.Limits = facilitator.Limits{WalletCapAmount: big.NewInt(250), WalletWindow: time.Hour}
	}})
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000)
	for i := 0; i < 2; i++ {
		out, err := r.SettleBody(ctx, t, env.NewPay(t, payer, 100).Body(t))
		mustSucceed(t, out, err)
	}
	_, err := r.SettleBody(ctx, t, env.NewPay(t, payer, 100).Body(t))
	wantLimited(t, err, facilitator.ReasonWalletCapExceeded, time.Hour)
	out, err := r.SettleBody(ctx, t, env.NewPay(t, payer, 50).Body(t))
	mustSucceed(t, out, err)
	if got := env.Balance(t, crypto.PubkeyToAddress(payer.PublicKey)); got != 750 {
		t.Fatalf("payer holds %d, want 750", got)
	}
	// A payment larger than the cap on its own can never fit: Retry-After is the whole window.
	tight := env.NewEngine(t, stacktest.EngineOptions{Config: func(c *settle.Config) {
		c.Limits = facilitator.Limits{WalletCapAmount: big.NewInt(10), WalletWindow: time.Minute}
	}})
	_, err = tight.SettleBody(ctx, t, env.NewPay(t, env.FundedPayer(t, 100), 11).Body(t))
	wantLimited(t, err, facilitator.ReasonWalletCapExceeded, time.Minute)
	if ra := facilitator.ErrorRetryAfter(err); ra != time.Minute {
		t.Fatalf("RetryAfter %s, want the window", ra)
	}
}

// TestWalletCapConcurrent: ten concurrent settles of distinct payments from one wallet, through
// two engines (two processes' worth of connections and signers) on one ledger, with a cap of
// three: exactly three transfers happen, the seven others are refused.
func TestWalletCapConcurrent(t *testing.T) {
	capped := func(c *settle.Config) { c.Limits = facilitator.Limits{WalletCapCount: 3, WalletWindow: time.Hour} }
	rigs := []*stacktest.Engine{env.NewEngine(t, stacktest.EngineOptions{Config: capped}), env.NewEngine(t, stacktest.EngineOptions{Config: capped})}
	ctx := context.Background()
	payer := env.FundedPayer(t, 10_000)
	bodies := make([][]byte, 10)
	for i := range bodies {
		bodies[i] = env.NewPay(t, payer, 1_000).Body(t)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for i, body := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := rigs[i%2].SettleBody(ctx, t, body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && out.Response.Success:
				ok++
			case facilitator.ErrorReason(err, "") == facilitator.ReasonWalletCapExceeded:
				refused++
			default:
				t.Errorf("settle: %+v, %v", out.Response, err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || refused != 7 {
		t.Fatalf("%d settled, %d refused; want 3 and 7", ok, refused)
	}
	if got := env.Balance(t, crypto.PubkeyToAddress(payer.PublicKey)); got != 7_000 {
		t.Fatalf("payer holds %d, want 7000: exactly three transfers", got)
	}
	sent := uint64(0)
	for _, r := range rigs {
		sent += nonceOf(t, crypto.PubkeyToAddress(r.Signers[0].PublicKey), "pending")
	}
	if sent != 3 {
		t.Fatalf("signers sent %d transactions, want 3", sent)
	}
}

// TestKeyGasBudget: a key whose budget covers about one settlement's worst-case gas cost gets the
// second refused; other keys and requests without a key are not charged; raising the budget to
// unlimited lets it settle again.
func TestKeyGasBudget(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{})
	ctx := context.Background()
	keyID := newKeyID(t, r, nil)
	payer := env.FundedPayer(t, 10_000)
	out, err := settleAs(ctx, t, r, env.NewPay(t, payer, 1_000).Body(t), keyID)
	mustSucceed(t, out, err)
	reserved := gasReserved(t, out.SettlementID)
	if reserved.Sign() <= 0 {
		t.Fatalf("gas reserved %s", reserved)
	}
	// Room for 1.2 settlements: the next one does not fit.
	budget := new(big.Int).Div(new(big.Int).Mul(reserved, big.NewInt(12)), big.NewInt(10))
	if err := r.DB.SetAPIKeyGasBudget(ctx, keyID, budget); err != nil {
		t.Fatal(err)
	}
	second := env.NewPay(t, payer, 1_000)
	_, err = settleAs(ctx, t, r, second.Body(t), keyID)
	wantLimited(t, err, facilitator.ReasonGasBudgetExceeded, 24*time.Hour)
	if got := env.Balance(t, second.PayTo); got != 0 {
		t.Fatalf("the refused payment moved %d", got)
	}
	// Another key (no budget: the engine's default, none) and no key at all still settle.
	out, err = settleAs(ctx, t, r, env.NewPay(t, payer, 1_000).Body(t), newKeyID(t, r, nil))
	mustSucceed(t, out, err)
	out, err = settleAs(ctx, t, r, env.NewPay(t, payer, 1_000).Body(t), "")
	mustSucceed(t, out, err)
	// Unlimited: the refused payment settles.
	if err := r.DB.SetAPIKeyGasBudget(ctx, keyID, big.NewInt(0)); err != nil {
		t.Fatal(err)
	}
	out, err = settleAs(ctx, t, r, second.Body(t), keyID)
	mustSucceed(t, out, err)

	// The engine's default applies to keys without a budget of their own.
	d := env.NewEngine(t, stacktest.EngineOptions{Config: func(c *settle.Config) { c.Limits.KeyGasBudget = big.NewInt(1) }})
	_, err = settleAs(ctx, t, d, env.NewPay(t, payer, 1_000).Body(t), newKeyID(t, d, nil))
	wantLimited(t, err, facilitator.ReasonGasBudgetExceeded, 24*time.Hour)
	out, err = settleAs(ctx, t, d, env.NewPay(t, payer, 1_000).Body(t), newKeyID(t, d, big.NewInt(0)))
	mustSucceed(t, out, err)
}

func newKeyID(t *testing.T, r *stacktest.Engine, budget *big.Int) string {
	t.Helper()
	_, id, hash, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	k := &facilitator.APIKey{ID: id, Hash: hash, Name: t.Name(), Scopes: []facilitator.Scope{facilitator.ScopeSettle}, GasBudgetWei: budget}
	if err := r.DB.InsertAPIKey(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	return id
}

// gasReserved reads a settlement's reserved gas cost straight from the ledger.
func gasReserved(t *testing.T, id int64) *big.Int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(context.Background(), `SELECT gas_reserved::text FROM settlements WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		t.Fatalf("gas_reserved %q", s)
	}
	return v
}

// logBuffer keeps the engine's log lines (and shows them in t.Log).
type logBuffer struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.t.Log(string(p[:len(p)-1]))
	b.mu.Lock()
	b.lines = append(b.lines, string(p))
	b.mu.Unlock()
	return len(p), nil
}

func (b *logBuffer) count(substrings ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
next:
	for _, l := range b.lines {
		for _, s := range substrings {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// TestSignerBalanceGuard: a signer below the minimum balance takes no new settlement (the other
// signer does), with one ERROR line naming it; with every signer low /settle is refused as
// insufficient_signer_funds and nothing is signed; funding a signer lets settlement resume.
func TestSignerBalanceGuard(t *testing.T) {
	logs := &logBuffer{t: t}
	a, b := env.NewSigner(t), env.NewSigner(t)
	addrA, addrB := crypto.PubkeyToAddress(a.PublicKey), crypto.PubkeyToAddress(b.PublicKey)
	eth := big.NewInt(1e18)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{a, b}, Config: func(c *settle.Config) {
		c.SignerMinBalance = eth
		c.BalanceInterval = 50 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}})
	ctx := context.Background()
	status := func(addr common.Address) settle.SignerHealth {
		for _, s := range r.Engine.Signers() {
			if s.Address == addr {
				return s
			}
		}
		t.Fatalf("no status for %s", addr)
		return settle.SignerHealth{}
	}
	waitLow := func(addr common.Address, low bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for status(addr).BalanceLow != low {
			if time.Now().After(deadline) {
				t.Fatalf("signer %s: BalanceLow never became %v", addr, low)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	st := status(addrA)
	if st.Network != env.Network().ID || !st.Leased || st.BalanceLow || st.Balance == nil || st.Balance.Cmp(eth) <= 0 {
		t.Fatalf("status at start: %+v", st)
	}

	half := new(big.Int).Div(eth, big.NewInt(2))
	if err := env.Chain.SetBalance(ctx, addrA, half); err != nil {
		t.Fatal(err)
	}
	waitLow(addrA, true)
	payer := env.FundedPayer(t, 10_000)
	for i := 0; i < 2; i++ {
		out, err := r.SettleBody(ctx, t, env.NewPay(t, payer, 1_000).Body(t))
		mustSucceed(t, out, err)
		s, err := r.DB.SettlementByID(ctx, out.SettlementID)
		if err != nil {
			t.Fatal(err)
		}
		if s.Signer != addrB {
			t.Fatalf("settlement signed by %s, want the funded signer %s", s.Signer, addrB)
		}
	}
	if n := logs.count("level=ERROR", "signer balance below threshold: fund it", strings.ToLower(addrA.Hex()), "balance_wei=500000000000000000", "threshold_wei=1000000000000000000"); n != 1 {
		t.Fatalf("%d ERROR lines for the low signer, want exactly 1", n)
	}

	if err := env.Chain.SetBalance(ctx, addrB, half); err != nil {
		t.Fatal(err)
	}
	waitLow(addrB, true)
	refused := env.NewPay(t, payer, 1_000)
	sentA, sentB := nonceOf(t, addrA, "pending"), nonceOf(t, addrB, "pending")
	_, err := r.SettleBody(ctx, t, refused.Body(t))
	var fe *facilitator.Error
	if !errors.As(err, &fe) || fe.Code != facilitator.EUnavailable || fe.Reason != facilitator.ReasonInsufficientSignerFunds || fe.RetryAfter <= 0 {
		t.Fatalf("with every signer low: %v", err)
	}
	if nonceOf(t, addrA, "pending") != sentA || nonceOf(t, addrB, "pending") != sentB {
		t.Fatal("a transaction was sent while every signer was low")
	}
	key := facilitator.AuthorizationKey{Network: env.Network().ID, Asset: env.Chain.USDC.Address, Payer: crypto.PubkeyToAddress(payer.PublicKey), Nonce: refused.Nonce}
	if _, err := r.DB.SettlementByKey(ctx, key); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("ledger row for the refused payment: %v", err)
	}

	if err := env.Chain.SetBalance(ctx, addrA, new(big.Int).Mul(eth, big.NewInt(10))); err != nil {
		t.Fatal(err)
	}
	waitLow(addrA, false)
	out, err := r.SettleBody(ctx, t, refused.Body(t))
	mustSucceed(t, out, err)
	if s, err := r.DB.SettlementByID(ctx, out.SettlementID); err != nil || s.Signer != addrA {
		t.Fatalf("after funding: %+v, %v", s, err)
	}
	if n := logs.count("level=INFO", "signer balance back above threshold", strings.ToLower(addrA.Hex())); n != 1 {
		t.Fatalf("%d recovery lines, want 1", n)
	}
	if n := logs.count("level=ERROR", "signer balance below threshold", strings.ToLower(addrA.Hex())); n != 1 {
		t.Fatalf("%d ERROR lines for signer A over the test, want 1 (once per transition)", n)
	}
	for _, s := range r.Engine.Signers() {
		if !s.Leased || s.Balance == nil {
			t.Fatalf("status: %+v", s)
		}
	}
}
