package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// lostCommit commits settlement inserts and then, while armed, reports an error, as a write does
// whose answer was lost (a timeout after the commit, a dropped connection).
type lostCommit struct {
	settle.Store
	armed atomic.Bool
}

var errLost = errors.New("conn closed after commit")

func (l *lostCommit) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	id, err := l.Store.InsertSettlement(ctx, s)
	if err == nil && l.armed.CompareAndSwap(true, false) {
		return 0, errLost
	}
	return id, err
}

func (l *lostCommit) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	ids, err := l.Store.InsertSettlements(ctx, rows)
	if err == nil && l.armed.CompareAndSwap(true, false) {
		return nil, errLost
	}
	return ids, err
}

// TestSettleLostCommitAnswer: a settlement whose ledger write committed but answered an error is
// sent all the same (it is the ledger's now), and the key's next settlements follow it with no
// nonce gap, among many settled at once through one key (so that commits are grouped). Both with
// unguarded rows (one pipelined batch per group) and guarded ones (a wallet cap that nothing
// reaches: one explicit transaction per group, behind the wallets' locks).
func TestSettleLostCommitAnswer(t *testing.T) {
	for _, guarded := range []bool{false, true} {
		t.Run(fmt.Sprintf("guarded=%v", guarded), func(t *testing.T) {
			var store *lostCommit
			signer := env.NewSigner(t)
			r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Config: func(c *settle.Config) {
				store = &lostCommit{Store: c.Store}
				c.Store = store
				if guarded {
					c.Limits = facilitator.Limits{WalletCapCount: 1000, WalletWindow: time.Hour}
				}
			}})
			store.armed.Store(true)
			ctx := context.Background()
			out, err := r.SettleBody(ctx, t, env.NewPay(t, env.FundedPayer(t, 10_000), 10_000).Body(t))
			if err != nil || !out.Response.Success {
				t.Fatalf("settling through a write whose answer was lost: %+v %v; want success", out.Response, err)
			}

			const total = 40
			var wg sync.WaitGroup
			errs := make(chan string, total)
			for range total {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p := env.NewPay(t, env.FundedPayer(t, 10_000), 10_000)
					out, err := r.SettleBody(ctx, t, p.Body(t))
					if err != nil || !out.Response.Success {
						errs <- fmt.Sprintf("%+v %v", out.Response, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Fatalf("a concurrent settle failed: %s", e)
			}
			if n := nonceOf(t, crypto.PubkeyToAddress(signer.PublicKey), "latest"); n != total+1 {
				t.Fatalf("the signer's mined nonce is %d after %d settlements (a gap or a reuse)", n, total+1)
			}
		})
	}
}

// gatedStore holds the first settlement insert until released (so that the settlements arriving
// meanwhile wait for the key and are committed as one group), and records the group commits.
type gatedStore struct {
	settle.Store
	held    chan struct{} // closed when the first insert is being held
	release chan struct{}
	once    sync.Once

	mu      sync.Mutex
	groups  []int // sizes of the InsertSettlements calls
	refused int   // of which answered ErrGroupRefused
}

func (g *gatedStore) gate() {
	g.once.Do(func() {
		close(g.held)
		<-g.release
	})
}

func (g *gatedStore) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	g.gate()
	return g.Store.InsertSettlement(ctx, s)
}

func (g *gatedStore) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	g.gate()
	ids, err := g.Store.InsertSettlements(ctx, rows)
	g.mu.Lock()
	g.groups = append(g.groups, len(rows))
	if errors.Is(err, facilitator.ErrGroupRefused) {
		g.refused++
	}
	g.mu.Unlock()
	return ids, err
}

