package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/devchain/devchaintest"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres/postgrestest"
)

// The fault tests (issue #8) drive the real binary with concurrent /settle of distinct payments
// while something breaks under it (Postgres, the RPC, the process itself), let it recover without
// manual steps, and then audit the ledger against the chain (auditLedger).

// faultStack starts a chain mining a block every second (so that settlements are in flight, not
// mined at once, when the fault strikes) and, unless dbSuffix is empty, a fresh database on the
// shared test server.
func faultStack(ctx context.Context, t *testing.T, dbSuffix string) (string, *devchain.Chain) {
	t.Helper()
	return freshStack(ctx, t, dbSuffix, devchain.Options{BlockTime: time.Second})
}

// freshStack starts a chain of its own (closed at cleanup) and, unless dbSuffix is empty, a fresh
// database on the shared test server; it skips when they are missing, and fails under CI=true.
func freshStack(ctx context.Context, t *testing.T, dbSuffix string, opts devchain.Options) (string, *devchain.Chain) {
	t.Helper()
	var (
		url   string
		err   error
		chain *devchain.Chain
	)
	if dbSuffix != "" {
		url, err = postgrestest.Fresh(ctx, dbSuffix)
	}
	if err == nil {
		chain, err = devchain.Start(ctx, opts)
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s needs TEST_DATABASE_URL and anvil: %v", t.Name(), err)
		}
		t.Skipf("needs TEST_DATABASE_URL and anvil; run 'make test' (%v)", err)
	}
	t.Cleanup(func() { _ = chain.Close() })
	return url, chain
}

// faultLoad is a merchant population paying one merchant through the facilitator, retrying
// every payment with the same payload until it gets a definite answer.
type faultLoad struct {
	t        *testing.T
	h        *crashHarness // payment bodies, balances
	key      *ecdsa.PrivateKey
	signer   common.Address
	merchant common.Address
	payers   []*devchain.Account
	// idShare is the share of payments sent under a payment identifier.
	idShare float64

	mu       sync.Mutex
	payments []*faultPayment

	attempts, successes, unavailable, pending, lost, replays atomic.Int64
	// refused counts answers that are not allowed under these faults (t.Errorf'd as they come).
	refused atomic.Int64
}

// faultPayment is one authorization and what its requests were answered.
type faultPayment struct {
	key   authKey
	value *big.Int
	body  []byte
	id    string

	mu        sync.Mutex
	settled   bool          // a definite answer: success, or already_settled
	successes []common.Hash // the transactions success:true answers named
	tx        common.Hash   // the transaction of the definite answer
}

func newFaultLoad(ctx context.Context, t *testing.T, chain *devchain.Chain, payers int) *faultLoad {
	t.Helper()
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	l := &faultLoad{t: t, key: key, signer: crypto.PubkeyToAddress(key.PublicKey), merchant: newAccount(t).Address, idShare: 0.5,
		h: &crashHarness{chain: chain, network: facilitator.CAIP2(chain.ChainID)}}
	if err := chain.SetBalance(ctx, l.signer, new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))); err != nil {
		t.Fatal(err)
	}
	for range payers {
		p := newAccount(t)
		if err := chain.USDC.Mint(ctx, p.Address, big.NewInt(1_000_000_000_000)); err != nil {
			t.Fatal(err)
		}
		l.payers = append(l.payers, p)
	}
	return l
}

// newPayment signs a fresh authorization from one of the payers to the merchant.
func (l *faultLoad) newPayment() *faultPayment {
	var nonce [32]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		l.t.Fatal(err)
	}
	payer := l.payers[mrand.IntN(len(l.payers))]
	value := big.NewInt(1_000 + mrand.Int64N(100_000))
	p := &faultPayment{key: authKey{payer.Address, nonce}, value: value, body: l.h.payment(l.t, payer, l.merchant, value, nonce)}
	if mrand.Float64() < l.idShare {
		p.id = "fault_" + hex.EncodeToString(nonce[:12])
		p.body = withPaymentID(l.t, p.body, p.id)
	}
	l.mu.Lock()
	l.payments = append(l.payments, p)
	l.mu.Unlock()
	return p
}

// answer classes of one /settle request.
type answer int

const (
	answerLost        answer = iota // no HTTP answer: the process died, or the connection did
	answerUnavailable               // a clean 503: nothing was sent
	answerPending                   // settlement_pending / payment_in_flight: committed, not yet known
	answerSettled                   // success, or already_settled
)

