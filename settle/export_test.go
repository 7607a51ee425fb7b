package settle

import (
	"context"
	"fmt"
)

// What the simulator (sim_test.go, package settle_test) needs of the engine's insides.

// NewStepped builds a stepped engine (stepped_test.go): no loop runs; the simulator calls Step.
func NewStepped(cfg Config) (*Engine, error) {
	return build(cfg, func(e *Engine) runner { return &stepped{e: e} })
}

// Step is one round of every loop's work, in line.
func (e *Engine) Step(ctx context.Context) { e.run.(*stepped).step(ctx) }

// Parked is how many submissions wait for their batch to close, on every key.
func (e *Engine) Parked() int {
	k := 0
	for _, n := range e.networks {
		for _, s := range n.senders {
			s.pmu.Lock()
			k += len(s.pending)
			s.pmu.Unlock()
		}
	}
	return k
}

// Busy lists what the engine still works on: watched settlements and unknown commits.
func (e *Engine) Busy() []string {
	var out []string
	for _, n := range e.networks {
		for _, f := range e.flightsOf(n) {
			v := f.view()
			out = append(out, fmt.Sprintf("flight %d %s closing %v", v.id, v.state, v.closing))
		}
		n.unknownMu.Lock()
		for _, u := range n.unknown {
			out = append(out, fmt.Sprintf("unknown commit of %d rows", len(u.rows)))
		}
		n.unknownMu.Unlock()
	}
	return out
}
