package settle_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// ambiguousLedger commits a settlement insert and then, while armed, reports an error (the
// answer was lost) and refuses the next reads of the authorization's row: the engine cannot tell
// whether its write committed until the ledger answers again.
type ambiguousLedger struct {
	settle.Store
	armed      atomic.Bool
	blindReads atomic.Int32 // SettlementByKey calls left that fail
}

func (a *ambiguousLedger) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	id, err := a.Store.InsertSettlement(ctx, s)
	if err == nil && a.armed.CompareAndSwap(true, false) {
		a.blindReads.Store(2)
		return 0, errLost
	}
	return id, err
}

func (a *ambiguousLedger) SettlementByKey(ctx context.Context, k facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	if a.blindReads.Add(-1) >= 0 {
		return nil, errors.New("ledger unreachable")
	}
	return a.Store.SettlementByKey(ctx, k)
}

// TestSettleAmbiguousCommitAnswersPending: the settlement insert commits but its answer is lost,
// and the read that would tell is refused too. The row and its signed transaction are in the
// ledger, so "nothing was sent, retry" would be false (a client believing it signs again and
// pays twice): the answer is settlement_pending with the transaction's hash, the engine finds out
// in the background that the row committed and sends it, and the same payload sent again gets the
// success. Exactly one transfer.
func TestSettleAmbiguousCommitAnswersPending(t *testing.T) {
	var store *ambiguousLedger
	signer := env.NewSigner(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 2 * time.Second, Config: func(c *settle.Config) {
		store = &ambiguousLedger{Store: c.Store}
		c.Store = store
		c.RetryInterval = 100 * time.Millisecond
	}})
	p := env.NewPay(t, env.FundedPayer(t, 10_000), 10_000)
	body := p.Body(t)
	payee := env.Balance(t, p.PayTo)
	ctx := context.Background()
	store.armed.Store(true)

	out, err := r.SettleBody(ctx, t, body)
	if err != nil {
		t.Fatalf("settle through an ambiguous commit: %v; want a settlement_pending answer, not an error saying nothing was sent", err)
	}
	// The background check may find the row within the deadline: then the caller gets the success
	// itself; otherwise pending with the hash, and its retry the success.
	if out.Response.Transaction == "" || (!out.Response.Success && out.Response.ErrorReason != facilitator.ReasonSettlementPending) {
		t.Fatalf("answer %+v, want settlement_pending (or success) with the hash", out.Response)
	}
	row := waitRow(t, p.Key(), 20*time.Second, func(s *facilitator.Settlement) bool { return s.State.Succeeded() })
	if row.TxHash != common.HexToHash(out.Response.Transaction) {
		t.Fatalf("mined %s, but the answer named %s", row.TxHash, out.Response.Transaction)
	}
	if !out.Response.Success {
		again := r.MustSettle(t, body)
		if !again.Response.Success || again.Response.Transaction != out.Response.Transaction {
			t.Fatalf("the same payload again: %+v, want the success", again.Response)
		}
	}
	if got := env.Balance(t, p.PayTo) - payee; got != 10_000 {
		t.Fatalf("payee received %d, want exactly one transfer of 10000", got)
	}
}
