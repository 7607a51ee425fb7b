// Package indexer follows a chain and stores the Transfer, AuthorizationUsed and
// AuthorizationCanceled logs of the configured tokens in Postgres: the facilitator's memory of
// the chain (ARCHITECTURE.md invariant 6). It backfills with adaptive eth_getLogs ranges written with COPY,
// follows new heads (WebSocket subscription, polling fallback), and detects reorgs by parent hash,
// rolling back to the common ancestor and indexing the new branch in one transaction.
package indexer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"golang.org/x/sync/errgroup"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// ErrDeepReorg stops a network's indexer: the chain reorganised below the kept window, so what is
// indexed cannot be reconciled automatically.
var ErrDeepReorg = errors.New("indexer: reorg deeper than the unfinalized window")

// Observer hears what the indexer does that operators count (metrics); it must not block.
type Observer interface {
	// Reorg: the indexer rolled depth blocks back to a common ancestor and indexed the new branch.
	Reorg(network string, depth uint64)
	// Beat: loop (LoopIndexer) finished a step on network at at, as the network's leader. A
	// stuck indexer stops beating; its lag, a reading it would have to update, could not say so.
	Beat(loop, network string, at time.Time)
}

// LoopIndexer is the indexer's loop, as it beats.
const LoopIndexer = "indexer"

// Config configures one network's indexer.
type Config struct {
	Network string // CAIP-2
	Tokens  []common.Address
	Chain   ethrpc.Chain
	// Heads, when set, hurries the indexer to each new head the network's subscription announces;
	// the indexer polls every PollInterval regardless.
	Heads Heads
	Store Store
	// StartBlock is where indexing begins on an empty database.
	StartBlock uint64
	// Finality is the network's rule (facilitator.Network.Finality): blocks at or below the
	// node's tagged block, or at least Depth deep (the head counts as one), are final; above them,
	// and for a window below, the indexer keeps block hashes to detect reorgs.
	Finality facilitator.Finality
	// InitialRange and MaxRange size eth_getLogs block ranges during backfill.
	InitialRange, MaxRange uint64
	PollInterval           time.Duration
	RPCTimeout             time.Duration
	Logger                 *slog.Logger
	Now                    func() time.Time
	// Observer hears reorgs and the leader's steps; nil: nobody.
	Observer Observer
}

// Indexer indexes one network.
type Indexer struct {
	cfg    Config
	log    *slog.Logger
	sizer  *rangeSizer
	window uint64

	// Health, for logs and metrics.
	head, cursor  atomic.Uint64
	reorgs        atomic.Int64
	leader        atomic.Bool
	eventsIndexed atomic.Int64
	stopped       atomic.Bool   // the loop gave up (ErrDeepReorg): an operator must step in
	rangeSize     atomic.Uint64 // the sizer's size, for Health (the sizer is the leader's alone)
	checkedCursor bool          // the resumed cursor was found canonical (leader's alone)
	// final is the highest block known final (finalKnown: one is), and finalFloor the highest
	// tagged block a node answered consistently: kept blocks are pruned only below final
	// (leader's alone).
	final      uint64
	finalKnown bool
	finalFloor facilitator.FinalityFloor

	// The loop's lifetime: Stop cancels it with facilitator.ErrClosed as the cause and awaits it.
	mu      sync.Mutex
	stopRun context.CancelCauseFunc
	closed  bool
	loops   errgroup.Group
	done    chan struct{} // closed when the loop has ended (Stop, or ErrDeepReorg)
	runErr  error         // the loop's error, set before done closes

	// Backfill progress, owned by the leading goroutine.
	progressAt     time.Time
	progressBlock  uint64
	progressEvents int64
}

