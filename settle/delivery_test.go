package settle_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/settle/settletest"
)

// hungClaims is the ledger with a ClaimDelivery that never answers: it returns only when its
// context ends (at once, when that context has no deadline, so that a missing bound fails the
// test instead of hanging it).
type hungClaims struct {
	settle.Store
	unbounded atomic.Bool
}

func (h *hungClaims) ClaimDelivery(ctx context.Context, id int64) (bool, error) {
	if _, ok := ctx.Deadline(); !ok {
		h.unbounded.Store(true)
		return false, context.DeadlineExceeded
	}
	<-ctx.Done()
	return false, ctx.Err()
}

// TestClaimBounded: a success claim the ledger does not answer is given up within a few seconds
// and the caller is answered pending with the hash (asked again, it gets the outcome), instead of
// a request that hangs for as long as the ledger does.
func TestClaimBounded(t *testing.T) {
	hung := &hungClaims{}
	r := env.NewEngine(t, settletest.EngineOptions{Config: func(c *settle.Config) {
		hung.Store = c.Store
		c.Store = hung
	}})
	p := env.NewPay(t, env.FundedPayer(t, 100_000), 100_000)
	type result struct {
		out settle.Outcome
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, err := r.Settle(context.Background(), settletest.Decode(t, p.Body(t)))
		done <- result{out, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a claim the ledger never answers hangs the request")
	}
	if hung.unbounded.Load() {
		t.Fatal("ClaimDelivery was called without a deadline")
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("answered after %s, want within a few seconds", took)
	}
	if res.err != nil || res.out.Claimed || res.out.Response.Success || res.out.Response.ErrorReason != facilitator.ReasonSettlementPending ||
		res.out.Response.Transaction == "" {
		t.Fatalf("want settlement_pending with the hash, got %+v %v", res.out, res.err)
	}
}
