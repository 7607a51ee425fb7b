package settle_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// hungClaims is the ledger with a ClaimDelivery that never answers: it returns only when its
// context ends (at once, when that context has no deadline, so that a missing bound fails the
// test instead of hanging it).
type hungClaims struct {
	settle.Store
	unbounded atomic.Bool
}

func (h *hungClaims) ClaimDelivery(ctx context.Context, id int64, keyID string, claim []byte, lease time.Duration) (bool, error) {
	if _, ok := ctx.Deadline(); !ok {
		h.unbounded.Store(true)
		return false, context.DeadlineExceeded
	}
	<-ctx.Done()
	return false, ctx.Err()
}

// Resolve records the outcomes without their claims, as for a caller that came after the outcome
// was written: the caller then claims with a statement of its own, the one that hangs.
func (h *hungClaims) Resolve(ctx context.Context, rs []facilitator.Resolution) ([]int64, []int64, error) {
	stripped := make([]facilitator.Resolution, len(rs))
	for i, r := range rs {
		r.Claim = nil
		stripped[i] = r
	}
	return h.Store.Resolve(ctx, stripped)
}

// TestClaimBounded: a success claim the ledger does not answer is given up within a few seconds
// and the caller is answered pending with the hash (asked again, it gets the outcome), instead of
// a request that hangs for as long as the ledger does.
func TestClaimBounded(t *testing.T) {
	hung := &hungClaims{}
	r := env.NewEngine(t, stacktest.EngineOptions{Config: func(c *settle.Config) {
		hung.Store = c.Store
		c.Store = hung
	}})
	p := env.NewPay(t, env.FundedPayer(t, 100_000), 100_000)
	type result struct {
		out facilitator.SettleOutcome
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, err := r.Settle(context.Background(), stacktest.Decode(t, p.Body(t)))
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

// TestSuccessBelongsToKey: the payload of a settlement is public once its transaction is (the
// fingerprint can be rebuilt from the calldata), so a caller with another API key, or an open-mode
// caller, racing the merchant's retry must not take its success: it gets already_settled with the
// hash, and the creating key's retry after settlement_pending still gets the success. A settlement
// made in open mode is no keyed caller's either.
func TestSuccessBelongsToKey(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 2_000_000) // minted while anvil still mines
	keyed, open := env.NewPay(t, payer, 1_000_000), env.NewPay(t, payer, 1_000_000)
	env.ManualMining(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: time.Second})
	settleAs := func(p stacktest.Pay, keyID string) facilitator.SettleOutcome {
		t.Helper()
		d := stacktest.Decode(t, p.Body(t))
		d.KeyID, d.IDScope = keyID, keyID
		out, err := r.Settle(ctx, d)
		if err != nil {
			t.Fatalf("settle as %q: %v", keyID, err)
		}
		return out
	}
	alreadySettled := func(what string, out facilitator.SettleOutcome, hash string) {
		t.Helper()
		if res := out.Response; res.Success || out.Claimed || res.ErrorReason != facilitator.ReasonAlreadySettled || res.Transaction != hash {
			t.Fatalf("%s: want already_settled with %s, got %+v (claimed %v)", what, hash, res, out.Claimed)
		}
	}

	first := settleAs(keyed, "key_a")
	if first.Response.ErrorReason != facilitator.ReasonSettlementPending || first.Response.Transaction == "" {
		t.Fatalf("key A first: want settlement_pending with a hash, got %+v", first.Response)
	}
	hash := first.Response.Transaction
	openFirst := settleAs(open, "")
	if openFirst.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("open mode first: want settlement_pending, got %+v", openFirst.Response)
	}
	env.Mine(t)

	alreadySettled("key B, same payload", settleAs(keyed, "key_b"), hash)
	alreadySettled("open mode, same payload", settleAs(keyed, ""), hash)
	if s, err := r.DB.SettlementByID(ctx, first.SettlementID); err != nil || s.Delivered {
		t.Fatalf("after the other callers: %+v %v; want the success still owed", s, err)
	}
	mine := settleAs(keyed, "key_a")
	if !mine.Response.Success || !mine.Claimed || mine.Response.Transaction != hash {
		t.Fatalf("key A's retry: want its success with %s, got %+v (claimed %v)", hash, mine.Response, mine.Claimed)
	}
	alreadySettled("key A again", settleAs(keyed, "key_a"), hash)

	alreadySettled("key A, an open-mode settlement", settleAs(open, "key_a"), openFirst.Response.Transaction)
	if got := settleAs(open, ""); !got.Response.Success || !got.Claimed {
		t.Fatalf("the open-mode retry: want its success, got %+v", got.Response)
	}
}

// slowResolve is the ledger with an outcome write that takes longer than the caller waits.
type slowResolve struct {
	settle.Store
	delay time.Duration
}

func (s *slowResolve) Resolve(ctx context.Context, rs []facilitator.Resolution) ([]int64, []int64, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	return s.Store.Resolve(ctx, rs)
}