// New builds an indexer.
func New(cfg Config) *Indexer {
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = 10 * time.Second
	}
	if cfg.Finality.Depth == 0 {
		cfg.Finality.Depth = 1
	}
	if cfg.InitialRange == 0 {
		cfg.InitialRange = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ix := &Indexer{
		cfg:    cfg,
		log:    cfg.Logger.With("network", cfg.Network, "component", "indexer"),
		sizer:  newRangeSizer(cfg.InitialRange, cfg.MaxRange),
		window: max(2*cfg.Finality.Depth, 128),
		done:   make(chan struct{}),
	}
	ix.rangeSize.Store(ix.sizer.size)
	return ix
}

// Health is the indexer's state for operators and metrics: leadership, progress, reorgs.
type Health struct {
	Leader bool
	// Stopped: the indexer gave up on a reorg deeper than its window and indexes nothing more.
	Stopped    bool
	Subscribed bool
	Head       uint64
	Cursor     uint64
	Lag        uint64
	Reorgs     int64
	Events     int64
	RangeSize  uint64
}

// Health reports the indexer's state.
func (ix *Indexer) Health() Health {
	h, c := ix.head.Load(), ix.cursor.Load()
	var lag uint64
	if h > c {
		lag = h - c
	}
	// Only the leader follows heads.
	subscribed := ix.leader.Load() && ix.cfg.Heads != nil && ix.cfg.Heads.Subscribed()
	return Health{Leader: ix.leader.Load(), Stopped: ix.stopped.Load(), Subscribed: subscribed, Head: h, Cursor: c, Lag: lag,
		Reorgs: ix.reorgs.Load(), Events: ix.eventsIndexed.Load(), RangeSize: ix.rangeSize.Load()}
}

// errStopped and errLagging are what Ready reports: their text is the state /readyz shows.
var (
	errStopped = errors.New("stopped")
	errLagging = errors.New("lagging")
)

// Ready reports whether the index can be relied on: nil when the indexer runs and, if this
// process leads it, is within maxLag blocks of the head (maxLag 0: any lag). A replica that does
// not lead is ready: the leader elsewhere keeps the index, and this process takes over if it
// goes. Ready reads counters only.
func (ix *Indexer) Ready(maxLag uint64) error {
	st := ix.Health()
	switch {
	case st.Stopped:
		return errStopped
	case st.Leader && maxLag > 0 && st.Lag > maxLag:
		return fmt.Errorf("%w: %d blocks behind the head (at most %d)", errLagging, st.Lag, maxLag)
	}
	return nil
}

// Start runs the indexer in the background until Stop. Only the process holding the network's
// lease indexes; the others wait to take over. A reorg deeper than the window stops it on its own
// (Done, Err: ErrDeepReorg). After Stop it answers facilitator.ErrClosed.
func (ix *Indexer) Start(ctx context.Context) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.closed {
		return facilitator.ErrClosed
	}
	if ix.stopRun != nil {
		return errors.New("indexer: started twice")
	}
	// The loop outlives Start's context (a start-up deadline); Stop ends it.
	runCtx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	ix.stopRun = stop
	ix.loops.Go(func() error { return ix.run(runCtx) })
	go func() { ix.runErr = ix.loops.Wait(); close(ix.done) }()
	return nil
}

// Stop ends the indexer and waits for it until ctx ends. It returns why the indexer had stopped
// on its own, if it had (ErrDeepReorg). It may be called more than once.
func (ix *Indexer) Stop(ctx context.Context) error {
	ix.mu.Lock()
	ix.closed = true
	stop := ix.stopRun
	ix.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop(facilitator.ErrClosed)
	select {
	case <-ix.done:
		return ix.runErr
	case <-ctx.Done():
		return fmt.Errorf("indexer: stopping %s: %w", ix.cfg.Network, context.Cause(ctx))
	}
}

// Done is closed once the indexer has stopped: after Stop, or on its own (Err says why).
func (ix *Indexer) Done() <-chan struct{} { return ix.done }

