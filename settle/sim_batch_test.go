package settle_test

import (
	"fmt"
	"math/big"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
)

// TestSimulationBatched runs seeds on a network that batches (up to 2..8 settlements per
// Multicall3 transaction, closed by the engine's clock): rounds of concurrent settlements whose
// batches close full or once the clock passes their wait, with a third party using a member's
// authorization first, members expiring before their batch is mined, a transaction of one of our
// keys that the engine did not sign taking a batch's nonce (its members still valid re-signed as a
// new batch), reorganisations and dropped pools between them; then every invariant is checked per seed, as TestSimulation does (one
// transfer per authorization, exactly one success for a transfer of ours, a ledger row for each,
// every outcome the chain's, no nonce gap). The nodes and the ledger answer without faults: the
// callers of a closed batch go on concurrently, and faults drawn from the seed's stream in their
// goroutines would make a seed's run depend on the scheduler.
func TestSimulationBatched(t *testing.T) {
	seeds := uint64(30)
	if raceEnabled {
		seeds = 8
	}
	if *simSeed != 0 {
		seeds = 1
	}
	var total simStats
	var batching batchStats
	for i := range seeds {
		seed := 1 + i
		if *simSeed != 0 {
			seed = *simSeed
		}
		w := newSimWorldWith(seed, facilitator.BatchPolicy{Max: 2 + int(seed%7), Wait: 2 * time.Second})
		err := w.runBatched()
		total.add(w.stats)
		batching.greedy, batching.resettled = batching.greedy+w.batching.greedy, batching.resettled+w.batching.resettled
		if err != nil || *simSeed != 0 {
			t.Logf("engine log of seed %d:\n%s", seed, w.logTail())
		}
		if err != nil {
			t.Fatalf("seed %d (batches of %d): %v\nreplay: go test ./settle -run TestSimulationBatched -sim.seed %d -v", seed, w.network.Batch.Max, err, seed)
		}
	}
	t.Logf("%d batched seeds: %s", seeds, total)
	if *simSeed == 0 && (total.foreign == 0 || total.resigned == 0) {
		t.Fatalf("no seed had a foreign transaction take a batch's nonce and the batch re-signed (%d foreign, %d re-signed)", total.foreign, total.resigned)
	}
	t.Logf("%d greedy payers, %d settlements settled again alone", batching.greedy, batching.resettled)
	if *simSeed == 0 && (batching.greedy == 0 || batching.resettled == 0) {
		t.Fatalf("no seed had a batch sunk by a greedy payer and a member settled again alone (%d greedy, %d settled again)", batching.greedy, batching.resettled)
	}
}

// batchCalls are the world's /settle calls in flight: a batched settlement's call waits for its
// batch to close, so calls run in goroutines, and the world moves on only once each has returned
// or is parked in a batch (callers of a closed batch return without any further draw from the
// seed's stream).
type batchCalls struct {
	w        *simWorld
	mu       sync.Mutex
	firstErr error // under mu
	launched atomic.Int64
	returned atomic.Int64
}

// settle starts one merchant's /settle of p and waits until it returned or is parked.
func (c *batchCalls) settle(p *simPayment) {
	c.w.stats.settles++
	c.launched.Add(1)
	go func() {
		defer c.returned.Add(1)
		out, err := c.w.engine.Settle(c.w.ctx, p.p)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.count(out.Response, err)
		if err == nil {
			p.answers = append(p.answers, out.Response)
		}
	}()
	c.settleDown()
}

// count adds an answer to the world's stats. Caller holds mu.
func (c *batchCalls) count(res facilitator.SettleResponse, err error) {
	switch {
	case err != nil:
		c.w.stats.errors++
		if c.firstErr == nil {
			c.firstErr = err
		}
	case res.Success:
		c.w.stats.successes++
	case res.ErrorReason == facilitator.ReasonSettlementPending:
		c.w.stats.pending++
	default:
		c.w.stats.refused++
	}
}

// settleDown waits until every call has returned or waits for its batch.
func (c *batchCalls) settleDown() {
	for c.launched.Load()-c.returned.Load() != int64(c.w.engine.Parked()) {
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond)
	}
}

// closeAll advances the clock past the batch wait and steps until no call is left waiting.
func (c *batchCalls) closeAll() {
	for c.launched.Load() != c.returned.Load() {
		c.w.clock.Advance(c.w.network.Batch.Wait)
		c.w.engine.Step(c.w.ctx)
		c.settleDown()
	}
}