// attempt sends p once to c and checks the answer is one the faults allow: a success (or
// already_settled naming its transaction), settlement_pending, or a clean 503 with an x402 body
// and Retry-After. Anything else (a false failure, a 500, a body that is not a SettleResponse) is
// an error.
func (l *faultLoad) attempt(c *child, p *faultPayment) answer {
	l.attempts.Add(1)
	res, err := c.client.Post(c.base+"/settle", "application/json", strings.NewReader(string(p.body)))
	if err != nil {
		l.lost.Add(1)
		return answerLost
	}
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		l.lost.Add(1)
		return answerLost
	}
	var out facilitator.SettleResponse
	jerr := json.Unmarshal(raw, &out)
	refuse := func(why string) answer {
		l.refused.Add(1)
		l.t.Errorf("payment %s/%s: %s: %d %s", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], why, res.StatusCode, raw)
		return answerUnavailable
	}
	switch {
	case jerr != nil:
		return refuse("the answer is not a SettleResponse")
	case res.StatusCode == http.StatusServiceUnavailable:
		if out.Success || out.ErrorReason == "" || res.Header.Get("Retry-After") == "" || !strings.EqualFold(out.Payer, p.key.payer.Hex()) {
			return refuse("a 503 without an x402 body (success false, errorReason, payer) and Retry-After")
		}
		l.unavailable.Add(1)
		return answerUnavailable
	case res.StatusCode != http.StatusOK:
		return refuse("an answer that is neither 200 nor 503")
	case out.ErrorReason == facilitator.ReasonSettlementPending || out.ErrorReason == facilitator.ReasonPaymentInFlight:
		l.pending.Add(1)
		return answerPending
	case out.Success || out.ErrorReason == facilitator.ReasonAlreadySettled:
		tx := common.HexToHash(out.Transaction)
		if tx == (common.Hash{}) {
			return refuse("a settled answer without its transaction")
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.settled && p.tx != tx {
			return refuse(fmt.Sprintf("a settled answer naming %s after one naming %s", tx.Hex()[:10], p.tx.Hex()[:10]))
		}
		p.settled, p.tx = true, tx
		if out.Success {
			l.successes.Add(1)
			if facilitator.IsReplay(out.Extensions) {
				l.replays.Add(1)
			}
			p.successes = append(p.successes, tx)
			if p.id == "" && len(p.successes) > 1 {
				l.refused.Add(1)
				l.t.Errorf("payment %s/%s without a payment id was answered success twice", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10])
			}
		}
		return answerSettled
	default:
		return refuse("a false failure")
	}
}

// settleOne retries p (same payload) through the current process until it is settled, stop is
// closed, or ctx ends.
func (l *faultLoad) settleOne(ctx context.Context, target func() *child, p *faultPayment, stop <-chan struct{}) bool {
	for {
		if l.attempt(target(), p) == answerSettled {
			return true
		}
		select {
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(time.Duration(100+mrand.IntN(150)) * time.Millisecond): // Retry-After: 1, shortened
		}
	}
}

// drive runs workers that each pay, one payment after another, until stop is closed. A payment
// still unsettled then is left for settleAll.
func (l *faultLoad) drive(ctx context.Context, target func() *child, workers int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				l.settleOne(ctx, target, l.newPayment(), stop)
			}
		}()
	}
	return &wg
}

// settleAll retries every unsettled payment through c until each is settled (within a minute).
func (l *faultLoad) settleAll(ctx context.Context, c *child) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l.mu.Lock()
	var open []*faultPayment
	for _, p := range l.payments {
		p.mu.Lock()
		if !p.settled {
			open = append(open, p)
		}
		p.mu.Unlock()
	}
	l.mu.Unlock()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, p := range open {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if !l.settleOne(ctx, func() *child { return c }, p, nil) {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		pool, err := devchaintest.PoolSize(context.Background(), l.h.chain)
		l.t.Fatalf("%d of %d payments left unsettled by the faults are still not settled after a minute of retries (anvil's pool: %d, %v)", n, len(open), pool, err)
	}
}

// audit checks, once everything is settled: the ledger against the chain (auditLedger), each
// payment moved money exactly once, and the status API reports each settled by us with its
// transaction.
func (l *faultLoad) audit(ctx context.Context, dbURL string, c *child) auditReport {
	t := l.t
	t.Helper()
	in := auditInput{chain: l.h.chain, dbURL: dbURL, network: l.h.network, signers: []common.Address{l.signer},
		merchant: l.merchant, successes: map[authKey][]common.Hash{}}
	for _, p := range l.payers {
		in.payers = append(in.payers, p.Address)
	}
	total := new(big.Int)
	for _, p := range l.payments {
		in.successes[p.key] = p.successes
		total.Add(total, p.value)
	}
	rep := auditLedger(ctx, t, in)
	if rep.transfers != len(l.payments) {
		t.Errorf("%d payments made, %d transfers to the merchant on chain; want one each", len(l.payments), rep.transfers)
	}
	if got := l.h.balance(ctx, t, l.merchant); got.Cmp(total) != 0 {
		t.Errorf("the merchant holds %s, the payments add up to %s", got, total)
	}
	api := client.New(c.base, client.WithRetries(5))
	for _, p := range l.payments {
		st, found, err := api.Authorization(ctx, facilitator.AuthorizationKey{Network: l.h.network, Asset: l.h.chain.USDC.Address, Payer: p.key.payer, Nonce: p.key.nonce})
		if err != nil || !found || st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || common.HexToHash(st.Transaction) != p.tx {
			t.Errorf("status of %s/%s: %+v found %v err %v; want settled by the facilitator with %s", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], st, found, err, p.tx.Hex()[:10])
			break
		}
	}
	return rep
}

func (l *faultLoad) summary() string {
	return fmt.Sprintf("%d payments, %d requests: %d success (%d replays), %d pending, %d clean 503, %d lost in transit",
		len(l.payments), l.attempts.Load(), l.successes.Load(), l.replays.Load(), l.pending.Load(), l.unavailable.Load(), l.lost.Load())
}