// Err is why the indexer stopped on its own (ErrDeepReorg), once Done is closed; nil otherwise.
func (ix *Indexer) Err() error {
	select {
	case <-ix.done:
		return ix.runErr
	default:
		return nil
	}
}

// run indexes until ctx ends.
func (ix *Indexer) run(ctx context.Context) error {
	for {
		leading, release, err := ix.cfg.Store.Lead(ctx, ix.cfg.Network)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			ix.log.Warn("waiting for the indexer lease", "err", err)
			if !facilitator.Sleep(ctx, time.Second) {
				return nil
			}
			continue
		}
		ix.leader.Store(true)
		ix.log.Info("leading this network's indexer")
		err = ix.lead(leading)
		lost := leading.Err() != nil && ctx.Err() == nil
		ix.leader.Store(false)
		release()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrDeepReorg):
			ix.log.Error("indexer stopped: manual intervention needed", "err", err)
			ix.stopped.Store(true)
			return err
		case lost:
			ix.log.Warn("lost the indexer lease; waiting to lead again")
		default:
			ix.log.Warn("indexer restarting", "err", err)
		}
		// Give a replica its chance, and never spin.
		if !facilitator.Sleep(ctx, time.Second) {
			return nil
		}
	}
}

// lead indexes while this process holds the lease: step until caught up, then wait for a head.
func (ix *Indexer) lead(ctx context.Context) error {
	ix.checkedCursor = false
	heads := ix.followHeads(ctx)
	failures := 0
	for {
		caughtUp, err := ix.step(ctx)
		switch {
		case errors.Is(err, ErrDeepReorg):
			return err
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			failures++
			ix.log.Warn("indexing step failed; retrying", "err", err, "failures", failures)
			if failures > 30 {
				return err
			}
			if !facilitator.Sleep(ctx, min(time.Duration(failures)*200*time.Millisecond, 5*time.Second)) {
				return ctx.Err()
			}
			continue
		}
		failures = 0
		if ix.cfg.Observer != nil {
			ix.cfg.Observer.Beat(LoopIndexer, ix.cfg.Network, ix.cfg.Now())
		}
		if !caughtUp {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-heads:
		}
	}
}

// Step indexes the next piece of chain once, as the leading loop does, and reports whether the
// index has reached the head. It is for deterministic drivers (the settle simulator steps the
// real indexer on its own goroutine, beside the engine, with a simulated clock): the caller holds
// the network's lease, Start is never called beside it, and a failed step is simply stepped
// again. A driver models a restart with a new Indexer over the same store.
func (ix *Indexer) Step(ctx context.Context) (caughtUp bool, err error) { return ix.step(ctx) }

// step indexes the next piece of chain and reports whether the index has reached the head.
func (ix *Indexer) step(ctx context.Context) (bool, error) {
	head, fp, err := ix.finality(ctx)
	if err != nil {
		return false, err
	}
	ix.head.Store(uint64(head))
	cur, ok, err := ix.cfg.Store.Cursor(ctx, ix.cfg.Network)
	if err != nil {
		return false, err
	}
	next := ix.cfg.StartBlock
	if ok {
		next = cur.Number + 1
		ix.cursor.Store(cur.Number)
	}
	if next > uint64(head) {
		return true, nil
	}
	// Blocks at or below safe are final: no hashes needed to index them (none while no block is
	// known final).
	var safe uint64
	if fp.Known {
		safe = fp.Block
	}
	if next+ix.window <= safe {
		if ok && cur.Hash != (common.Hash{}) && !ix.checkedCursor {
			// Resuming far behind (a restart, an outage): the cursor's block may have been
			// reorganised away meanwhile, which backfilling from it would never notice.
			h, err := ix.header(ctx, cur.Number)
			if err != nil {
				return false, err
			}
			if h.Hash != cur.Hash {
				return false, ix.reorg(ctx, cur, uint64(head))
			}
			ix.checkedCursor = true
		}
		return false, ix.backfill(ctx, next, safe-ix.window+1)
	}
	return ix.live(ctx, cur, ok, next, uint64(head))
}

