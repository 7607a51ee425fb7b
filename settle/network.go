package settle

import (
	"context"
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// network is the engine's state for one chain: its signers and its fee suggestion.
type network struct {
	engine  *Engine
	id      facilitator.Network
	chain   ethrpc.Chain
	heads   Heads // nil: polls only
	senders []*sender

	feeMu   sync.Mutex
	feeAt   time.Time
	feeLast Fees

	bumpMu sync.Mutex
	bumps  map[int64]bool // flights a node called underpriced: bump on the next watch

	// leaseMu orders hand-overs of the network's keys (one at a time, so that this process keeps
	// one) and the turns at queueing for a key.
	leaseMu sync.Mutex
	waiting bool
	turn    int

	// queue carries signed transactions of every key to broadcastLoop, each key's in nonce order.
	queue chan *flight

	// marks carries accepted broadcasts to markLoop, which records them in the ledger.
	marks chan []int64

	// recording is the ledger write of a round's outcomes in progress (recordAsync); resweep asks
	// the next round for every receipt, after such a write failed.
	recording sync.WaitGroup
	resweep   atomic.Bool

	// headHint is the highest head the newHeads subscription announced (0: none yet).
	headHint atomic.Uint64

	// finalFloor is the highest tagged final block a node answered consistently (at or below its
	// own head): a lower answer later is a node gone backwards, whose word is not known. tagOK:
	// the latest round's read of the tag was answered (else finality is due by depth).
	finalFloor facilitator.FinalityFloor
	tagOK      atomic.Bool

	// maxSeen is the highest head any answer told of (pinHead can fall back below it): a nonce
	// is loaded, and a replacement made, only on reads at least that fresh.
	maxSeen atomic.Uint64

	// unknown are settlement writes whose outcome is unknown, checked each round (checkUnknown).
	unknownMu sync.Mutex
	unknown   []*unknownCommit

	// kick wakes the watcher before its next tick (a broadcast was just accepted).
	kick chan struct{}

	// Owned by the watcher goroutine.
	pinHead  uint64 // the block reads "at the head" are pinned at (watch)
	pinFails int    // rounds in a row whose reads at pinHead failed

	lastBlock       uint64
	lastSweep       time.Time
	noBlockReceipts bool // the node refused eth_getBlockReceipts: read blocks, then receipts
}

// feeTTL bounds how stale a fee suggestion may be; base fees move once per block.
const feeTTL = 2 * time.Second

// fees returns the current suggestion, read at most once per feeTTL: the base fee of the latest
// block and the node's tip, in one round trip.
func (n *network) fees(ctx context.Context) (Fees, error) {
	n.feeMu.Lock()
	defer n.feeMu.Unlock()
	e := n.engine
	if !n.feeAt.IsZero() && e.now().Sub(n.feeAt) < feeTTL {
		return n.feeLast, nil
	}
	var head struct {
		BaseFee *hexutil.Big `json:"baseFeePerGas"`
	}
	var tip hexutil.Big
	batch := []rpc.BatchElem{
		{Method: "eth_getBlockByNumber", Args: []any{"latest", false}, Result: &head},
		{Method: "eth_maxPriorityFeePerGas", Result: &tip},
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	defer cancel()
	err := n.chain.BatchCallContext(ctx, batch)
	if err == nil {
		err = batch[0].Error
	}
	if err != nil || head.BaseFee == nil {
		return Fees{}, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "could not read the network's fees; nothing was sent, retry", err)
	}
	t := (*big.Int)(&tip)
	if batch[1].Error != nil {
		t = big.NewInt(0) // a node without the method: the floor applies
	}
	n.feeLast = SuggestFees((*big.Int)(head.BaseFee), t, e.cfg.MinTip)
	n.feeAt = e.now()
	return n.feeLast, nil
}

// pickSender returns the signer this process holds with the fewest transactions in flight, or
// nil when it holds none or all are at the limit or below their minimum balance (back-pressure:
// the caller answers 503 with Retry-After rather than queue forever).
func (n *network) pickSender() *sender {
	var best *sender
	for _, s := range n.senders {
		if s.held() == nil || s.low.Load() || s.inFlight.Load() >= int64(n.engine.cfg.MaxInFlightPerSigner) {
			continue
		}
		if best == nil || s.inFlight.Load() < best.inFlight.Load() {
			best = s
		}
	}
	return best
}

func (n *network) wantBump(f *flight) {
	n.bumpMu.Lock()
	n.bumps[f.id] = true
	n.bumpMu.Unlock()
}

func (n *network) takeBump(f *flight) bool {
	n.bumpMu.Lock()
	defer n.bumpMu.Unlock()
	if n.bumps[f.id] {
		delete(n.bumps, f.id)
		return true
	}
	return false
}

// wake makes the watcher run a round now (or right after the one in progress).
func (n *network) wake() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// markBroadcast hands ids to markLoop, or records them itself when markLoop is behind.
func (n *network) markBroadcast(ctx context.Context, ids []int64) {
	if n.engine.stepped {
		n.recordBroadcasts(ctx, ids)
		return
	}
	select {
	case n.marks <- ids:
	default:
		n.recordBroadcasts(ctx, ids)
	}
}

// markLoop records accepted broadcasts, merging whatever queued meanwhile into one statement.
func (n *network) markLoop(ctx context.Context) {
	for {
		var ids []int64
		select {
		case <-ctx.Done():
			return
		case ids = <-n.marks:
		}
	more:
		for {
			select {
			case more := <-n.marks:
				ids = append(ids, more...)
			default:
				break more
			}
		}
		n.recordBroadcasts(ctx, ids)
	}
}

func (n *network) recordBroadcasts(ctx context.Context, ids []int64) {
	e := n.engine
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RPCTimeout)
	defer cancel()
	if err := e.store.MarkBroadcast(ctx, ids); err != nil {
		// Only bookkeeping: recovery treats signed and broadcast alike.
		e.log.Warn("recording broadcasts", "network", n.id.ID, "err", err)
	}
}

// sawFinal records a node's answer for the finality tag, read with its head.
func (n *network) sawFinal(head uint64, tag facilitator.TagRead) {
	n.finalFloor.At(n.id.Finality, head, tag)
}

// saw records that an answer told of head h.
func (n *network) saw(h uint64) { raise(&n.maxSeen, h) }

// raise sets a to v if v is higher, whoever else raises it meanwhile.
func raise(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
