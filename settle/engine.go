// Package settle is the settlement engine: it turns a verified EIP-3009 authorization into exactly
// one on-chain transfer, durably. Its rules are ARCHITECTURE.md's invariants: the ledger row and the
// signed transaction are committed before anything is broadcast; one nonce owner per signer key;
// at most one transaction family per authorization; an outcome is never reported as failed until
// the chain proves it; exactly one caller is told success.
package settle

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Verifier is what the engine needs of verify.
type Verifier interface {
	Route(p *facilitator.Payment) (*facilitator.Network, error)
	// SettleCheck is verify's settle-path check: the verdict, the gas estimate, and whether the
	// payer's address holds code (wallet: a contract wallet, whose settlement is never batched).
	SettleCheck(ctx context.Context, p *facilitator.Payment, signer common.Address) (res facilitator.VerifyResponse, gas uint64, wallet bool, err error)
}

// Observer hears what the engine does that operators count (metrics). Its methods are called on
// the engine's goroutines and must not block.
type Observer interface {
	// FeeBumped: an unmined transaction was replaced with higher fees.
	FeeBumped(network string)
	// NonceGap: a signer's nonce was not what this process expected. kind is NonceResync (the
	// node's pending nonce or the ledger moved it on a reload), NonceUsed (a node refused a send
	// as nonce too low), NonceTaken (the ledger already held the nonce) or NonceForeign (a
	// transaction that is not ours took a settlement's nonce; it was re-signed with a new one).
	NonceGap(network, signer, kind string)
	// Disagreement: two RPC endpoints of the network answered a corroborated read differently;
	// nothing was decided from it.
	Disagreement(network string)
	// Beat: loop (LoopWatch, LoopBroadcast, LoopBalance) finished an iteration on network at at.
	// A loop that is stuck stops beating, which an alert on the beat's age sees; a flag the
	// stuck loop would have to clear itself could not say so.
	Beat(loop, network string, at time.Time)
	// Adopted: a mined transaction of signer's that the ledger lacked (it lost its newest
	// commits: a failover, a restore) was recorded as the settlement of each authorization it
	// used.
	Adopted(network, signer string)
}

// The loops that beat.
const (
	LoopWatch     = "settle_watch"
	LoopBroadcast = "settle_broadcast"
	LoopBalance   = "settle_balance"
)

// NonceGap kinds.
const (
	NonceResync  = "resync"
	NonceUsed    = "nonce_used"
	NonceTaken   = "nonce_taken"
	NonceForeign = "foreign"
)

type noObserver struct{}

func (noObserver) FeeBumped(string)                {}
func (noObserver) NonceGap(string, string, string) {}
func (noObserver) Disagreement(string)             {}
func (noObserver) Beat(string, string, time.Time)  {}
func (noObserver) Adopted(string, string)          {}

// FaultPoint names a step of a settlement at which a crash test kills the process.
type FaultPoint string

// The steps crash tests stop at.
const (
	FaultBeforeCommit   FaultPoint = "before-commit"
	FaultAfterCommit    FaultPoint = "after-commit"
	FaultAfterBroadcast FaultPoint = "after-broadcast"
	FaultAfterReceipt   FaultPoint = "after-receipt"
	// FaultAfterClaim: a caller's claim of the success is recorded, its answer not yet written.
	FaultAfterClaim FaultPoint = "after-claim"
)

// NetworkConfig is one chain the engine settles on.
type NetworkConfig struct {
	Network facilitator.Network
	Chain   ethrpc.Chain
	Signers []*ecdsa.PrivateKey
	// Remote are signers whose keys live outside the process (a Clef external signer, `facilitator
	// signer`): the engine knows only their addresses. They settle beside Signers alike.
	Remote []Signer
	// Heads, when set, wakes the receipt watcher on every block the network's head subscription
	// announces (PollInterval polling goes on regardless).
	Heads Heads
	// Fees prices the network's transactions (fees.go); its nil MinTip and MaxFee take the
	// engine's MinTip and MaxFeeCap.
	Fees facilitator.FeePolicy
	// Retiring are signers of the network (of Signers or Remote) that take no new settlement:
	// what they have open is worked to the end from them (fee bumps, re-signs and resends go out
	// from the same key, at its own nonces), so that the key can be removed once it has nothing
	// open (SignerHealth.Open; docs/operating.md, rotating a signer key). With a Leaser, whichever
	// process holds such a key works it the same way, if it is configured the same.
	Retiring []common.Address
}