// backfill indexes final blocks [from, limit) with one eth_getLogs range and one COPY.
func (ix *Indexer) backfill(ctx context.Context, from, limit uint64) error {
	to := min(from+ix.sizer.size-1, limit-1)
	logs, last, err := ix.logsWithLast(ctx, from, to)
	if err != nil {
		if tooLarge(err) && ix.sizer.shrink(from, to, err) {
			ix.rangeSize.Store(ix.sizer.size)
			ix.log.Info("log range refused; shrinking", "from", from, "to", to, "range", ix.sizer.size, "err", err)
			return nil
		}
		return err
	}
	ev := Decode(logs)
	if err := ix.cfg.Store.Commit(ctx, ix.cfg.Network, facilitator.IndexBatch{Events: ev, Blocks: []facilitator.Block{last}, Cursor: last}); err != nil {
		return err
	}
	ix.cursor.Store(to)
	ix.eventsIndexed.Add(int64(ev.Len()))
	ix.progress(to, limit-1)
	if ix.sizer.grow() {
		ix.rangeSize.Store(ix.sizer.size)
		ix.log.Debug("log range grown", "range", ix.sizer.size)
	}
	return nil
}

// progress logs backfill speed every progressEvery: blocks and events per second, and the time
// left to reach target at that speed.
func (ix *Indexer) progress(at, target uint64) {
	const progressEvery = 5 * time.Second
	now := ix.cfg.Now()
	events := ix.eventsIndexed.Load()
	if ix.progressAt.IsZero() {
		ix.progressAt, ix.progressBlock, ix.progressEvents = now, at, events
		return
	}
	took := now.Sub(ix.progressAt)
	if took < progressEvery && at < target {
		return
	}
	bps := float64(at-ix.progressBlock) / took.Seconds()
	eps := float64(events-ix.progressEvents) / took.Seconds()
	attrs := []any{"block", at, "target", target, "blocks_per_s", int(bps), "events_per_s", int(eps), "range", ix.sizer.size}
	if bps > 0 {
		attrs = append(attrs, "eta", (time.Duration(float64(target-at)/bps) * time.Second).Round(time.Second).String())
	}
	ix.log.Info("backfill progress", attrs...)
	ix.progressAt, ix.progressBlock, ix.progressEvents = now, at, events
}

// live indexes unfinalized blocks [next, head] (a bounded batch of them), checking that each links
// to the last indexed one; a broken link is a reorg.
func (ix *Indexer) live(ctx context.Context, cur facilitator.Block, haveCursor bool, next, head uint64) (bool, error) {
	to := min(head, next+ix.liveSpan()-1)
	from := next
	if !haveCursor && next > 0 {
		// Keep the first block's parent too, so a reorg of the very first indexed block still
		// finds its common ancestor.
		from = next - 1
	}
	headers, err := ix.headers(ctx, from, to)
	if err != nil {
		return false, err
	}
	if haveCursor && cur.Hash != (common.Hash{}) && headers[0].ParentHash != cur.Hash {
		return false, ix.reorg(ctx, cur, head)
	}
	for i := 1; i < len(headers); i++ {
		if headers[i].ParentHash != headers[i-1].Hash {
			return false, fmt.Errorf("blocks %d and %d do not link (the chain moved while reading)", headers[i-1].Number, headers[i].Number)
		}
	}
	ev, err := ix.logsFor(ctx, headers[len(headers)-int(to-next+1):])
	if err != nil {
		if ix.refused(next, to, err) {
			return false, nil
		}
		return false, err
	}
	last := headers[len(headers)-1]
	if err := ix.cfg.Store.Commit(ctx, ix.cfg.Network, facilitator.IndexBatch{Events: ev, Blocks: headers, Cursor: last}); err != nil {
		return false, err
	}
	ix.cursor.Store(last.Number)
	ix.eventsIndexed.Add(int64(ev.Len()))
	if last.Number > ix.window && ix.finalKnown {
		// Only final blocks leave the window: a reorg can reach every block above the final one,
		// however far back the chain's finalized tag lags.
		if err := ix.cfg.Store.PruneBlocks(ctx, ix.cfg.Network, min(last.Number-ix.window, ix.final)); err != nil {
			ix.log.Warn("pruning old window blocks", "err", err)
		}
	}
	return last.Number == head, nil
}

