package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
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
func freshStack(_ context.Context, t *testing.T, dbSuffix string, opts devchain.Options) (string, *devchain.Chain) {
	t.Helper()
	var url string
	if dbSuffix != "" {
		url = stacktest.NewDB(t, dbSuffix)
	}
	return url, stacktest.NewChain(t, opts)
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
	// terminal makes a failure answer final: the payment is not retried and the failure is audited
	// against the chain (wrongAnswers) instead of refused on sight. Under faults that may make an
	// honest engine fail a payment, a failure is allowed when no money moved.
	terminal bool
	// retryCap, when set, has retries wait what Retry-After says, up to retryCap, instead of the
	// shortened wait.
	retryCap time.Duration
	// minedCheck, when set, reads each success's transaction straight from the node as the answer
	// comes: success for a transaction the node has not mined (told on one provider's invented
	// receipt, say) is counted in premature and t.Errorf'd.
	minedCheck bool
	premature  atomic.Int64
	// limit, when set, is how many payments drive makes in all.
	limit  int64
	issued atomic.Int64

	mu       sync.Mutex
	payments []*faultPayment

	attempts, successes, unavailable, pending, lost, replays, failures atomic.Int64
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
	failure   string        // the reason of a terminal failure (only under terminal)
}

// answered reports whether p got a final answer: settled, or failed for good.
func (p *faultPayment) answered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.settled || p.failure != ""
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
	answerFailed                    // a terminal failure (only under terminal)
)

// attempt sends p once to c and checks the answer is one the faults allow: a success (or
// already_settled naming its transaction), settlement_pending, or a clean 503 with an x402 body
// and Retry-After. Anything else (a false failure, a 500, a body that is not a SettleResponse) is
// an error, unless terminal makes a failure a final answer. retryAfter is the answer's
// Retry-After (0 without one).
func (l *faultLoad) attempt(c *child, p *faultPayment) (a answer, retryAfter time.Duration) {
	l.attempts.Add(1)
	res, err := c.client.Post(c.base+"/settle", "application/json", strings.NewReader(string(p.body)))
	if err != nil {
		l.lost.Add(1)
		return answerLost, 0
	}
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		l.lost.Add(1)
		return answerLost, 0
	}
	if secs, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil && secs > 0 {
		retryAfter = time.Duration(secs) * time.Second
	}
	return l.classify(p, res, raw), retryAfter
}

// classify checks one /settle answer and records what it says about p.
func (l *faultLoad) classify(p *faultPayment, res *http.Response, raw []byte) answer {
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
		if out.Success && l.minedCheck {
			l.checkMined(p, tx)
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
	case l.terminal:
		l.failures.Add(1)
		p.mu.Lock()
		p.failure = out.ErrorReason
		p.mu.Unlock()
		return answerFailed
	default:
		return refuse("a false failure")
	}
}

// checkMined counts a success naming tx while the node has no receipt for it. The read comes after
// the answer, so a transaction mined in between is not counted: never a false count.
func (l *faultLoad) checkMined(p *faultPayment, tx common.Hash) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := l.h.chain.Client.TransactionReceipt(ctx, tx)
	switch {
	case errors.Is(err, ethereum.NotFound):
		l.premature.Add(1)
		l.t.Errorf("payment %s/%s answered success with %s, which the node has not mined", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], tx.Hex()[:10])
	case err != nil:
		l.t.Logf("reading the receipt of %s from the node: %v", tx.Hex()[:10], err)
	}
}

// settleOne retries p (same payload) through the current process until it has a final answer
// (settled, or under terminal failed), stop is closed, or ctx ends.
func (l *faultLoad) settleOne(ctx context.Context, target func() *child, p *faultPayment, stop <-chan struct{}) bool {
	for {
		a, retryAfter := l.attempt(target(), p)
		if a == answerSettled || a == answerFailed {
			return true
		}
		wait := time.Duration(100+mrand.IntN(150)) * time.Millisecond // Retry-After: 1, shortened
		if l.retryCap > 0 && retryAfter > 0 {
			wait = min(retryAfter, l.retryCap)
		}
		select {
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// drive runs workers that each pay, one payment after another, until stop is closed (or limit
// payments are made). A payment still unsettled then is left for settleAll.
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
				if l.limit > 0 && l.issued.Add(1) > l.limit {
					return
				}
				l.settleOne(ctx, target, l.newPayment(), stop)
			}
		}()
	}
	return &wg
}