func (w *simWorld) runBatched() error {
	if err := w.engine.Start(w.ctx); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer w.engine.Stop(w.ctx)
	calls := &batchCalls{w: w}
	rounds := 6 + w.r.IntN(6)
	for range rounds {
		var round []*simPayment
		for range 1 + w.r.IntN(w.network.Batch.Max+2) {
			p := w.newPayment()
			if w.r.IntN(6) == 0 {
				// Expires before its batch is mined (verify takes it: 6 s is its margin).
				p.p.Authorization.ValidBefore = big.NewInt(w.clock.Now().Unix() + 8)
			}
			round = append(round, p)
			calls.settle(p)
		}
		switch x := w.r.IntN(10); {
		case x < 2:
			// A third party uses a parked member's authorization first.
			a := round[w.r.IntN(len(round))].p
			if _, err := w.chain.ThirdPartyTransfer(eip3009.TransferCalldata(a.Authorization, eip3009.SettlementSignature(a.Signature))); err == nil {
				w.stats.thirdParty++
			}
		case x < 3:
			if _, err := w.chain.Reorg(1+w.r.IntN(int(w.depth-1)), settlesim.ReorgToPool); err == nil {
				w.stats.reorgs++
			}
		}
		calls.closeAll()
		var greedy *common.Address
		if w.r.IntN(5) == 0 {
			// A member's payer gets code whose answer to the token's signature check burns the
			// gas (an EOA delegating with EIP-7702 after verify): its batch runs out of gas, and
			// the others must be settled again alone, for this round's blocks.
			a := round[w.r.IntN(len(round))].p.Authorization.From
			w.chain.SetGreedy(a, true)
			greedy = &a
			w.batching.greedy++
		}
		if w.r.IntN(4) == 0 {
			// The key used elsewhere: a transaction of one of our keys that the engine did not
			// sign, at the key's next mined nonce, takes the slot of the batch just signed there
			// (or of a lone settlement, or nothing of ours) in the pool.
			k := w.signers[w.r.IntN(len(w.signers))]
			nonce := w.chain.Nonce(crypto.PubkeyToAddress(k.PublicKey))
			if _, err := w.chain.SubmitForeign(settlesim.ForeignTx{Key: k, Nonce: &nonce, Force: true}); err == nil {
				w.stats.foreign++
			}
		}
		for range 1 + w.r.IntN(3) {
			w.clock.Advance(time.Duration(1+w.r.IntN(5)) * time.Second)
			if w.r.IntN(8) == 0 {
				w.chain.DropPool()
				w.stats.drops++
			}
			w.chain.Mine()
			w.stats.mines++
			w.engine.Step(w.ctx)
			// The second process (reconcile, status) and the adversaries, on streams of their
			// own, while every call is parked or returned.
			if err := w.jobsStep(); err != nil {
				return err
			}
			w.adversaryStep()
		}
		if greedy != nil {
			w.chain.SetGreedy(*greedy, false)
		}
	}
	// The end: time past every validBefore, until nothing is left to do; the merchants retry.
	if err := w.settleDown(); err != nil {
		return err
	}
	for _, p := range w.payments {
		calls.settle(p) // the honest final retry: an unanswered success is owed to it
	}
	calls.closeAll()
	if calls.firstErr != nil {
		fmt.Fprintf(&w.log, "first /settle error: %v\n", calls.firstErr)
	}
	if err := w.checkInvariants(); err != nil {
		return err
	}
	w.stats.jobRuns, w.stats.statusChecks, w.stats.statusLagged = w.jobsSide.runs, w.jobsSide.statusChecks, w.jobsSide.statusLagged
	w.stats.drains = w.adversaries.drains
	w.providerStats()
	return w.checkStatusAtEnd()
}

// batchStats are the batched seeds' counts beyond simStats: greedy, payers given code that sinks
// the batch they are in; resettled, settlements mined by a lone transaction after a batch of
// theirs was mined without paying them.
type batchStats struct{ greedy, resettled int }

// renonced reports whether the row's settlement moved to another tx nonce (re-signed, or settled
// again alone after its batch).
func renonced(r settlesim.LedgerRow) bool {
	for _, ev := range r.Events {
		if ev.State == "renonced" {
			return true
		}
	}
	return false
}