// liveSpan is how many blocks one live step reads: the window, and no more than the provider
// has accepted as a log range.
func (ix *Indexer) liveSpan() uint64 { return max(min(ix.window, 256, ix.sizer.size), 1) }

// refused shrinks the log range after a provider refused [from, to] as too large, reporting
// whether it did (the step is then simply retried with the smaller range).
func (ix *Indexer) refused(from, to uint64, err error) bool {
	if !tooLarge(err) || !ix.sizer.shrink(from, to, err) {
		return false
	}
	ix.rangeSize.Store(ix.sizer.size)
	ix.log.Info("log range refused; shrinking", "from", from, "to", to, "range", ix.sizer.size, "err", err)
	return true
}

// logsFor reads the logs of consecutive blocks and checks each came from the block hash read with
// the headers: a log from another branch means the chain moved under us, and the step is retried.
// The node that answered the logs had the last of the blocks, the very one read (logsWithLast):
// a node behind it answers fewer logs, or none, and the range would be marked indexed without them.
func (ix *Indexer) logsFor(ctx context.Context, headers []facilitator.Block) (facilitator.Events, error) {
	first := headers[0].Number
	top := headers[len(headers)-1]
	logs, last, err := ix.logsWithLast(ctx, first, top.Number)
	if err != nil {
		return facilitator.Events{}, err
	}
	if last.Hash != top.Hash {
		return facilitator.Events{}, fmt.Errorf("the node answering the logs has block %d as %s, not the %s read (it lags, or the chain moved while reading)",
			top.Number, last.Hash, top.Hash)
	}
	for _, l := range logs {
		i := l.BlockNumber - first
		if l.BlockNumber < first || i >= uint64(len(headers)) || l.BlockHash != headers[i].Hash {
			return facilitator.Events{}, fmt.Errorf("log of block %d (%s) is not from the block read (the chain moved while reading)", l.BlockNumber, l.BlockHash)
		}
	}
	return Decode(logs), nil
}

// reorg finds the highest kept block still on the canonical chain and, in one transaction, rolls
// everything above it back and indexes the new branch from there.
func (ix *Indexer) reorg(ctx context.Context, cur facilitator.Block, head uint64) error {
	from := uint64(0)
	if cur.Number > ix.window {
		from = cur.Number - ix.window
	}
	if ix.finalKnown {
		from = min(from, ix.final) // every unfinal block kept is a candidate ancestor
	}
	kept, err := ix.cfg.Store.WindowBlocks(ctx, ix.cfg.Network, from)
	if err != nil {
		return err
	}
	if len(kept) == 0 {
		return fmt.Errorf("%w: no kept blocks to compare at %d", ErrDeepReorg, cur.Number)
	}
	top := min(kept[len(kept)-1].Number, head)
	if top < kept[0].Number {
		return fmt.Errorf("%w: the chain is now shorter (%d) than the kept window (from %d)", ErrDeepReorg, head, kept[0].Number)
	}
	ancestor, err := commonAncestor(ctx, kept, top, ix.headers)
	if err != nil {
		return err
	}
	if ancestor == nil {
		return fmt.Errorf("%w: no block from %d to %d is still canonical", ErrDeepReorg, kept[0].Number, cur.Number)
	}
	depth := cur.Number - ancestor.Number
	batch := facilitator.IndexBatch{RollbackTo: ancestor, Cursor: *ancestor}
	if ancestor.Number < head {
		to := min(head, ancestor.Number+ix.liveSpan())
		headers, err := ix.headers(ctx, ancestor.Number+1, to)
		if err != nil {
			return err
		}
		if headers[0].ParentHash != ancestor.Hash {
			return fmt.Errorf("the new branch at %d does not link to the ancestor (the chain moved while reading)", ancestor.Number+1)
		}
		if batch.Events, err = ix.logsFor(ctx, headers); err != nil {
			if ix.refused(ancestor.Number+1, to, err) {
				return nil
			}
			return err
		}
		batch.Blocks, batch.Cursor = headers, headers[len(headers)-1]
	}
	if err := ix.cfg.Store.Commit(ctx, ix.cfg.Network, batch); err != nil {
		return err
	}
	ix.reorgs.Add(1)
	ix.cursor.Store(batch.Cursor.Number)
	if ix.cfg.Observer != nil {
		ix.cfg.Observer.Reorg(ix.cfg.Network, depth)
	}
	ix.log.Warn("reorg: rolled back to the common ancestor and indexed the new branch",
		"ancestor", ancestor.Number, "depth", depth, "old_head", cur.Number, "new_cursor", batch.Cursor.Number, "reorgs_total", ix.reorgs.Load())
	return nil
}