// Config configures the engine. Zero durations take the defaults in New.
type Config struct {
	Networks []NetworkConfig
	Store    Store
	Verifier Verifier
	// Deadline bounds one /settle: past it the answer is settlement_pending with the hash, and the
	// engine keeps going. The official resource server gives up after 90 s.
	Deadline time.Duration
	// PollInterval is how often receipts are polled.
	PollInterval time.Duration
	// RetryInterval is how soon a transaction no node accepted yet is sent again.
	RetryInterval time.Duration
	// RebroadcastAfter resends an accepted but unmined transaction, in case a node dropped it.
	RebroadcastAfter time.Duration
	// BumpAfter replaces an unmined transaction with one paying 10% more (the same nonce).
	BumpAfter time.Duration
	// MaxFeeCap bounds the fee cap (gas price, on a legacy network) of every transaction of a
	// network whose fee policy sets no MaxFee (nil: unbounded).
	MaxFeeCap *big.Int
	// MinTip is the least tip offered where a network's fee policy sets none.
	MinTip *big.Int
	// MaxInFlightPerSigner bounds the unmined transactions per signer; past it /settle answers 503.
	MaxInFlightPerSigner int
	RPCTimeout           time.Duration
	// SignTimeout bounds one signing (a remote signer's round trip).
	SignTimeout time.Duration
	Logger      *slog.Logger
	Now         func() time.Time
	// Fault is called at each FaultPoint; only crash tests set it.
	Fault func(FaultPoint)
	// Leaser, when set, leases each signer key to one process at a time, so that several
	// processes can share one ledger (and the same keys): a key this process does not hold takes
	// no settlement and sends nothing. Without it every key is this process's alone: run one
	// process per database.
	Leaser Leaser
	// LeaseRetry is how often keys held elsewhere are tried again (and a held lease's hand-over
	// considered).
	LeaseRetry time.Duration
	// Observer hears fee bumps and nonce gaps; nil: nobody.
	Observer Observer
	// Limits are the per-wallet caps and the default per-key gas budget every new settlement must
	// fit; the zero value limits nothing.
	Limits facilitator.Limits
	// SignerMinBalance is the native balance (wei) below which a signer takes no new settlement;
	// nil or 0: no minimum.
	SignerMinBalance *big.Int
	// BalanceInterval is how often the signers' native balances are read.
	BalanceInterval time.Duration
	// ClaimLease is how long a caller's claim of a success holds it undecided (invariant 4): the
	// claim counts once ConfirmDelivery records its answer written; one whose process died before
	// the answer went out goes to the next identical request when its lease ends, and a retry
	// meanwhile is told settlement_pending. A claimed success not written within half of it is
	// not written at all (the caller is told pending).
	ClaimLease time.Duration
}

// beat reports that loop finished an iteration on n.
func (n *chainEngine) beat(loop string) { n.engine.cfg.Observer.Beat(loop, n.net.ID, n.engine.now()) }

