package settle

import (
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"

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
	// feeNeeded is what the last reading asked of a transaction (nil: none yet), for the metrics
	// (Engine.Fees): apart from feeMu, which is held across the reading's round trip, so that a
	// scrape never waits on the node.
	feeNeeded atomic.Pointer[neededFee]
	// feePolicy prices the network's transactions, its defaults applied.
	feePolicy facilitator.FeePolicy

	// bumpMu guards bumps: the flights a node called underpriced since the watcher's last round
	// (fees.go: wantBump, takeBump).
	bumpMu sync.Mutex
	bumps  map[int64]bool

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

// neededFee is the least fee cap a transaction could be mined at by one fee reading (nil when
// the reading did not tell), and when it was read.
type neededFee struct {
	least *big.Int
	at    time.Time
}

// pickSender returns the signer this process holds with the fewest transactions in flight, or
// nil when it holds none that is not retiring, or all are at the limit or below their minimum
// balance (back-pressure: the caller answers 503 with Retry-After rather than queue forever).
func (n *chainEngine) pickSender() *sender {
	var best *sender
	for _, s := range n.senders {
		if s.retiring || s.held() == nil || s.low.Load() || s.inFlight.Load() >= int64(n.engine.cfg.MaxInFlightPerSigner) {
			continue
		}
		if best == nil || s.inFlight.Load() < best.inFlight.Load() {
			best = s
		}
	}
	return best
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

// isSigner reports whether addr is one of the network's signer keys (held by this process or
// not): a transaction it signed is ours, whether or not the ledger still has it.
func (n *chainEngine) isSigner(addr common.Address) bool {
	for _, s := range n.senders {
		if s.addr == addr {
			return true
		}
	}
	return false
}

// raise sets a to v if v is higher, whoever else raises it meanwhile.
func raise(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
