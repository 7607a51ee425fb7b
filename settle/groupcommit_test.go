package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/settle"
)

// lostCommit commits settlement inserts and then, while armed, reports an error, as a write does
// whose answer was lost (a timeout after the commit, a dropped connection).
type lostCommit struct {
	settle.Store
	armed atomic.Bool
}

var errLost = errors.New("conn closed after commit")

func (l *lostCommit) InsertSettlement(ctx context.Context, s *settle.NewSettlement) (int64, error) {
	id, err := l.Store.InsertSettlement(ctx, s)
	if err == nil && l.armed.CompareAndSwap(true, false) {
		return 0, errLost
	}
	return id, err
}

func (l *lostCommit) InsertSettlements(ctx context.Context, rows []*settle.NewSettlement) ([]int64, error) {
	ids, err := l.Store.InsertSettlements(ctx, rows)
	if err == nil && l.armed.CompareAndSwap(true, false) {
		return nil, errLost
	}
	return ids, err
}

// TestSettleLostCommitAnswer: a settlement whose ledger write committed but answered an error is
// sent all the same (it is the ledger's now), and the key's next settlements follow it with no
// nonce gap, among many settled at once through one key (so that commits are grouped).
func TestSettleLostCommitAnswer(t *testing.T) {
	var store *lostCommit
	signer := newSigner(t)
	r := newRig(t, rigOptions{signers: signersOf(signer), cfg: func(c *settle.Config) {
		store = &lostCommit{Store: c.Store}
		c.Store = store
	}})
	store.armed.Store(true)
	ctx := context.Background()
	out, err := r.settleBody(ctx, t, newPay(t, fundedPayer(t, 10_000), 10_000).body(t))
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
			p := newPay(t, fundedPayer(t, 10_000), 10_000)
			out, err := r.settleBody(ctx, t, p.body(t))
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
	n, err := chain.Client.NonceAt(ctx, crypto.PubkeyToAddress(signer.PublicKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != total+1 {
		t.Fatalf("the signer's mined nonce is %d after %d settlements (a gap or a reuse)", n, total+1)
	}
}

func signersOf(keys ...*ecdsa.PrivateKey) []*ecdsa.PrivateKey { return keys }
