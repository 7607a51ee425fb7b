package settle

import (
	"slices"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// OpenSettlements is what this process's engine works on in one network and state: how many
// settlements, and how long ago the oldest of them was first signed. Read from the engine's own
// flights, never the ledger, so a scrape costs no query.
type OpenSettlements struct {
	Network string
	State   facilitator.State
	Count   int
	// Oldest is the age of the oldest one's first signature; 0 when Count is 0.
	Oldest time.Duration
}

// openStates are the states a flight is worked in until it resolves: before a receipt, and mined
// while it waits for finality.
var openStates = []facilitator.State{facilitator.StateSigned, facilitator.StateBroadcast, facilitator.StateMined}

// Open lists, for every network and open state (signed, broadcast, mined), the settlements this
// process holds in flight, including empty ones (Count 0), by network then state. Flights whose
// key this process lost, or that are resolving, belong to no state here.
func (e *Engine) Open() []OpenSettlements {
	now := e.now()
	e.mu.Lock()
	flights := make([]*flight, 0, len(e.flights))
	for _, f := range e.flights {
		flights = append(flights, f)
	}
	e.mu.Unlock()

	type key struct {
		network string
		state   facilitator.State
	}
	agg := map[key]*OpenSettlements{}
	var out []*OpenSettlements
	ids := make([]string, 0, len(e.networks))
	for id := range e.networks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		for _, st := range openStates {
			o := &OpenSettlements{Network: id, State: st}
			agg[key{id, st}] = o
			out = append(out, o)
		}
	}
	for _, f := range flights {
		if f.sender == nil {
			continue
		}
		f.mu.Lock()
		st, dropped, resolving := f.state, f.dropped, f.resolving
		var signed time.Time
		if len(f.txs) > 0 {
			signed = f.txs[0].signedAt
		}
		f.mu.Unlock()
		o := agg[key{f.sender.net.net.ID, st}]
		if o == nil || dropped || resolving {
			continue
		}
		o.Count++
		if !signed.IsZero() {
			o.Oldest = max(o.Oldest, now.Sub(signed))
		}
	}
	res := make([]OpenSettlements, len(out))
	for i, o := range out {
		res[i] = *o
	}
	return res
}

// openBySender counts, per key, the flights this process works that are still open (signed,
// broadcast, or mined and not yet final), those resolving included: what a retiring key has left.
func (e *Engine) openBySender() map[*sender]int {
	e.mu.Lock()
	flights := make([]*flight, 0, len(e.flights))
	for _, f := range e.flights {
		flights = append(flights, f)
	}
	e.mu.Unlock()
	out := map[*sender]int{}
	for _, f := range flights {
		f.mu.Lock()
		open := !f.dropped && slices.Contains(openStates, f.state) // mined too: a reorg may need it sent again
		f.mu.Unlock()
		if open && f.sender != nil {
			out[f.sender]++
		}
	}
	return out
}
