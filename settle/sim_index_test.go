package settle_test

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
)

// The real indexer: in half the worlds with a second process, the index that reconcile and
// status read is not the stand-in (settlesim.Index, which follows the canonical chain by itself)
// but the one the real indexer.Indexer keeps in settlesim.IndexStore (Postgres's semantics),
// stepped on the world's goroutine (Indexer.Step) through nodes of its own that lag, fail, drop
// answers, clip eth_getLogs ranges past their head (ClampLogs) and stay on a replaced branch,
// behind a load balancer or the real ethrpc.Pool (with, in some of those, a lying provider),
// over a store whose writes fail or commit and answer an error, restarted now and then. Drawn
// from a stream of its own. Now and then, and at the end, the index is held to the chain
// (checkIndex): no gap, no log of a replaced branch.
//
// What the indexer promises rests on a batch being answered by one node (logsWithLast reads a
// range's logs and its last block in one request): over a provider whose balancer answers one
// batch's elements from different nodes (settlesim.Balancer.SplitBatches) it can commit a range
// without the logs a lagging node left out (made to, seed 281 stores a block of eight token logs
// with none), so the worlds never split its batches.
type simIndexing struct {
	r        *rand.Rand
	on       bool
	store    *settlesim.IndexStore
	backends []*settlesim.Backend
	liar     *settlesim.Backend
	chain    ethrpc.Chain
	cfg      indexer.Config
	ix       *indexer.Indexer
	release  func()
	// startAt: the indexer first steps once the chain has this many blocks (a quarter of the
	// worlds: a late start, backfilling final blocks before it follows the head).
	startAt uint64
	// idle is the head the indexer last found itself caught up at.
	idle  common.Hash
	stats indexStats
}

// indexStats count what the worlds' indexers did.
type indexStats struct {
	worlds, steps, failed, restarts, reorgs, checks, staleFinal, backfill int
}

func (s *indexStats) add(o indexStats) {
	s.worlds += o.worlds
	s.steps += o.steps
	s.failed += o.failed
	s.restarts += o.restarts
	s.reorgs += o.reorgs
	s.checks += o.checks
	s.staleFinal += o.staleFinal
	s.backfill += o.backfill
}

func (s indexStats) String() string {
	return fmt.Sprintf("%d worlds with the real indexer (%d steps, %d of them backfilling, %d failed, %d restarts, %d reorgs rolled back, %d checks of the index against the chain, "+
		"%d of them finding a final block still of a replaced branch the indexer had not yet stepped past)",
		s.worlds, s.steps, s.backfill, s.failed, s.restarts, s.reorgs, s.checks, s.staleFinal)
}