// TestCarriedClaimOfGoneCaller: a waiting caller's claim rides on the watcher's outcome write; a
// caller whose wait ends while that write runs is answered pending, and the claim the write then
// records is given back, so that the success goes to the caller's retry rather than to nobody
// (invariant 4).
func TestCarriedClaimOfGoneCaller(t *testing.T) {
	ctx := context.Background()
	slow := &slowResolve{delay: 2500 * time.Millisecond}
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: time.Second, Config: func(c *settle.Config) {
		slow.Store = c.Store
		c.Store = slow
	}})
	body := env.NewPay(t, env.FundedPayer(t, 100_000), 100_000).Body(t)
	first, err := r.Settle(ctx, stacktest.Decode(t, body))
	if err != nil || first.Claimed || first.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("first answer: want settlement_pending, got %+v %v", first, err)
	}
	// The write lands after the caller left: mined, and the success not delivered to anyone.
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := r.DB.SettlementByID(ctx, first.SettlementID)
		if err != nil {
			t.Fatal(err)
		}
		if s.State.Succeeded() && !s.Delivered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("settlement %+v: want mined with its success still owed (the gone caller's claim released)", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	retry, err := r.Settle(ctx, stacktest.Decode(t, body))
	if err != nil || !retry.Claimed || !retry.Response.Success {
		t.Fatalf("the retry: want the success, got %+v %v", retry, err)
	}
}

// TestUndecidedClaim: a success claimed for a caller whose answer is not written yet is undecided,
// not answered: another process's retry of the same payload waits for it within its deadline and
// is told settlement_pending (never already_settled) until the answer is confirmed written, then
// already_settled. A claim never confirmed (its process died between the claim and the answer)
// goes, once its lease ends, to the next identical request, which waits for that within its
// deadline, and the ledger counts the takeover.
func TestUndecidedClaim(t *testing.T) {
	ctx := context.Background()
	lease := func(d, deadline time.Duration) stacktest.EngineOptions {
		return stacktest.EngineOptions{Deadline: deadline, Config: func(c *settle.Config) { c.ClaimLease = d }}
	}
	first := env.NewEngine(t, lease(time.Minute, 0))
	// Another process on the same ledger; its callers wait for an undecided claim 300 ms.
	other := env.NewEngine(t, lease(time.Minute, 300*time.Millisecond))
	settleRaw := func(r *stacktest.Engine, body []byte) facilitator.SettleOutcome {
		t.Helper()
		out, err := r.Engine.Settle(ctx, stacktest.Decode(t, body)) // not confirmed: the answer is not written yet
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	want := func(what string, out facilitator.SettleOutcome, reason, hash string) {
		t.Helper()
		if res := out.Response; res.Success || out.Claimed || res.ErrorReason != reason || res.Transaction != hash {
			t.Fatalf("%s: want %s with %s, got %+v (claimed %v)", what, reason, hash, res, out.Claimed)
		}
	}

	t.Run("answered", func(t *testing.T) {
		body := env.NewPay(t, env.FundedPayer(t, 100_000), 100_000).Body(t)
		out := settleRaw(first, body)
		if !out.Claimed || !out.Response.Success {
			t.Fatalf("first: want the claimed success, got %+v", out)
		}
		hash := out.Response.Transaction
		want("another process, the answer unwritten", settleRaw(other, body), facilitator.ReasonSettlementPending, hash)
		if err := first.ConfirmDelivery(ctx, out); err != nil {
			t.Fatal(err)
		}
		want("another process, the answer written", settleRaw(other, body), facilitator.ReasonAlreadySettled, hash)
		want("the same process, the answer written", settleRaw(first, body), facilitator.ReasonAlreadySettled, hash)
		if s, err := first.DB.SettlementByID(ctx, out.SettlementID); err != nil || !s.Delivered || s.ClaimTakeovers != 0 {
			t.Fatalf("settlement: %+v %v; want delivered, nothing taken over", s, err)
		}
	})

	t.Run("died before the answer", func(t *testing.T) {
		dying := env.NewEngine(t, lease(time.Second, 0))
		patient := env.NewEngine(t, lease(time.Minute, 0)) // its callers wait up to 20 s
		body := env.NewPay(t, env.FundedPayer(t, 100_000), 100_000).Body(t)
		out := settleRaw(dying, body)
		if !out.Claimed || !out.Response.Success {
			t.Fatalf("first: want the claimed success, got %+v", out)
		}
		if err := dying.Stop(ctx); err != nil { // dies: its answer is never written nor its claim given back
			t.Fatal(err)
		}
		hash := out.Response.Transaction
		// A retry within the lease, answered within its deadline: the success, once the lease
		// ended (the official resource server retries a pending answer once, at once).
		got := settleRaw(patient, body)
		if !got.Claimed || !got.Response.Success || got.Response.Transaction != hash {
			t.Fatalf("the retry: want the success with %s, got %+v (claimed %v)", hash, got.Response, got.Claimed)
		}
		if err := patient.ConfirmDelivery(ctx, got); err != nil {
			t.Fatal(err)
		}
		want("a retry after the success", settleRaw(other, body), facilitator.ReasonAlreadySettled, hash)
		if s, err := other.DB.SettlementByID(ctx, out.SettlementID); err != nil || !s.Delivered || s.ClaimTakeovers != 1 {
			t.Fatalf("settlement: %+v %v; want delivered, the dead claim's takeover counted", s, err)
		}
	})
}
