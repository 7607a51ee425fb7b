package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestSettleOnce: one payment settles, the payee gets exactly the amount, the ledger row is
// mined with the receipt's hash, and a repeat of the same payload is not a second success.
func TestSettleOnce(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{})
	ctx := context.Background()
	payer := env.FundedPayer(t, 5_000_000)
	p := env.NewPay(t, payer, 1_250_000)
	body := p.Body(t)

	out := r.MustSettle(t, body)
	res := out.Response
	if !res.Success || res.Transaction == "" || res.Network != env.Network().ID || res.Payer != crypto.PubkeyToAddress(payer.PublicKey).Hex() || !out.Claimed {
		t.Fatalf("first settle: %+v", out)
	}
	if got := env.Balance(t, p.PayTo); got != 1_250_000 {
		t.Fatalf("payee holds %d, want 1250000", got)
	}
	s, err := r.DB.SettlementByID(ctx, out.SettlementID)
	if err != nil {
		t.Fatal(err)
	}
	if !s.State.Succeeded() || s.TxHash.Hex() != res.Transaction || !s.Delivered {
		t.Fatalf("ledger row %+v", s)
	}

	again := r.MustSettle(t, body)
	if again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled || again.Response.Transaction != res.Transaction {
		t.Fatalf("repeat: %+v", again.Response)
	}
	if got := env.Balance(t, p.PayTo); got != 1_250_000 {
		t.Fatalf("payee holds %d after the repeat", got)
	}
}

// TestSettleConcurrentDuplicates: 50 concurrent settles of one payload make one transaction and
// one transfer; one caller gets success, every other gets the same transaction as already settled
// (or as settlement_pending while the success's answer is undecided: then its retry is told
// already settled).
func TestSettleConcurrentDuplicates(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{})
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 700_000)
	body := p.Body(t)

	const n = 50
	outs := make([]facilitator.SettleOutcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			outs[i], errs[i] = r.SettleBody(context.Background(), t, body)
		}()
	}
	close(start)
	wg.Wait()

	successes := 0
	tx := ""
	var pending []int
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		res := outs[i].Response
		if tx == "" {
			tx = res.Transaction
		}
		if res.Transaction != tx || tx == "" {
			t.Fatalf("caller %d saw transaction %q, another %q", i, res.Transaction, tx)
		}
		switch {
		case res.Success:
			successes++
		case res.ErrorReason == facilitator.ReasonAlreadySettled:
		case res.ErrorReason == facilitator.ReasonSettlementPending:
			pending = append(pending, i)
		default:
			t.Fatalf("caller %d: %+v", i, res)
		}
	}
	for _, i := range pending {
		if out := r.MustSettle(t, body); out.Response.ErrorReason != facilitator.ReasonAlreadySettled || out.Response.Transaction != tx {
			t.Fatalf("caller %d was told pending; its retry: %+v, want already_settled with %s", i, out.Response, tx)
		}
	}
	if successes != 1 {
		t.Fatalf("%d callers were told success", successes)
	}
	if got := env.Balance(t, p.PayTo); got != 700_000 {
		t.Fatalf("payee holds %d, want exactly 700000", got)
	}
	if got := env.Balance(t, crypto.PubkeyToAddress(payer.PublicKey)); got != 300_000 {
		t.Fatalf("payer holds %d, want 300000", got)
	}
	signer := crypto.PubkeyToAddress(r.Signers[0].PublicKey)
	if nonce := nonceOf(t, signer, "latest"); nonce != 1 {
		t.Fatalf("signer sent %d transactions, want exactly 1", nonce)
	}
}

