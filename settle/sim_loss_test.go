package settle_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
)

// The ledger's loss of its newest commits (issue 26): a failover to an asynchronous standby
// promoted with the last commits missing, or a restore from a backup taken a while ago. The
// ledger goes back to a snapshot taken earlier in the run, and the engine is restarted against
// it, while the chain keeps every transaction the lost commits recorded (mined, or still in the
// pool). The oracle then holds, as always: an authorization our key's transaction used is
// transferred once, its callers are never told a terminal failure, and by the end its row is in
// the ledger (adopted), with no nonce of the key left a gap.
type simLosses struct {
	r    *rand.Rand
	on   bool
	snap *settlesim.LedgerSnapshot
	// count is how many losses the world had; before is each payment's successes answered
	// before the last one: the ledger lost the record of those claims, so the payment's success
	// can be answered once more (to a retry after the loss), as a claim whose process died.
	count  int
	before map[*simPayment]int
}

// setUpLosses draws, from a stream of its own (every other world's schedule stays as it was),
// whether the world loses commits: a third of the worlds of one engine that does not batch.
func (w *simWorld) setUpLosses(plain bool) {
	l := &w.losses
	l.r = rand.New(rand.NewPCG(w.seed, 0x1055))
	l.on = !plain && !w.replicas.on && w.network.Batch.Max == 0 && l.r.IntN(3) == 0
}

// lossStep is, now and then, a snapshot of the ledger (the backup, or where the standby is),
// and more rarely the loss of everything committed since the last one.
func (w *simWorld) lossStep() error {
	l := &w.losses
	if !l.on {
		return nil
	}
	if l.r.IntN(10) == 0 {
		l.snap = w.ledger.Snapshot()
	}
	if l.snap == nil || l.count >= 2 || l.r.IntN(30) != 0 {
		return nil
	}
	l.count++
	_ = w.engine.Stop(w.ctx)
	w.ledger.Restore(l.snap)
	l.before = map[*simPayment]int{}
	for _, p := range w.payments {
		for _, a := range p.answers {
			if a.Success {
				l.before[p]++
			}
		}
	}
	fmt.Fprintf(&w.log, "sim: the ledger lost its commits since the last snapshot; the engine restarts against it\n")
	// A start that a ledger fault fails is tried again, as a supervisor restarts the process.
	var err error
	for range 50 {
		w.engine = w.newEngine(w.config)
		if err = w.engine.Start(w.ctx); err == nil {
			return nil
		}
		fmt.Fprintf(&w.log, "sim: the engine did not start: %v\n", err)
	}
	return err
}

// nonceLost reports whether the tx nonce of our transaction h is held in the ledger by another
// settlement (h's authorization has no row).
func nonceLost(c *settlesim.Chain, rows []settlesim.LedgerRow, h common.Hash) bool {
	info, ok := c.Tx(h)
	if !ok {
		return false
	}
	for _, r := range rows {
		if s := r.Settlement; s.Signer == info.From && s.TxNonce == info.Nonce {
			return true
		}
	}
	return false
}
