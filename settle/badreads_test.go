package settle_test

import (
	"context"
	"crypto/ecdsa"
	"slices"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestMinedSurvivesBadReceiptReads: once mined, a settlement's receipt reads null or fails for a
// while (a backend that has not indexed it, a timeout in a batch), past its finality depth and
// past the bump interval. Neither is evidence that its block left the chain (that block is still
// there at its height): the settlement stays mined, is never reopened, never fee-bumped, and is
// final once a good read comes back.
func TestMinedSurvivesBadReceiptReads(t *testing.T) {
	p := env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	env.ManualMining(t)
	var chain *faultChain
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: 200 * time.Millisecond, Depth: 4, Config: func(c *settle.Config) {
		chain = &faultChain{Chain: c.Networks[0].Chain}
		c.Networks[0].Chain = chain
		c.BumpAfter = 700 * time.Millisecond
		c.RebroadcastAfter = 100 * time.Millisecond
	}})
	hash := r.SettlePending(t, p.Body(t))
	env.Mine(t)
	row := waitRow(t, p.Key(), 10*time.Second, func(s *facilitator.Settlement) bool { return s.State == facilitator.StateMined })

	chain.badReceipts.Store(true)
	for range 5 {
		env.Mine(t)
	}
	// Long enough for many rounds, a bump interval, and the reads the finality check makes.
	time.Sleep(2 * time.Second)
	if got := env.Row(t, p.Key()); got.State != facilitator.StateMined || got.BlockNumber != row.BlockNumber {
		t.Fatalf("after bad receipt reads: %s, want still mined in block %d", rowString(got), row.BlockNumber)
	}
	chain.badReceipts.Store(false)
	final := waitRow(t, p.Key(), 15*time.Second, func(s *facilitator.Settlement) bool { return s.State == facilitator.StateFinal })
	if final.TxHash != hash {
		t.Fatalf("final with %s, want %s", final.TxHash, hash)
	}
	if got, want := stacktest.States(env.Events(t, row.ID)), []string{"signed", "broadcast", "mined", "final"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v: no reopening, no bump", got, want)
	}
	if raws := txsOf(t, row.ID); len(raws) != 1 {
		t.Fatalf("%d signed variants, want 1 (a bump of a mined nonce)", len(raws))
	}
}

// TestNonceCheckBehindLaggingBackend: the node calls a settlement's nonce too low because the
// settlement's own transaction is mined, while every batched read is answered by a backend two
// blocks behind (single calls by a current one). Reading the key's nonce from one backend and the
// receipts and authorization from the other would look like "a foreign transaction took the
// nonce, the authorization is unused": a re-sign, a second transaction. The pinned reads see the
// lagging backend lacks the block, decide nothing, and the settlement is mined with its one
// transaction once the reads catch up.
func TestNonceCheckBehindLaggingBackend(t *testing.T) {
	signer := env.NewSigner(t)
	p := env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	body := p.Body(t)
	env.ManualMining(t)
	first := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 500 * time.Millisecond})
	hash := first.SettlePending(t, body)
	first.Stop(context.Background())
	env.Mine(t) // ours is mined while no engine watches

	obs := &recordingObserver{}
	var chain *faultChain
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 500 * time.Millisecond, Config: func(c *settle.Config) {
		chain = &faultChain{Chain: c.Networks[0].Chain}
		chain.lagBatches.Store(2)
		c.Networks[0].Chain = chain
		c.Observer = obs
		c.RebroadcastAfter = 100 * time.Millisecond
		c.RetryInterval = 100 * time.Millisecond
	}})
	time.Sleep(2 * time.Second)
	row := env.Row(t, p.Key())
	for _, ev := range env.Events(t, row.ID) {
		if ev.State == "renonced" {
			t.Fatalf("re-signed behind a lagging backend: events %v", env.Events(t, row.ID))
		}
	}
	if n := obs.count(gap(stacktest.AddressOf(signer), settle.NonceForeign)); n != 0 {
		t.Fatalf("%d foreign re-signs reported", n)
	}
	chain.lagBatches.Store(0)
	env.Mine(t)
	mined := waitRow(t, p.Key(), 15*time.Second, func(s *facilitator.Settlement) bool { return s.State.Succeeded() })
	if mined.TxHash != hash {
		t.Fatalf("mined %s, want the first transaction %s", mined.TxHash, hash)
	}
	if raws := txsOf(t, row.ID); len(raws) != 1 {
		t.Fatalf("%d signed variants, want 1", len(raws))
	}
	if n := nonceOf(t, stacktest.AddressOf(signer), "latest"); n != 1 {
		t.Fatalf("the signer has %d mined transactions, want 1", n)
	}
	_ = r
}

// TestClosedSettlementNonceIsFilled: a settlement resolved as a failure while its transaction
// was lost (a job resolved it from the index after a third party used the authorization; the
// node dropped ours) holds a tx nonce the chain never used. The next engine on the key resends
// that transaction (it can only revert) until the nonce is used, so the key's next settlement,
// at the following nonce, is mined instead of waiting behind the gap forever.
func TestClosedSettlementNonceIsFilled(t *testing.T) {
	ctx := context.Background()
	signer := env.NewSigner(t)
	p := env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	next := env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	env.ManualMining(t)
	first := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 300 * time.Millisecond})
	ours := first.SettlePending(t, p.Body(t))
	first.Stop(context.Background())
	env.DropPool(t)
	theirs := p.SendElsewhere(t)
	env.Mine(t)
	row := env.Row(t, p.Key())
	if _, _, err := first.DB.Resolve(ctx, []facilitator.Resolution{{ID: row.ID, State: facilitator.StateSettledElsewhere, TxHash: theirs,
		ErrorReason: facilitator.ReasonNonceAlreadyUsed, ErrorMessage: "resolved from the index"}}); err != nil {
		t.Fatal(err)
	}

	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 300 * time.Millisecond, Config: func(c *settle.Config) {
		c.RetryInterval = 100 * time.Millisecond
		c.RebroadcastAfter = 200 * time.Millisecond
	}})
	if got := r.SettlePending(t, next.Body(t)); got == ours {
		t.Fatal("the next settlement reused the closed one's transaction")
	}
	deadline := time.Now().Add(15 * time.Second)
	for !env.Row(t, next.Key()).State.Succeeded() {
		if time.Now().After(deadline) {
			t.Fatalf("the key's next settlement is stuck (%s): the closed settlement's nonce %d is a gap", rowString(env.Row(t, next.Key())), row.TxNonce)
		}
		env.Mine(t)
		time.Sleep(100 * time.Millisecond)
	}
	if rc := env.Receipt(t, ours); rc == nil || rc.Status != 0 {
		t.Fatalf("the closed settlement's transaction: receipt %+v, want mined and reverted (the nonce filled)", rc)
	}
	if got := env.Row(t, p.Key()); got.State != facilitator.StateSettledElsewhere {
		t.Fatalf("the closed settlement moved: %s", rowString(got))
	}
}
