package settle_test

import (
	"context"
	"maps"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestSettleFeeBump: a transaction left unmined past BumpAfter is replaced by one with the same
// nonce and at least 10% higher fees, committed to the ledger before it is sent; once blocks come,
// exactly one of the variants is mined and the payment settles once.
func TestSettleFeeBump(t *testing.T) {
	ctx := context.Background()
	obs := &recordingObserver{}
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: 1500 * time.Millisecond, Config: func(c *settle.Config) {
		c.BumpAfter = 300 * time.Millisecond
		c.Observer = obs
	}})
	payer := env.FundedPayer(t, 100_000)
	p := env.NewPay(t, payer, 100_000)
	body := p.Body(t)
	env.ManualMining(t)

	out := r.MustSettle(t, body)
	if out.Response.ErrorReason != facilitator.ReasonSettlementPending || out.Response.Transaction == "" {
		t.Fatalf("with no blocks, want settlement_pending with a hash: %+v", out.Response)
	}
	// Let the engine bump at least once, then read the variants it committed.
	txs := bumped(t, r, 1)[0].Txs
	if got := inFlight(r.Engine, stacktest.AddressOf(r.Signers[0])); got != 1 {
		t.Fatalf("in flight while unmined: %d, want 1", got)
	}
	first, second := decodeTx(t, txs[0].Raw), decodeTx(t, txs[1].Raw)
	if first.Nonce() != second.Nonce() || first.Hash() == second.Hash() {
		t.Fatalf("replacement nonce %d vs %d", second.Nonce(), first.Nonce())
	}
	if second.GasTipCap().Cmp(pct(first.GasTipCap(), 110)) < 0 || second.GasFeeCap().Cmp(pct(first.GasFeeCap(), 110)) < 0 {
		t.Fatalf("replacement fees %s/%s do not beat %s/%s by 10%%", second.GasTipCap(), second.GasFeeCap(), first.GasTipCap(), first.GasFeeCap())
	}

	env.SetAutomine(t, true)
	env.Mine(t)
	final := settledPastPending(t, r, body, "after mining")
	if !final.Response.Success {
		t.Fatalf("after mining: %+v", final.Response)
	}
	mined := common.HexToHash(final.Response.Transaction)
	s, err := r.DB.SettlementByID(ctx, final.SettlementID)
	if err != nil {
		t.Fatal(err)
	}
	// The reserved gas cost follows the most expensive variant signed (gas budgets count it).
	bumped := new(big.Int).Mul(new(big.Int).SetUint64(second.Gas()), second.GasFeeCap())
	if got := gasReserved(t, final.SettlementID); got.Cmp(bumped) < 0 {
		t.Fatalf("gas reserved %s, below the replacement's %s", got, bumped)
	}
	if s.TxHash != mined || !s.State.Succeeded() {
		t.Fatalf("ledger row %+v, answer %s", s, mined)
	}
	if got := env.Balance(t, p.PayTo); got != 100_000 {
		t.Fatalf("payee holds %d, want exactly 100000", got)
	}
	if n := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "latest"); n != 1 {
		t.Fatalf("signer nonce %d: the variants must share one nonce", n)
	}
	if got := inFlight(r.Engine, stacktest.AddressOf(r.Signers[0])); got != 0 {
		t.Errorf("in flight once mined: %d, want 0", got)
	}
	// Every replacement committed before mining was observed as a bump, on this network.
	if bumps := obs.count("bump " + env.Network().ID); bumps < len(txs)-1 {
		t.Errorf("observed %d fee bumps; the ledger held %d variants", bumps, len(txs))
	}
}