// ancestorChunk is how many headers one request of the ancestor search reads: the kept window can
// be thousands of blocks where the finality tag lags far behind the head (an L2 following L1
// finality), more than providers take in one batch, and the ancestor is nearly always near the top.
const ancestorChunk = 100

// commonAncestor is the highest kept block (kept ascending) at or below top that is still on the
// canonical chain, read top down ancestorChunk headers a request; nil when none is.
func commonAncestor(ctx context.Context, kept []facilitator.Block, top uint64,
	headers func(ctx context.Context, from, to uint64) ([]facilitator.Block, error)) (*facilitator.Block, error) {
	i := len(kept) - 1
	for i >= 0 && kept[i].Number > top {
		i--
	}
	for hi := top; i >= 0; {
		lo := kept[0].Number
		if hi+1-lo > ancestorChunk {
			lo = hi + 1 - ancestorChunk
		}
		canonical, err := headers(ctx, lo, hi)
		if err != nil {
			return nil, err
		}
		for ; i >= 0 && kept[i].Number >= lo; i-- {
			if canonical[kept[i].Number-lo].Hash == kept[i].Hash {
				return &kept[i], nil
			}
		}
		if lo == kept[0].Number {
			break
		}
		hi = lo - 1
	}
	return nil, nil
}

// logsWithLast reads the logs of blocks from..to and the block at to, in one request, so that
// both come from one node: the range counts as indexed only on evidence that the node answering
// its logs had its last block (a node missing the newest blocks answers fewer logs or none, and
// the cursor would pass those blocks for good). A node without block to answers an error.
func (ix *Indexer) logsWithLast(ctx context.Context, from, to uint64) ([]types.Log, facilitator.Block, error) {
	filter := map[string]any{
		"fromBlock": hexutil.EncodeUint64(from),
		"toBlock":   hexutil.EncodeUint64(to),
		"address":   ix.cfg.Tokens,
		"topics":    [][]common.Hash{{eip3009.TransferTopic, eip3009.AuthorizationUsedTopic, eip3009.AuthorizationCanceledTopic}},
	}
	var logs []types.Log
	var h *header
	elems := []rpc.BatchElem{
		ethrpc.Logs(filter, &logs),
		ethrpc.Block(ethrpc.At(to), false, &h),
	}
	rctx, cancel := context.WithTimeout(ctx, ix.cfg.RPCTimeout)
	defer cancel()
	if err := ix.cfg.Chain.BatchCallContext(rctx, elems); err != nil {
		return nil, facilitator.Block{}, err
	}
	if elems[0].Error != nil {
		return nil, facilitator.Block{}, elems[0].Error
	}
	if elems[1].Error != nil {
		return nil, facilitator.Block{}, elems[1].Error
	}
	if h == nil || uint64(h.Number) != to {
		return nil, facilitator.Block{}, fmt.Errorf("block %d is not available from the node that answered its logs (it lags)", to)
	}
	for _, l := range logs {
		if l.BlockNumber < from || l.BlockNumber > to || (l.BlockNumber == to && l.BlockHash != h.Hash) {
			return nil, facilitator.Block{}, fmt.Errorf("log of block %d (%s) is outside the range read or not from its block (the chain moved while reading)",
				l.BlockNumber, l.BlockHash)
		}
	}
	return logs, facilitator.Block{Number: to, Hash: h.Hash, ParentHash: h.ParentHash}, nil
}