// settleAll retries every payment without a final answer through c until each has one (within a
// minute).
func (l *faultLoad) settleAll(ctx context.Context, c *child) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l.mu.Lock()
	var open []*faultPayment
	for _, p := range l.payments {
		if !p.answered() {
			open = append(open, p)
		}
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
		pool, err := stacktest.PoolSize(context.Background(), l.h.chain)
		l.t.Fatalf("%d of %d payments left unsettled by the faults are still not settled after a minute of retries (anvil's pool: %d, %v)", n, len(open), pool, err)
	}
}

// audit checks, once everything is settled: the ledger against the chain (auditLedger), each
// payment moved money exactly once, and the status API reports each settled by us with its
// transaction.
func (l *faultLoad) audit(ctx context.Context, dbURL string, c *child) auditReport {
	t := l.t
	t.Helper()
	rep := auditLedger(ctx, t, l.auditInput(dbURL))
	total := new(big.Int)
	for _, p := range l.payments {
		total.Add(total, p.value)
	}
	if rep.transfers != len(l.payments) {
		t.Errorf("%d payments made, %d transfers to the merchant on chain; want one each", len(l.payments), rep.transfers)
	}
	if got := l.h.balance(ctx, t, l.merchant); got.Cmp(total) != 0 {
		t.Errorf("the merchant holds %s, the payments add up to %s", got, total)
	}
	rep.discrepancies += len(l.wrongAnswers(rep)) + len(l.statusMismatches(ctx, c, rep))
	return rep
}

// auditInput is what auditLedger checks this load against.
func (l *faultLoad) auditInput(dbURL string) auditInput {
	in := auditInput{chain: l.h.chain, dbURL: dbURL, network: l.h.network, signers: []common.Address{l.signer},
		merchant: l.merchant, successes: map[authKey][]common.Hash{}}
	for _, p := range l.payers {
		in.payers = append(in.payers, p.Address)
	}
	for _, p := range l.payments {
		in.successes[p.key] = p.successes
	}
	return in
}

// wrongAnswers returns the payments whose final answer the chain contradicts (rep.used is the
// chain's word): settled naming a transaction that is not the one that used the authorization,
// or failed although the authorization was used. A payment without a final answer is one too.
func (l *faultLoad) wrongAnswers(rep auditReport) []authKey {
	var wrong []authKey
	for _, p := range l.payments {
		p.mu.Lock()
		settled, tx, failure := p.settled, p.tx, p.failure
		p.mu.Unlock()
		used := rep.used[p.key]
		var why string
		switch {
		case settled && (len(used) != 1 || used[0] != tx):
			why = fmt.Sprintf("answered settled with %s; the chain has %v", tx.Hex()[:10], used)
		case failure != "" && len(used) > 0:
			why = fmt.Sprintf("answered %s; the chain has it used by %v", failure, used)
		case !settled && failure == "":
			why = fmt.Sprintf("got no final answer; the chain has %v", used)
		default:
			continue
		}
		if wrong = append(wrong, p.key); len(wrong) <= 20 {
			l.t.Errorf("payment %s/%s (id %q) %s", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], p.id, why)
		}
	}
	return wrong
}

// statusMismatches asks the status API about every payment and returns those whose answer
// disagrees with the chain: an authorization used on chain must be settled by the facilitator
// with that transaction in that block, an unused one must not be settled.
func (l *faultLoad) statusMismatches(ctx context.Context, c *child, rep auditReport) []authKey {
	api := client.New(c.base, client.WithRetries(5))
	var bad []authKey
	for _, p := range l.payments {
		st, found, err := api.Authorization(ctx, facilitator.AuthorizationKey{Network: l.h.network, Asset: l.h.chain.USDC.Address, Payer: p.key.payer, Nonce: p.key.nonce})
		used := rep.used[p.key]
		var why string
		switch {
		case err != nil:
			why = err.Error()
		case len(used) == 1 && (!found || st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" ||
			common.HexToHash(st.Transaction) != used[0] || st.BlockNumber != rep.usedIn[used[0]]):
			why = fmt.Sprintf("want settled by the facilitator with %s in block %d", used[0].Hex()[:10], rep.usedIn[used[0]])
		case len(used) == 0 && st.State == facilitator.StatusSettled:
			why = "want not settled: the authorization is unused on chain"
		default:
			continue
		}
		if bad = append(bad, p.key); len(bad) <= 20 {
			l.t.Errorf("status of %s/%s: %+v found %v: %s", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], st, found, why)
		}
	}
	return bad
}

func (l *faultLoad) summary() string {
	return fmt.Sprintf("%d payments, %d requests: %d success (%d replays), %d pending, %d clean 503, %d failures, %d lost in transit",
		len(l.payments), l.attempts.Load(), l.successes.Load(), l.replays.Load(), l.pending.Load(), l.unavailable.Load(), l.failures.Load(), l.lost.Load())
}
