package settle

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// stepped is the simulator's runner (sim_test.go), kept with the tests so that the binary holds
// no simulator code: no loop runs; the simulator calls step, which does one round of every loop's
// work on its goroutine, and every write a loop would make in the background is made in line, so
// that a run is a function of its seed. The simulator builds it (NewStepped, export_test.go).
type stepped struct {
	e *Engine
	// keepers are the lease loops, run by step in the order of the networks' keys.
	keepers []*keeper
}

// start makes the lease loops' keepers, in order; nothing else runs by itself.
func (r *stepped) start(_ context.Context, leases map[*sender]facilitator.SignerLease) {
	e := r.e
	if e.cfg.Leaser == nil {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(e.networks)) {
		for _, s := range e.networks[id].senders {
			r.keepers = append(r.keepers, &keeper{e: e, s: s, l: leases[s]})
		}
	}
}

// stop gives the keepers' leases back.
func (r *stepped) stop(context.Context) error {
	for _, k := range r.keepers {
		k.end()
	}
	r.keepers = nil
	return nil
}

// step does one round of every loop's work in line, in a fixed order: keep the leases (a lost
// one dropped before anything is sent with it), close the batches the clock closes, broadcast
// what is queued, watch, broadcast what the round queued, and write the confirmations.
func (r *stepped) step(ctx context.Context) {
	e := r.e
	for _, k := range r.keepers {
		k.step(ctx)
	}
	for _, id := range slices.Sorted(maps.Keys(e.networks)) {
		n := e.networks[id]
		for _, s := range n.senders {
			s.closeDue(ctx)
		}
		n.drainQueue(ctx)
		n.watch(ctx, true)
		n.drainQueue(ctx)
	}
	e.flushConfirms(ctx)
}

// await answers with what is known now: nothing moves while a caller waits, and the
// simulator's callers ask again.
func (r *stepped) await(ctx, waitCtx context.Context, p *facilitator.Payment, f *flight) facilitator.SettleOutcome {
	return r.e.answer(ctx, waitCtx, p, f.view())
}

func (r *stepped) pause(context.Context, time.Duration) bool { return false }

func (r *stepped) waitClosed(context.Context, <-chan struct{}, time.Duration) bool { return false }

// waitBatch waits for moved only: the simulator's clock does not move while a submission waits,
// so its batch closes when it fills, or in a step once the clock has moved past its wait
// (closeDue).
func (r *stepped) waitBatch(_ time.Duration, moved <-chan struct{}) { <-moved }

func (r *stepped) write(w func()) { w() }

func (r *stepped) mark(ctx context.Context, n *chainEngine, ids []int64) {
	n.recordBroadcasts(ctx, ids)
}

func (r *stepped) confirm(ctx context.Context, _ <-chan struct{}) { r.e.flushConfirms(ctx) }