// Engine settles payments. Start it before use and Stop it at shutdown.
type Engine struct {
	cfg      Config
	store    Store
	verifier Verifier
	log      *slog.Logger
	networks map[string]*chainEngine

	mu      sync.Mutex
	flights map[int64]*flight

	// The loops' lifetime: Stop cancels their context with ErrClosed as the cause and awaits
	// them (run.stop); closed refuses new settlements from then on.
	stopRun context.CancelCauseFunc
	closed  atomic.Bool

	// Claim delivery's state (claims.go). salt and claims make claim tokens (claimToken);
	// releases are claims still to be undone.
	salt     [16]byte
	claims   atomic.Uint64
	relMu    sync.Mutex
	releases []pendingRelease

	// confirms are claims whose answers were written, still to be confirmed (confirmLoop);
	// answered holds their tokens by settlement, so that a retry this process sees meanwhile is
	// told already_settled. lapsed counts the claims whose lease ended before their confirmation
	// landed: the one case in which a second caller can be told the same success.
	confMu   sync.Mutex
	confirms []pendingConfirm
	answered map[int64][]byte
	// held are the claimed successes this process handed to callers and has not heard written
	// or given back yet: a retry this process sees meanwhile waits for that rather than be told
	// pending for a few microseconds.
	held     map[int64]*heldClaim
	confKick chan struct{}
	lapsed   atomic.Uint64

	// run drives the loops and the callers' waits: live, or stepped for the simulator (run.go).
	run runner
}

// New builds an engine, live: Start runs its loops on goroutines of their own (run.go).
func New(cfg Config) (*Engine, error) {
	return build(cfg, func(e *Engine) runner { return &live{e: e} })
}

// build makes the engine's state for every network and key, driven by the runner run makes
// (run.go).
func build(cfg Config, run func(*Engine) runner) (*Engine, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.Deadline, 30*time.Second)
	def(&cfg.PollInterval, 500*time.Millisecond)
	def(&cfg.RetryInterval, time.Second)
	def(&cfg.RebroadcastAfter, 30*time.Second)
	def(&cfg.BumpAfter, 90*time.Second)
	def(&cfg.RPCTimeout, 5*time.Second)
	def(&cfg.SignTimeout, 5*time.Second)
	def(&cfg.LeaseRetry, time.Second)
	def(&cfg.BalanceInterval, 15*time.Second)
	def(&cfg.ClaimLease, 15*time.Second)
	if cfg.MaxInFlightPerSigner == 0 {
		cfg.MaxInFlightPerSigner = 128
	}
	if cfg.MinTip == nil {
		cfg.MinTip = big.NewInt(1)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	e := &Engine{cfg: cfg, store: cfg.Store, verifier: cfg.Verifier, log: cfg.Logger,
		networks: map[string]*chainEngine{}, flights: map[int64]*flight{}, answered: map[int64][]byte{}, held: map[int64]*heldClaim{}, confKick: make(chan struct{}, 1)}
	if _, err := rand.Read(e.salt[:]); err != nil {
		return nil, err
	}
	for _, nc := range cfg.Networks {
		if len(nc.Signers)+len(nc.Remote) == 0 {
			return nil, fmt.Errorf("settle: network %s has no signer keys", nc.Network.ID)
		}
		if err := nc.Fees.Check(); err != nil {
			return nil, fmt.Errorf("settle: network %s fees: %w", nc.Network.ID, err)
		}
		if err := nc.Network.Finality.Validate(); err != nil {
			return nil, fmt.Errorf("settle: network %s: %w", nc.Network.ID, err)
		}
		n := &chainEngine{engine: e, net: nc.Network, chain: nc.Chain, heads: nc.Heads, bumps: map[int64]bool{}, kick: make(chan struct{}, 1), marks: make(chan []int64, 64),
			feePolicy: nc.Fees.WithDefaults(cfg.MinTip, cfg.MaxFeeCap)}
		seen := map[common.Address]bool{}
		var signers []Signer
		for _, k := range nc.Signers {
			signers = append(signers, ethrpc.NewSigner(nc.Network.ChainID, k))
		}
		signers = append(signers, nc.Remote...)
		for _, sg := range signers {
			s := newSender(n, sg)
			if seen[s.addr] {
				return nil, fmt.Errorf("settle: network %s lists signer %s twice", nc.Network.ID, s.addr)
			}
			seen[s.addr] = true
			s.retiring = slices.Contains(nc.Retiring, s.addr)
			n.senders = append(n.senders, s)
		}
		for _, a := range nc.Retiring {
			if !seen[a] {
				return nil, fmt.Errorf("settle: network %s retires signer %s, which is not one of its signers", nc.Network.ID, a)
			}
		}
		n.queue = make(chan *flight, cfg.MaxInFlightPerSigner*len(n.senders))
		e.networks[nc.Network.ID] = n
	}
	e.run = run(e)
	return e, nil
}