// setUpIndexer draws whether the world's index is the real indexer's, and builds it; it reports
// whether it is.
func (w *simWorld) setUpIndexer() bool {
	x := &w.indexing
	x.r = rand.New(rand.NewPCG(w.seed, 0x1de8))
	x.on = w.jobsSide.on && x.r.IntN(2) == 0
	if !x.on {
		return false
	}
	x.store = settlesim.NewIndexStore(settlesim.IndexFaults{}, x.r)
	for i := range 1 + x.r.IntN(3) {
		x.backends = append(x.backends, settlesim.NewBackend(w.chain, fmt.Sprintf("idx%d", i), settlesim.Profile{}, x.r))
	}
	if x.r.IntN(2) == 0 {
		x.chain = settlesim.NewBalancer(x.r, x.backends...)
	} else {
		x.chain = w.serialPool(x.backends, w.seed^0x1d8)
		if len(x.backends) > 1 && x.r.IntN(2) == 0 {
			x.liar = x.backends[x.r.IntN(len(x.backends))]
		}
	}
	x.cfg = indexer.Config{
		Network: w.network.ID, Tokens: []common.Address{w.chain.Token()}, Chain: x.chain, Store: x.store,
		Finality: w.network.Finality, InitialRange: uint64(1 + x.r.IntN(16)), MaxRange: uint64(1 + x.r.IntN(64)),
		RPCTimeout: time.Second, Now: w.clock.Now,
		Logger: slog.New(slog.NewTextHandler(&w.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	x.stats.worlds = 1
	if x.r.IntN(4) == 0 {
		x.startAt = uint64(140 + x.r.IntN(60))
	}
	w.startIndexer()
	return true
}

// startIndexer starts an indexer process: it takes the lease (ending the previous process's).
func (w *simWorld) startIndexer() {
	x := &w.indexing
	if x.release != nil {
		x.release()
	}
	if x.ix != nil {
		x.stats.reorgs += int(x.ix.Health().Reorgs)
	}
	_, release, err := x.store.Lead(w.ctx, w.network.ID)
	if err != nil {
		panic(err)
	}
	x.release = release
	x.ix = indexer.New(x.cfg)
	x.idle = common.Hash{}
}

// indexerFaults gives the indexer's nodes and store new faults.
func (w *simWorld) indexerFaults() {
	x := &w.indexing
	for _, b := range x.backends {
		p := settlesim.RandomProfile(x.r)
		p.DropDelay = 0 // the indexer's lost answers take none of the world's time
		if b == x.liar {
			lies := settlesim.Lying(x.r)
			p.HeadAhead, p.FinalizedBack = lies.HeadAhead, lies.FinalizedBack
		}
		b.SetProfile(p)
	}
	if x.r.IntN(2) == 0 {
		x.store.SetFaults(settlesim.IndexFaults{Fail: x.r.Float64() * 0.1, Ambiguous: x.r.Float64() * 0.1})
	} else {
		x.store.SetFaults(settlesim.IndexFaults{})
	}
}

// indexerStep is, in a world with the real indexer, a few steps of it, now and then new faults
// or a restart, and now and then the index held to the chain.
func (w *simWorld) indexerStep() error {
	x := &w.indexing
	if !x.on || !w.jobsSide.on {
		return nil
	}
	if x.r.IntN(10) == 0 {
		w.indexerFaults()
	}
	if x.r.IntN(40) == 0 {
		x.stats.restarts++
		w.startIndexer()
	}
	// Now and then a few steps, so that the index lags and catches up by several blocks at once.
	steps := 0
	if x.r.IntN(3) == 0 {
		steps = 1 + x.r.IntN(3)
	}
	head := w.chain.Head()
	if head.Number < x.startAt {
		steps = 0
	}
	for range steps {
		if x.idle == head.Hash {
			break // caught up at this very head: a step would only read the head again
		}
		caughtUp, err := w.stepIndexer()
		if err != nil {
			return err
		}
		if caughtUp {
			x.idle = head.Hash
		}
	}
	if x.r.IntN(12) == 0 {
		return w.checkIndex(false)
	}
	return nil
}

// stepIndexer is one step of the indexer; a failed step is only logged (the indexer's loop steps
// again), but a reorg deeper than the window is a failure: the world's reorgs never go that deep.
func (w *simWorld) stepIndexer() (bool, error) {
	x := &w.indexing
	x.stats.steps++
	if h := x.ix.Health(); h.Cursor+128+w.depth <= h.Head {
		x.stats.backfill++ // by the last step's head and cursor: a step behind the window
	}
	caughtUp, err := x.ix.Step(w.ctx)
	switch {
	case errors.Is(err, indexer.ErrDeepReorg):
		return false, fmt.Errorf("the indexer: %w", err)
	case err != nil:
		x.stats.failed++
		fmt.Fprintf(&w.log, "sim: indexer step: %v\n", err)
		return false, nil
	}
	return caughtUp, nil
}

// indexerAtEnd, with the faults off, steps the indexer until it has indexed the head, and holds
// the whole index to the chain.
func (w *simWorld) indexerAtEnd() error {
	x := &w.indexing
	if !x.on {
		return nil
	}
	for _, b := range x.backends {
		b.SetProfile(settlesim.Profile{})
	}
	x.store.SetFaults(settlesim.IndexFaults{})
	head := w.chain.Head()
	for i := 0; ; i++ {
		caughtUp, err := w.stepIndexer()
		if err != nil {
			return err
		}
		cur, ok, _ := x.store.Cursor(settlesim.WithoutFaults(w.ctx), w.network.ID)
		if caughtUp && ok && cur.Hash == head.Hash {
			break
		}
		if i == 1000 {
			return fmt.Errorf("the indexer has not reached head %d (%s) in 1000 steps with the faults off: cursor %+v", head.Number, head.Hash, cur)
		}
	}
	x.stats.reorgs += int(x.ix.Health().Reorgs)
	x.release()
	return w.checkIndex(true)
}

// checkIndex holds the index to the chain: nothing above the cursor; every kept block a block
// the chain made, linked to the kept block below it, with exactly that block's logs of the token
// stored; every other block up to the cursor (backfilled, or pruned from the window: all final)
// the canonical one, with its logs. A kept block may still be of a branch a reorganisation
// replaced while the indexer had not stepped past it (it reads parents only going forward), even
// once final by the chain's head; atEnd, caught up with honest nodes, every block up to the
// cursor must be canonical.
func (w *simWorld) checkIndex(atEnd bool) error {
	x := &w.indexing
	x.stats.checks++
	ctx := settlesim.WithoutFaults(w.ctx)
	cur, ok, _ := x.store.Cursor(ctx, w.network.ID)
	ev := x.store.Events(w.network.ID)
	kept, _ := x.store.WindowBlocks(ctx, w.network.ID, 0)
	fail := func(format string, args ...any) error {
		return fmt.Errorf("the index (cursor %d %s): %s", cur.Number, cur.Hash, fmt.Sprintf(format, args...))
	}
	if !ok {
		if ev.Len() > 0 || len(kept) > 0 {
			return fail("events or blocks stored with no cursor")
		}
		return nil
	}
	stored := map[uint64][]string{}
	hashes := map[uint64]map[common.Hash]bool{}
	note := func(p facilitator.LogPosition, s string) {
		stored[p.BlockNumber] = append(stored[p.BlockNumber], s)
		if hashes[p.BlockNumber] == nil {
			hashes[p.BlockNumber] = map[common.Hash]bool{}
		}
		hashes[p.BlockNumber][p.BlockHash] = true
	}
	for _, t := range ev.Transfers {
		note(t.LogPosition, transferKey(t))
	}
	for _, a := range ev.Auths {
		note(a.LogPosition, authKey(a))
	}
	for n := range stored {
		if n > cur.Number {
			return fail("events stored at block %d, above the cursor", n)
		}
	}
	byNumber := map[uint64]facilitator.Block{}
	for _, b := range kept {
		if b.Number > cur.Number {
			return fail("block %d kept above the cursor", b.Number)
		}
		byNumber[b.Number] = b
	}
	if b, ok := byNumber[cur.Number]; ok && b.Hash != cur.Hash {
		return fail("the cursor's block is kept as %s", b.Hash)
	}
	head := w.chain.Head()
	final := uint64(0)
	if head.Number+1 > w.depth {
		final = head.Number + 1 - w.depth
	}
	token := w.chain.Token()
	staleFinal := false
	for n := uint64(0); n <= cur.Number; n++ {
		canon, _ := w.chain.BlockByNumber(n)
		id := canon.Hash
		if b, ok := byNumber[n]; ok {
			id = b.Hash
			if p, ok := byNumber[n-1]; ok && n > 0 && b.ParentHash != p.Hash {
				return fail("kept block %d (%s) does not link to kept block %d (%s)", n, b.Hash, n-1, p.Hash)
			}
			if id != canon.Hash {
				if atEnd {
					return fail("block %d kept as %s, of a replaced branch (canonical %s), with honest nodes at the head", n, id, canon.Hash)
				}
				staleFinal = staleFinal || n <= final
			}
		} else if n == cur.Number && cur.Hash != canon.Hash {
			id = cur.Hash // the cursor's block, when its window entry was pruned
		}
		blk, logs, ok := w.chain.BlockLogs(id)
		if !ok || blk.Number != n {
			return fail("block %d stored as %s, which the chain never made at %d", n, id, n)
		}
		var want []types.Log
		for _, l := range logs {
			if l.Address == token {
				want = append(want, l)
			}
		}
		dec := indexer.Decode(want)
		var wants []string
		for _, t := range dec.Transfers {
			wants = append(wants, transferKey(t))
		}
		for _, a := range dec.Auths {
			wants = append(wants, authKey(a))
		}
		got := slices.Clone(stored[n])
		slices.Sort(got)
		slices.Sort(wants)
		if !slices.Equal(got, wants) {
			return fail("block %d (%s, canonical %s, head %d, final %d) stores %d events, the block has %d:\n  stored %s\n  chain  %s",
				n, id, canon.Hash, head.Number, final, len(got), len(wants), strings.Join(got, "\n         "), strings.Join(wants, "\n         "))
		}
	}
	if staleFinal {
		x.stats.staleFinal++
	}
	return nil
}

func transferKey(t facilitator.Transfer) string {
	return fmt.Sprintf("%s transfer %s:%d %s %s→%s %s %d", t.BlockHash, t.TxHash, t.LogIndex, t.Token, t.From, t.To, t.Value, t.BlockTime.Unix())
}

func authKey(a facilitator.AuthorizationEvent) string {
	return fmt.Sprintf("%s auth %s:%d %s canceled %v %s %x %d", a.BlockHash, a.TxHash, a.LogIndex, a.Token, a.Canceled, a.Authorizer, a.Nonce, a.BlockTime.Unix())
}
