package settle

import (
	"context"
	"errors"
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// chainEngine is the engine's state for one chain: its signers and its fee suggestion.
type chainEngine struct {
	engine  *Engine
	net     facilitator.Network
	chain   ethrpc.Chain
	heads   Heads // nil: polls only
	senders []*sender

	feeMu   sync.Mutex
	feeAt   time.Time
	feeLast Fees
	feeErr  error // with feeLast: the fees are above the policy's max fee
	// feePolicy prices the network's transactions, its defaults applied.
	feePolicy facilitator.FeePolicy

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

// feesRetryAfter is how soon a settlement refused for fees above the max fee may be tried again.
const feesRetryAfter = 15 * time.Second

// fees returns the current price under the network's fee policy, read at most once per feeTTL in
// one round trip: eth_feeHistory over the policy's blocks at its percentile, with the latest
// block's base fee and eth_maxPriorityFeePerGas for a node without it; eth_gasPrice on a legacy
// network. Fees the max fee cannot pay for come with an error wrapping errFeesAboveCap (and the
// fees at the limit, which a bump may still use); nothing may be signed for a new settlement then.
func (n *chainEngine) fees(ctx context.Context) (Fees, error) {
	n.feeMu.Lock()
	defer n.feeMu.Unlock()
	e := n.engine
	if !n.feeAt.IsZero() && e.now().Sub(n.feeAt) < feeTTL {
		return n.feeLast, n.feeErr
	}
	p := n.feePolicy
	var (
		r     feeReading
		batch []rpc.BatchElem
		head  struct {
			BaseFee *hexutil.Big `json:"baseFeePerGas"`
		}
		hist struct {
			BaseFees     []*hexutil.Big   `json:"baseFeePerGas"`
			GasUsedRatio []float64        `json:"gasUsedRatio"`
			Reward       [][]*hexutil.Big `json:"reward"`
		}
		tip, price hexutil.Big
	)
	if p.Legacy {
		batch = []rpc.BatchElem{ethrpc.GasPrice(&price)}
	} else {
		batch = []rpc.BatchElem{
			ethrpc.FeeHistory(uint64(p.HistoryBlocks), "latest", []float64{p.TipPercentile}, &hist),
			ethrpc.Block("latest", false, &head),
			ethrpc.MaxPriorityFeePerGas(&tip),
		}
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	defer cancel()
	err := n.chain.BatchCallContext(cctx, batch)
	if err == nil && p.Legacy {
		if err = batch[0].Error; err == nil {
			r.gasPrice = (*big.Int)(&price)
		}
	} else if err == nil {
		if batch[0].Error == nil && len(hist.BaseFees) == len(hist.GasUsedRatio)+1 && len(hist.Reward) == len(hist.GasUsedRatio) {
			h := &feeHistory{gasUsedRatio: hist.GasUsedRatio}
			for _, b := range hist.BaseFees {
				h.baseFees = append(h.baseFees, (*big.Int)(b))
			}
			for _, rw := range hist.Reward {
				var v *big.Int
				if len(rw) == 1 {
					v = (*big.Int)(rw[0])
				}
				h.rewards = append(h.rewards, v)
			}
			r.history = h
		}
		if batch[1].Error == nil && head.BaseFee != nil {
			r.latestBaseFee = (*big.Int)(head.BaseFee)
		}
		if batch[2].Error == nil {
			r.nodeTip = (*big.Int)(&tip)
		}
	}
	var f Fees
	if err == nil {
		f, err = priceFees(p, r)
	}
	if err != nil && !errors.Is(err, errFeesAboveCap) {
		return Fees{}, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "could not read the network's fees; nothing was sent, retry", err)
	}
	if err != nil {
		e.log.Warn("network fees are above the configured max fee; new settlements are refused until they fall",
			"network", n.net.ID, "max_fee", p.MaxFee, "fee_cap", f.FeeCap, "tip", f.TipCap)
		err = &facilitator.Error{Code: facilitator.EUnavailable, Reason: facilitator.ReasonFeesAboveCap,
			Message:    "the network's fees are above this facilitator's max fee per gas; nothing was sent, retry later",
			RetryAfter: feesRetryAfter, Err: err}
	}
	n.feeLast, n.feeErr, n.feeAt = f, err, e.now()
	return f, err
}

// pickSender returns the signer this process holds with the fewest transactions in flight, or
// nil when it holds none or all are at the limit or below their minimum balance (back-pressure:
// the caller answers 503 with Retry-After rather than queue forever).
func (n *chainEngine) pickSender() *sender {
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

func (n *chainEngine) wantBump(f *flight) {
	n.bumpMu.Lock()
	n.bumps[f.id] = true
	n.bumpMu.Unlock()
}

func (n *chainEngine) takeBump(f *flight) bool {
	n.bumpMu.Lock()
	defer n.bumpMu.Unlock()
	if n.bumps[f.id] {
		delete(n.bumps, f.id)
		return true
	}
	return false
}

// wake makes the watcher run a round now (or right after the one in progress).
func (n *chainEngine) wake() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// sawFinal records a node's answer for the finality tag, read with its head.
func (n *chainEngine) sawFinal(head uint64, tag facilitator.TagRead) {
	n.finalFloor.At(n.net.Finality, head, tag)
}

// saw records that an answer told of head h.
func (n *chainEngine) saw(h uint64) { raise(&n.maxSeen, h) }

// raise sets a to v if v is higher, whoever else raises it meanwhile.
func raise(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// one sends el alone, bounded by the RPC timeout.
func (n *chainEngine) one(ctx context.Context, el rpc.BatchElem) error {
	ctx, cancel := context.WithTimeout(ctx, n.engine.cfg.RPCTimeout)
	defer cancel()
	return ethrpc.One(ctx, n.chain, el)
}

// batch runs elems in chunks, each bounded by the RPC timeout.
func (n *chainEngine) batch(ctx context.Context, elems []rpc.BatchElem) error {
	return n.batchOn(n.chain)(ctx, elems)
}

// batchOn is batch over one chain (one endpoint of the network's, for corroborated reads).
func (n *chainEngine) batchOn(c ethrpc.Chain) func(context.Context, []rpc.BatchElem) error {
	return func(ctx context.Context, elems []rpc.BatchElem) error {
		const chunk = 500
		for i := 0; i < len(elems); i += chunk {
			end := min(i+chunk, len(elems))
			cctx, cancel := context.WithTimeout(ctx, n.engine.cfg.RPCTimeout)
			err := c.BatchCallContext(cctx, elems[i:end])
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	}
}