// TestSettleManyPayers: 200 distinct payments at concurrency 32 over two signer keys all settle,
// with no nonce error, each signer's nonces used without gaps, and every payee paid once.
func TestSettleManyPayers(t *testing.T) {
	signers := []*ecdsa.PrivateKey{env.NewSigner(t), env.NewSigner(t)}
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: signers})
	const total, conc = 200, 32
	pays, bodies := payersOfTheirOwn(t, total, 10_000)
	if failures := settleThrough(t, r, bodies, conc); len(failures) > 0 {
		t.Fatalf("%d of %d failed, first: %s", len(failures), total, failures[0])
	}
	for i, p := range pays {
		if got := env.Balance(t, p.PayTo); got != 10_000 {
			t.Fatalf("payee %d holds %d", i, got)
		}
	}
	var sent uint64
	for _, k := range signers {
		n := nonceOf(t, crypto.PubkeyToAddress(k.PublicKey), "latest")
		if n == 0 {
			t.Fatalf("signer %s sent nothing: keys are not shared out", crypto.PubkeyToAddress(k.PublicKey))
		}
		sent += n
	}
	if sent != total {
		t.Fatalf("signers used %d nonces for %d payments (a gap or a reuse)", sent, total)
	}
}

// payersOfTheirOwn are n payments of value, each by a payer funded with exactly value, and their
// bodies.
func payersOfTheirOwn(tb testing.TB, n int, value int64) ([]stacktest.Pay, [][]byte) {
	pays := make([]stacktest.Pay, n)
	bodies := make([][]byte, n)
	for i := range pays {
		pays[i] = env.NewPay(tb, env.FundedPayer(tb, value), value)
		bodies[i] = pays[i].Body(tb)
	}
	return pays, bodies
}

// settleThrough settles bodies through conc callers at once, each taking the next body when it is
// answered, and returns the failures (an error, or an answer other than success).
func settleThrough(tb testing.TB, r *stacktest.Engine, bodies [][]byte, conc int) []string {
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out, err := r.SettleBody(context.Background(), tb, bodies[i])
				if err != nil || !out.Response.Success {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("payment %d: %+v %v", i, out.Response, err))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range bodies {
		work <- i
	}
	close(work)
	wg.Wait()
	return failures
}

// TestSettleInvalidLeavesNoRow: a payment that fails verification is answered with the reason and
// nothing is written or sent, so the same authorization can be settled once it becomes valid.
func TestSettleInvalidLeavesNoRow(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{})
	ctx := context.Background()
	payer, _ := crypto.GenerateKey() // holds no USDC yet
	p := env.NewPay(t, payer, 50_000)
	body := p.Body(t)
	out := r.MustSettle(t, body)
	if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonInsufficientBalance || out.Response.Transaction != "" {
		t.Fatalf("unfunded payer: %+v", out.Response)
	}
	key := facilitator.AuthorizationKey{Network: env.Network().ID, Asset: env.Chain.USDC.Address, Payer: crypto.PubkeyToAddress(payer.PublicKey), Nonce: p.Nonce}
	if _, err := r.DB.SettlementByKey(ctx, key); err != facilitator.ErrNotFound {
		t.Fatalf("a rejected settlement left a row: %v", err)
	}
	if err := env.Chain.USDC.Mint(ctx, key.Payer, big.NewInt(50_000)); err != nil {
		t.Fatal(err)
	}
	if out := r.MustSettle(t, body); !out.Response.Success {
		t.Fatalf("after funding: %+v", out.Response)
	}
}

// TestStoppedEngineRefuses: after Stop, a settlement is refused with ErrClosed (503, nothing
// written, nothing sent) instead of waiting on loops that no longer run, and Start does not run
// the engine again.
func TestStoppedEngineRefuses(t *testing.T) {
	r := env.NewEngine(t, stacktest.EngineOptions{})
	ctx := context.Background()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	payer := env.FundedPayer(t, 5_000_000)
	p := env.NewPay(t, payer, 1_000)
	_, err := r.SettleBody(ctx, t, p.Body(t))
	if !errors.Is(err, facilitator.ErrClosed) || facilitator.ErrorCode(err) != facilitator.EUnavailable {
		t.Fatalf("settle after Stop: %v, want ErrClosed (unavailable)", err)
	}
	if _, err := r.DB.SettlementByKey(ctx, p.Key()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("a row after a refused settle: %v", err)
	}
	if err := r.Start(ctx); !errors.Is(err, facilitator.ErrClosed) {
		t.Fatalf("Start after Stop: %v, want ErrClosed", err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
}
