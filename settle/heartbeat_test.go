package settle_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// skewedClock is the wall clock moved by an offset a test sets, so that ages can be asserted
// without sleeping them.
type skewedClock struct{ offset atomic.Int64 }

func (c *skewedClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *skewedClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// TestLoopsBeat: the watcher, the broadcaster (idle: it has nothing to send) and the balance loop
// each report a beat for the network at the engine's clock, and the balance reading carries the
// time it was read at, so a stuck loop or a stale reading shows as an age.
func TestLoopsBeat(t *testing.T) {
	obs := &recordingObserver{}
	clock := &skewedClock{}
	clock.advance(24 * time.Hour) // the engine's clock, not the wall's, stamps the beats
	r := env.NewEngine(t, stacktest.EngineOptions{Config: func(c *settle.Config) {
		c.Observer, c.Now, c.BalanceInterval = obs, clock.now, 50*time.Millisecond
	}})
	id := env.Network().ID
	for _, loop := range []string{settle.LoopWatch, settle.LoopBroadcast, settle.LoopBalance} {
		obs.await(t, "beat "+loop+" "+id, 2, 10*time.Second)
		if at := obs.lastBeat(loop, id); at.Before(time.Now().Add(23 * time.Hour)) {
			t.Errorf("loop %s beat at %v, not on the engine's clock", loop, at)
		}
	}
	sig := r.Engine.Signers()
	if len(sig) != 1 || sig[0].Balance == nil {
		t.Fatalf("signers %+v, want one with its balance read", sig)
	}
	if at := sig[0].BalanceReadAt; at.Before(time.Now().Add(23 * time.Hour)) {
		t.Errorf("balance read at %v, want the engine's clock", at)
	}
}

// TestOpenSettlements: a settlement the chain has not mined is open as broadcast, aged from its
// signature on the engine's clock; once mined it is open as mined until final, then nothing is.
func TestOpenSettlements(t *testing.T) {
	payer := env.FundedPayer(t, 1000) // minted while anvil still mines by itself
	env.ManualMining(t)
	clock := &skewedClock{}
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: time.Second, Depth: 3, Config: func(c *settle.Config) {
		c.Now = clock.now
		// The clock jumps below; nothing should be bumped or resent for it.
		c.BumpAfter, c.RebroadcastAfter = 1000*time.Hour, 1000*time.Hour
	}})
	id := env.Network().ID
	open := func() map[facilitator.State]settle.OpenSettlements {
		out := map[facilitator.State]settle.OpenSettlements{}
		for _, o := range r.Open() {
			if o.Network != id {
				t.Fatalf("open settlements of network %q, want only %s", o.Network, id)
			}
			out[o.State] = o
		}
		if len(out) != 3 {
			t.Fatalf("open settlements by state %+v, want signed, broadcast and mined", out)
		}
		return out
	}
	if o := open(); o[facilitator.StateSigned].Count+o[facilitator.StateBroadcast].Count+o[facilitator.StateMined].Count != 0 {
		t.Fatalf("open before any settlement: %+v", o)
	}

	p := env.NewPay(t, payer, 1000)
	r.SettlePending(t, p.Body(t))
	for deadline := time.Now().Add(10 * time.Second); open()[facilitator.StateBroadcast].Count != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pending settlement is not open as broadcast: %+v", open())
		}
	}
	clock.advance(time.Hour)
	if b := open()[facilitator.StateBroadcast]; b.Oldest < time.Hour || b.Oldest > time.Hour+time.Minute {
		t.Errorf("oldest broadcast settlement %v old, want an hour and the test's few seconds", b.Oldest)
	}

	env.Mine(t)
	for deadline := time.Now().Add(10 * time.Second); open()[facilitator.StateMined].Count != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the mined settlement is not open as mined: %+v", open())
		}
	}
	if o := open(); o[facilitator.StateBroadcast].Count != 0 || o[facilitator.StateBroadcast].Oldest != 0 {
		t.Errorf("still broadcast once mined: %+v", o)
	}
	env.Mine(t)
	env.Mine(t)
	for deadline := time.Now().Add(10 * time.Second); open()[facilitator.StateMined].Count != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the final settlement is still open: %+v", open())
		}
	}
}