type header struct {
	Number     hexutil.Uint64 `json:"number"`
	Hash       common.Hash    `json:"hash"`
	ParentHash common.Hash    `json:"parentHash"`
}

func (ix *Indexer) header(ctx context.Context, n uint64) (facilitator.Block, error) {
	hs, err := ix.headers(ctx, n, n)
	if err != nil {
		return facilitator.Block{}, err
	}
	return hs[0], nil
}

// headers reads blocks from..to in one batch.
func (ix *Indexer) headers(ctx context.Context, from, to uint64) ([]facilitator.Block, error) {
	hs := make([]*header, to-from+1)
	elems := make([]rpc.BatchElem, len(hs))
	for i := range hs {
		elems[i] = ethrpc.Block(ethrpc.At(from+uint64(i)), false, &hs[i])
	}
	ctx, cancel := context.WithTimeout(ctx, ix.cfg.RPCTimeout)
	defer cancel()
	if err := ix.cfg.Chain.BatchCallContext(ctx, elems); err != nil {
		return nil, err
	}
	out := make([]facilitator.Block, len(hs))
	for i, h := range hs {
		if elems[i].Error != nil {
			return nil, elems[i].Error
		}
		if h == nil || uint64(h.Number) != from+uint64(i) {
			return nil, fmt.Errorf("block %d is not available yet", from+uint64(i))
		}
		out[i] = facilitator.Block{Number: uint64(h.Number), Hash: h.Hash, ParentHash: h.ParentHash}
	}
	return out, nil
}

// finality reads the head and, when the network's rule names a tag, the node's block under it, in
// one request (so both come from one node), and says where finality stands there.
func (ix *Indexer) finality(ctx context.Context) (hexutil.Uint64, facilitator.FinalPoint, error) {
	var head hexutil.Uint64
	rule := ix.cfg.Finality
	elems := []rpc.BatchElem{ethrpc.BlockNumber(&head)}
	if rule.Tag != "" {
		elems = append(elems, ethrpc.TagElem(rule.Tag))
	}
	ctx, cancel := context.WithTimeout(ctx, ix.cfg.RPCTimeout)
	defer cancel()
	if err := ix.cfg.Chain.BatchCallContext(ctx, elems); err != nil {
		return 0, facilitator.FinalPoint{}, err
	}
	if elems[0].Error != nil {
		return 0, facilitator.FinalPoint{}, elems[0].Error
	}
	var tag facilitator.TagRead
	if rule.Tag != "" {
		tag = ethrpc.TagAnswer(elems[1])
	}
	fp := ix.finalFloor.At(rule, uint64(head), tag)
	if fp.Known {
		// A depth fallback's final block may be below a tagged one seen before: finality
		// only moves forward.
		ix.final, ix.finalKnown = max(ix.final, fp.Block), true
	}
	return head, fp, nil
}

func (ix *Indexer) call(ctx context.Context, result any, method string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, ix.cfg.RPCTimeout)
	defer cancel()
	return ix.cfg.Chain.CallContext(ctx, result, method, args...)
}