// Start takes the signer keys (all of them without a Leaser; those no other process holds with
// one), recovers every settlement the ledger holds between signed and final for each key taken
// (rebroadcasting what the chain may not have, watching the rest: recovery.go), and starts the
// broadcasters and watchers (run.start: none for a stepped engine). With a Leaser, keys held elsewhere are taken over in the background when their
// holder goes away, with the same recovery.
func (e *Engine) Start(ctx context.Context) error {
	if e.closed.Load() {
		return facilitator.ErrClosed
	}
	initial := map[*sender]facilitator.SignerLease{}
	for _, n := range e.networks {
		for _, s := range n.senders {
			var l facilitator.SignerLease = ownLease{e.store}
			if e.cfg.Leaser != nil {
				var err error
				if l, err = e.cfg.Leaser.LeaseSigner(ctx, n.net.ID, s.addr, 0); err != nil {
					e.releaseAll(initial)
					return fmt.Errorf("settle: leasing signer %s on %s: %w", s.addr, n.net.ID, err)
				}
				if l == nil {
					e.log.Info("signer key held by another process; waiting to take it over", "network", n.net.ID, "signer", s.addr)
					continue
				}
			}
			if err := e.takeKey(ctx, s, l); err != nil {
				l.Release()
				if e.cfg.Leaser != nil && ctx.Err() == nil {
					// The key's recovery reads its chain: a network whose RPC does not answer yet
					// must not keep the others from starting. The lease loop takes the key again
					// every LeaseRetry, as it takes one another replica gave up.
					e.log.Warn("signer key not recovered at start; retrying it in the background", "network", n.net.ID, "signer", s.addr, "err", err)
					continue
				}
				e.releaseAll(initial)
				return err
			}
			initial[s] = l
		}
	}
	for _, n := range e.networks {
		// Before the first settlement: a key below its minimum is known as such from the start.
		n.readBalances(ctx)
	}
	// The loops outlive Start's context (a start-up deadline); Stop ends them.
	runCtx, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	e.stopRun = stop
	e.run.start(runCtx, initial)
	return nil
}

func (e *Engine) releaseAll(leases map[*sender]facilitator.SignerLease) {
	for s, l := range leases {
		e.dropKey(s, l)
		l.Release()
	}
}

// Stop ends the loops and gives the signer leases back, waiting for them until ctx ends.
// Unfinished settlements stay in the ledger; the next holder of their key resumes them. From
// Stop on, Settle answers facilitator.ErrClosed and Start does not run again; Stop may be called
// more than once.
func (e *Engine) Stop(ctx context.Context) error {
	e.closed.Store(true)
	if e.stopRun == nil {
		return nil
	}
	e.stopRun(facilitator.ErrClosed)
	return e.run.stop(ctx)
}

func (e *Engine) track(f *flight) {
	e.mu.Lock()
	e.flights[f.id] = f
	e.mu.Unlock()
}

func (e *Engine) untrack(f *flight) {
	e.mu.Lock()
	if e.flights[f.id] == f {
		delete(e.flights, f.id)
	}
	e.mu.Unlock()
}

func (e *Engine) flight(id int64) *flight {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.flights[id]
}

func (e *Engine) flightsOf(n *chainEngine) []*flight {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*flight
	for _, f := range e.flights {
		if f.sender != nil && f.sender.net == n {
			out = append(out, f)
		}
	}
	// In id order: a round reads and writes in the same order each time (the simulator replays
	// a seed exactly).
	slices.SortFunc(out, func(a, b *flight) int { return cmp.Compare(a.id, b.id) })
	return out
}

func (e *Engine) fault(p FaultPoint) {
	if e.cfg.Fault != nil {
		e.cfg.Fault(p)
	}
}

func (e *Engine) now() time.Time { return e.cfg.Now() }