// bumped waits up to 10 s until the open settlements of r's first key are rows many, the first
// of them holding a replacement (two variants or more) committed by a fee bump; it returns them.
func bumped(t *testing.T, r *stacktest.Engine, rows int) []facilitator.OpenSettlement {
	t.Helper()
	var open []facilitator.OpenSettlement
	waitFor(t, 10*time.Second, "a replacement is committed", func() bool {
		var err error
		if open, err = r.DB.OpenSettlements(context.Background(), env.Network().ID, stacktest.AddressOf(r.Signers[0])); err != nil {
			t.Fatal(err)
		}
		return len(open) == rows && len(open[0].Txs) >= 2
	})
	return open
}

// recordingObserver counts what the engine reports, and keeps each loop's last beat.
type recordingObserver struct {
	mu     sync.Mutex
	events map[string]int
	beats  map[string]time.Time // "loop network" -> the beat's time
}

func (o *recordingObserver) Beat(loop, network string, at time.Time) {
	o.add("beat " + loop + " " + network)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.beats == nil {
		o.beats = map[string]time.Time{}
	}
	o.beats[loop+" "+network] = at
}

func (o *recordingObserver) lastBeat(loop, network string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.beats[loop+" "+network]
}

func (o *recordingObserver) FeeBumped(network string) { o.add("bump " + network) }
func (o *recordingObserver) Adopted(network, signer string) {
	o.add("adopted " + network + " " + signer)
}

func (o *recordingObserver) NonceGap(network, signer, kind string) {
	o.add("gap " + network + " " + signer + " " + kind)
}

func (o *recordingObserver) Disagreement(network string) { o.add("disagreement " + network) }

func (o *recordingObserver) add(k string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.events == nil {
		o.events = map[string]int{}
	}
	o.events[k]++
}

func (o *recordingObserver) snapshot() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.events)
}

func (o *recordingObserver) count(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.events[k]
}

// await waits up to within until k has been reported at least n times.
func (o *recordingObserver) await(t testing.TB, k string, n int, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); o.count(k) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%q reported %d times in %s, want %d; observer saw %v", k, o.count(k), within, n, o.snapshot())
		}
	}
}

// gap is what the observer records for a nonce gap of kind on signer's key on the env's network.
func gap(signer common.Address, kind string) string {
	return "gap " + env.Network().ID + " " + signer.Hex() + " " + kind
}

// TestSettleCapacity: when every signer has MaxInFlightPerSigner unmined transactions, a new
// payment is refused as unavailable (503 with Retry-After at the API) and nothing is sent for it.
func TestSettleCapacity(t *testing.T) {
	ctx := context.Background()
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: time.Second, Config: func(c *settle.Config) { c.MaxInFlightPerSigner = 1 }})
	first, second := env.NewPay(t, env.FundedPayer(t, 1000), 1000), env.NewPay(t, env.FundedPayer(t, 1000), 1000)
	b1, b2 := first.Body(t), second.Body(t)
	env.ManualMining(t)

	out, err := r.SettleBody(ctx, t, b1)
	if err != nil || out.Response.ErrorReason != facilitator.ReasonSettlementPending {
		t.Fatalf("first: %+v %v", out.Response, err)
	}
	_, err = r.SettleBody(ctx, t, b2)
	if facilitator.ErrorCode(err) != facilitator.EUnavailable || facilitator.ErrorReason(err, "") != facilitator.ReasonSettlerBusy {
		t.Fatalf("second, with the only signer full: want unavailable %s, got %v", facilitator.ReasonSettlerBusy, err)
	}
	if n := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "pending"); n != 1 {
		t.Fatalf("pending nonce %d: the refused payment must send nothing", n)
	}
	env.Mine(t)
	env.SetAutomine(t, true)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, err = r.SettleBody(ctx, t, b2); err == nil {
			break
		}
	}
	if err != nil || !out.Response.Success {
		t.Fatalf("second, once the first is mined: %+v %v", out.Response, err)
	}
}

// inFlight is a signer's in-flight count as the engine reports it.
func inFlight(e *settle.Engine, signer common.Address) int {
	for _, st := range e.Signers() {
		if st.Network == env.Network().ID && st.Address == signer {
			return st.InFlight
		}
	}
	return -1
}
