package settle_test

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// simRetiring is a world of replicas with two keys in which the operator retires the first key
// partway through the schedule: every replica restarts with it in NetworkConfig.Retiring (a
// rolling restart would mix configurations; the docs ask for the same list everywhere). From then
// on no new settlement is signed with it, what it had open is worked to the end (by whichever
// replica holds it), and at the end its holder reports it drained.
type simRetiring struct {
	on   bool
	at   int            // the step it retires at
	key  common.Address // the key retired
	done bool
	// lastID is the highest settlement id when it retired: every later one is another key's.
	lastID int64
	// open is how many settlements the key had open then.
	open int
}

// setUpRetiring decides whether the world retires a key, from a stream of its own (every other
// world, and every regression seed, stays as it was).
func (w *simWorld) setUpRetiring() {
	r := rand.New(rand.NewPCG(w.seed, 0x2e71))
	if !w.replicas.on || len(w.signers) < 2 || r.IntN(2) != 0 {
		return
	}
	w.retiring = simRetiring{on: true, at: r.IntN(120), key: crypto.PubkeyToAddress(w.signers[0].PublicKey)}
}

// retireStep retires the key at its step: every replica ends (as a crash: its claims and flights
// are the next holder's, as after any crash) and comes back with the key retiring.
func (w *simWorld) retireStep(step int) {
	rt := &w.retiring
	if !rt.on || rt.done || step != rt.at {
		return
	}
	rt.done = true
	for _, r := range w.ledger.Rows() {
		rt.lastID = max(rt.lastID, r.Settlement.ID)
		if st := r.Settlement.State; r.Settlement.Signer == rt.key && (st.Open() || st == facilitator.StateMined) {
			rt.open++
		}
	}
	w.config.Networks = slices.Clone(w.config.Networks)
	w.config.Networks[0].Retiring = []common.Address{rt.key}
	fmt.Fprintf(&w.log, "sim: retiring signer %s (%d settlements open on it)\n", rt.key, rt.open)
	for _, rp := range w.replicas.all {
		if rp.engine != nil {
			w.crash(rp)
		}
	}
	for _, rp := range w.replicas.all {
		w.restart(rp) // one that does not start comes back in a later step, retiring the key too
	}
}

// checkRetiring holds the retirement's promises at the end: no settlement after it on the key,
// every one of the key's settled down (the world's end checks that nothing is open), and the
// key's holder reporting it retiring with nothing open.
func (w *simWorld) checkRetiring() error {
	rt := &w.retiring
	if !rt.done {
		return nil
	}
	w.stats.retired++
	w.stats.retiredOpen += rt.open
	for _, r := range w.ledger.Rows() {
		if s := r.Settlement; s.ID > rt.lastID && s.Signer == rt.key {
			return fmt.Errorf("settlement %d was signed with %s after it retired (the last before: %d)", s.ID, rt.key, rt.lastID)
		}
	}
	for _, e := range w.engines() {
		for _, s := range e.Signers() {
			if s.Address != rt.key {
				if s.Retiring {
					return fmt.Errorf("signer %s reports retiring; only %s retired", s.Address, rt.key)
				}
				continue
			}
			if !s.Retiring || (s.Leased && s.Open != 0) {
				return fmt.Errorf("the retired signer at the end: %+v, want retiring and drained", s)
			}
		}
	}
	return nil
}