// TestGroupCommitWalletCapRefusal: settlements on one signer key that wait for it together are
// committed as one group; one of them is over its wallet's cap. The refused one is answered
// wallet_cap_exceeded with nothing written or sent for it; every other one settles; and the
// signer's transactions have contiguous nonces (the refused one took none), all mined, none stuck
// behind a gap. Half the group is also charged to an API key with a gas budget, so the group
// takes wallet and key locks at once.
func TestGroupCommitWalletCapRefusal(t *testing.T) {
	store := &gatedStore{held: make(chan struct{}), release: make(chan struct{})}
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Config: func(c *settle.Config) {
		store.Store = c.Store
		c.Store = store
		c.Limits = facilitator.Limits{WalletCapCount: 1, WalletWindow: time.Hour}
	}})
	ctx := context.Background()
	keyID := newKeyID(t, r, new(big.Int).Mul(big.NewInt(1e18), big.NewInt(1000)))

	// The capped wallet's first settlement takes the key and is held in its commit.
	capped := env.FundedPayer(t, 10_000)
	firstDone := make(chan error, 1)
	go func() {
		out, err := r.SettleBody(ctx, t, env.NewPay(t, capped, 1_000).Body(t))
		if err == nil && !out.Response.Success {
			err = fmt.Errorf("%+v", out.Response)
		}
		firstDone <- err
	}()
	select {
	case <-store.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the first settlement never reached its commit")
	}

	// Meanwhile: ten settlements from fresh wallets and the capped wallet's second, all waiting
	// for the key.
	const others = 10
	type result struct {
		refusal bool
		err     error
	}
	results := make(chan result, others+1)
	over := env.NewPay(t, capped, 1_000)
	var wg sync.WaitGroup
	for i := range others + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(nil)
			if i == others/2 {
				body = over.Body(t)
			} else {
				body = env.NewPay(t, env.FundedPayer(t, 1_000), 1_000).Body(t)
			}
			k := ""
			if i%2 == 0 {
				k = keyID
			}
			out, err := settleAs(ctx, t, r, body, k)
			if i == others/2 {
				results <- result{refusal: true, err: err}
				return
			}
			if err == nil && !out.Response.Success {
				err = fmt.Errorf("%+v", out.Response)
			}
			results <- result{err: err}
		}()
	}
	// Let them all reach the key (verification and fees first), then let the first commit go.
	time.Sleep(1500 * time.Millisecond)
	close(store.release)
	if err := <-firstDone; err != nil {
		t.Fatalf("the capped wallet's first settlement: %v", err)
	}
	wg.Wait()
	close(results)
	for res := range results {
		if res.refusal {
			wantLimited(t, res.err, facilitator.ReasonWalletCapExceeded, time.Hour)
		} else if res.err != nil {
			t.Errorf("a settlement of the group failed: %v", res.err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	store.mu.Lock()
	groups, refused := store.groups, store.refused
	store.mu.Unlock()
	if refused == 0 {
		t.Fatalf("no group commit was refused (groups %v): the test did not group the capped row", groups)
	}
	if _, err := r.DB.SettlementByKey(ctx, over.Key()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("ledger row for the refused payment: %v", err)
	}
	if got := env.Balance(t, over.PayTo); got != 0 {
		t.Fatalf("the refused payment's payee holds %d", got)
	}
	if got := env.Balance(t, over.From()); got != 9_000 {
		t.Fatalf("the capped wallet holds %d, want 9000: exactly one transfer", got)
	}
	// Every one of the signer's transactions is mined: the pool holds nothing of it beyond a gap.
	const sent = others + 1
	if n := nonceOf(t, addr, "pending"); n != sent {
		t.Fatalf("the signer sent %d transactions, want %d", n, sent)
	}
	if mined := nonceOf(t, addr, "latest"); mined != sent {
		t.Fatalf("the signer's mined nonce is %d, want %d (a transaction is stuck behind a gap)", mined, sent)
	}
	open, err := r.DB.OpenSettlements(ctx, env.Network().ID, addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range open {
		if o.State != facilitator.StateMined {
			t.Fatalf("settlement %d still %s", o.ID, o.State)
		}
	}
	if max, ok, err := r.DB.MaxTxNonce(ctx, env.Network().ID, addr); err != nil || !ok || max != sent-1 {
		t.Fatalf("the ledger's highest tx nonce for the signer is %d (%v, %v), want %d: contiguous", max, ok, err, sent-1)
	}
}
