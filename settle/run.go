package settle

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// runner is how the engine's work is driven, chosen when the engine is built; nothing else in
// the package asks which. The binary's engine is live: its loops run on goroutines, the writes
// they make go off the caller's path, and callers wait for outcomes. The simulator's is stepped
// (stepped_test.go): nothing runs by itself, the simulator calls its step, every write is made in
// line, and callers are answered with what is known now, so that a run is a function of its
// seed (sim_test.go).
type runner interface {
	// start runs the engine's loops until ctx ends (Stop), with the leases Start took.
	start(ctx context.Context, leases map[*sender]facilitator.SignerLease)
	// stop awaits the loops, until ctx ends, once their context was cancelled.
	stop(ctx context.Context) error

	// await answers the caller of f, this process's settlement, within waitCtx (front.go).
	await(ctx, waitCtx context.Context, p *facilitator.Payment, f *flight) facilitator.SettleOutcome
	// pause waits d before a caller reads again what it waits for; false: it should not (waitCtx
	// ended; or the engine is stepped, where nothing moves while a caller waits).
	pause(waitCtx context.Context, d time.Duration) bool
	// waitClosed waits up to d, within ctx, for done to be closed, and reports whether it was.
	waitClosed(ctx context.Context, done <-chan struct{}, d time.Duration) bool
	// waitBatch waits for a submission's pending batch to close: until wait passes (the policy's
	// wait, by the engine's clock) or moved is closed (the batch filled or was committed).
	waitBatch(wait time.Duration, moved <-chan struct{})

	// write makes w, a loop's ledger write, off the loop's path; Stop awaits it.
	write(w func())
	// mark has the accepted broadcasts ids recorded in the ledger (markBroadcast).
	mark(ctx context.Context, n *chainEngine, ids []int64)
	// confirm has the pending confirmations of written answers written (ConfirmDelivery), and
	// returns once tried is closed (the first write of the caller's returned), or within ctx and
	// claimTimeout.
	confirm(ctx context.Context, tried <-chan struct{})
}

// live is the binary's runner: every loop on a goroutine of its own.
type live struct {
	e *Engine
	// loops are the engine's goroutines and the writes they hand off (write); they never fail,
	// each running until the run context ends, so the group is only awaited.
	loops errgroup.Group
}

func (r *live) start(ctx context.Context, leases map[*sender]facilitator.SignerLease) {
	e := r.e
	loop := func(f func(context.Context)) { r.loops.Go(func() error { f(ctx); return nil }) }
	loop(e.confirmLoop)
	for _, n := range e.networks {
		loop(n.broadcastLoop)
		loop(n.balanceLoop)
		for _, s := range n.senders {
			if e.cfg.Leaser != nil {
				k := &keeper{e: e, s: s, l: leases[s]}
				loop(func(ctx context.Context) { e.leaseLoop(ctx, k) })
			}
		}
		loop(n.watchLoop)
		loop(n.followHeads)
		loop(n.markLoop)
	}
}

func (r *live) stop(ctx context.Context) error {
	done := make(chan struct{})
	go func() { _ = r.loops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("settle: stopping the engine: %w", context.Cause(ctx))
	}
}

// await waits for f's outcome (waitOutcome).
func (r *live) await(ctx, waitCtx context.Context, p *facilitator.Payment, f *flight) facilitator.SettleOutcome {
	return r.e.waitOutcome(ctx, waitCtx, p, f)
}

func (r *live) pause(waitCtx context.Context, d time.Duration) bool {
	select {
	case <-waitCtx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (r *live) waitClosed(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

func (r *live) waitBatch(wait time.Duration, moved <-chan struct{}) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-moved:
	}
}

// write runs w in the loops' group: it is called from a loop, so the group is live, and Stop
// awaits the write.
func (r *live) write(w func()) {
	r.loops.Go(func() error { w(); return nil })
}

// mark hands ids to n's markLoop, or records them itself when markLoop is behind.
func (r *live) mark(ctx context.Context, n *chainEngine, ids []int64) {
	select {
	case n.marks <- ids:
	default:
		n.recordBroadcasts(ctx, ids)
	}
}

// confirm wakes confirmLoop, which writes a burst's confirmations in one statement, and waits
// for the caller's to be tried. A stopping engine's loop may be gone: then they are written here.
func (r *live) confirm(ctx context.Context, tried <-chan struct{}) {
	e := r.e
	if e.closed.Load() {
		e.flushConfirms(ctx)
		return
	}
	select {
	case e.confKick <- struct{}{}:
	default:
	}
	r.waitClosed(ctx, tried, claimTimeout)
}
