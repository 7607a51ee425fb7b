// Package settle is the settlement engine: it turns a verified EIP-3009 authorization into exactly
// one on-chain transfer, durably. Its rules are ARCHITECTURE.md's invariants: the ledger row and the
// signed transaction are committed before anything is broadcast; one nonce owner per signer key;
// at most one transaction family per authorization; an outcome is never reported as failed until
// the chain proves it; exactly one caller is told success.
package settle

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"
	"golang.org/x/sync/errgroup"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
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

	// The loops' lifetime: Stop cancels runCtx with ErrClosed as the cause and awaits loops;
	// closed refuses new settlements from then on.
	stopRun context.CancelCauseFunc
	loops   *errgroup.Group
	closed  atomic.Bool

	// salt and claims make claim tokens (claimToken); releases are claims still to be undone.
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

	// stepped: no loops run; the simulator calls step, and every write the loops would make in
	// the background is made in line, so that a run is a function of its seed (sim_test.go).
	stepped bool
	// keepers are a stepped engine's lease loops, run by step in the order of the networks'
	// keys.
	keepers []*keeper
}

// step does one round of every loop's work in line, in a fixed order: keep the leases (a lost
// one dropped before anything is sent with it), close the batches the clock closes, broadcast
// what is queued, watch, and broadcast what the round queued. Only the simulator calls it
// (stepped engines).
func (e *Engine) step(ctx context.Context) {
	for _, k := range e.keepers {
		k.step(ctx)
	}
	ids := make([]string, 0, len(e.networks))
	for id := range e.networks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
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

// New builds an engine.
func New(cfg Config) (*Engine, error) {
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
			n.senders = append(n.senders, s)
		}
		n.queue = make(chan *flight, cfg.MaxInFlightPerSigner*len(n.senders))
		e.networks[nc.Network.ID] = n
	}
	return e, nil
}

// Start takes the signer keys (all of them without a Leaser; those no other process holds with
// one), recovers every settlement the ledger holds between signed and final for each key taken
// (rebroadcasting what the chain may not have, watching the rest), and starts the broadcasters
// and watchers. With a Leaser, keys held elsewhere are taken over in the background when their
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
	if e.stepped {
		// The simulator runs the loops' work itself (step), the lease loops' too.
		if e.cfg.Leaser != nil {
			ids := slices.Sorted(maps.Keys(e.networks))
			for _, id := range ids {
				for _, s := range e.networks[id].senders {
					e.keepers = append(e.keepers, &keeper{e: e, s: s, l: initial[s]})
				}
			}
		}
		return nil
	}
	// The loops never fail: each runs until runCtx ends, so the group is only awaited.
	e.loops = &errgroup.Group{}
	loop := func(f func(context.Context)) { e.loops.Go(func() error { f(runCtx); return nil }) }
	loop(e.confirmLoop)
	for _, n := range e.networks {
		loop(n.broadcastLoop)
		loop(n.balanceLoop)
		for _, s := range n.senders {
			if e.cfg.Leaser != nil {
				k := &keeper{e: e, s: s, l: initial[s]}
				loop(func(ctx context.Context) { e.leaseLoop(ctx, k) })
			}
		}
		loop(n.watchLoop)
		loop(n.followHeads)
		loop(n.markLoop)
	}
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
	if e.loops == nil {
		for _, k := range e.keepers { // a stepped engine's leases (Start made them in order)
			k.end()
		}
		e.keepers = nil
		return nil
	}
	done := make(chan struct{})
	go func() { _ = e.loops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("settle: stopping the engine: %w", context.Cause(ctx))
	}
}

// recoverLocked loads the key's next nonce and resumes its open settlements. Caller holds s.mu
// and the key's lease.
func (e *Engine) recoverLocked(ctx context.Context, s *sender) error {
	if err := s.load(ctx); err != nil {
		return fmt.Errorf("settle: %s signer %s: %w", s.net.net.ID, s.addr, err)
	}
	open, err := e.store.OpenSettlements(ctx, s.net.net.ID, s.addr)
	if err != nil {
		return fmt.Errorf("settle: loading open settlements: %w", err)
	}
	var flights []*flight
	for _, o := range open {
		if len(o.Txs) == 0 {
			continue
		}
		f, err := recovered(s, &o)
		if err != nil {
			return err
		}
		if o.State.Succeeded() {
			f.minedHash, f.block, f.blockHash = o.TxHash, o.BlockNumber, o.BlockHash
		}
		flights = append(flights, f)
	}
	closed, err := e.closedFlights(ctx, s)
	if err != nil {
		return err
	}
	// A batch's members are one family again before any of them is worked (the ledger's
	// members of one batch share the signer's tx nonce).
	linkFamilies(append(append([]*flight(nil), flights...), closed...))
	for _, f := range flights {
		e.track(f)
		if st := f.view().state; st.Open() {
			f.count(true)
			s.enqueue(f) // the chain may never have seen it: resending is harmless if it has
		}
	}
	if len(open) > 0 {
		e.log.Info("resumed open settlements", "network", s.net.net.ID, "signer", s.addr, "count", len(open), "next_nonce", s.next)
	}
	for _, f := range closed {
		e.track(f)
		s.enqueue(f)
	}
	if len(closed) > 0 {
		e.log.Warn("resending failed settlements whose tx nonces are unused, to fill the gaps", "network", s.net.net.ID, "signer", s.addr, "count", len(closed), "from_nonce", s.mined)
	}
	return nil
}

// linkFamilies makes the batched flights at each tx nonce one family.
func linkFamilies(flights []*flight) {
	byNonce := map[uint64][]*flight{}
	var nonces []uint64
	for _, f := range flights {
		if f.to != multicall3.Address {
			continue // a lone settlement (or a batch's member settled again alone)
		}
		if _, ok := byNonce[f.nonce]; !ok {
			nonces = append(nonces, f.nonce)
		}
		byNonce[f.nonce] = append(byNonce[f.nonce], f)
	}
	for _, n := range nonces {
		linkFamily(byNonce[n])
	}
}

// recovered is the flight of a ledger row of s's, with every transaction it signed.
func recovered(s *sender, o *facilitator.OpenSettlement) (*flight, error) {
	f := newFlight(o.ID, o.State)
	f.key, f.fingerprint, f.payTo, f.value, f.validBefore = o.Key, o.Fingerprint, o.PayTo, o.Value, o.ValidBefore
	f.sender, f.nonce = s, o.TxNonce
	for _, t := range o.Txs {
		f.txs = append(f.txs, &sentTx{hash: t.Hash, raw: t.Raw, fees: Fees{TipCap: t.TipCap, FeeCap: t.FeeCap}, signedAt: o.CreatedAt})
	}
	// Each variant's nonce, and gas and calldata for fee bumps from the last signed transaction.
	if err := f.restoreTemplate(); err != nil {
		return nil, fmt.Errorf("settle: settlement %d: %w", o.ID, err)
	}
	return f, nil
}

// closedFlights are the flights that resume filling the nonces of failed settlements that the chain has not used yet
// (the process that resolved them stopped, or a job resolved them while their transaction was
// lost): their transactions, which can only revert now, are resent until the nonce is used, or
// every later transaction of the key waits behind the gap. Caller holds s.mu, after s.load (which
// read the key's mined nonce).
func (e *Engine) closedFlights(ctx context.Context, s *sender) ([]*flight, error) {
	closed, err := e.store.ClosedFrom(ctx, s.net.net.ID, s.addr, s.mined)
	if err != nil {
		return nil, fmt.Errorf("settle: loading closed settlements: %w", err)
	}
	var out []*flight
	for _, o := range closed {
		if len(o.Txs) == 0 || e.flight(o.ID) != nil {
			continue
		}
		f, err := recovered(s, &o)
		if err != nil {
			return nil, err
		}
		f.closing, f.reason, f.message = true, o.ErrorReason, o.ErrorMessage
		out = append(out, f)
	}
	return out, nil
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

// Settle settles p, or reports on the settlement already made for its authorization. The error is
// non-nil only when no answer about the payment can be given (bad request, ledger or node down,
// every signer busy, or facilitator.ErrPaymentIDTaken: p's payment id was bound to another request
// since the caller looked it up, a conflict the payment-identifier service words): then nothing
// was broadcast.
func (e *Engine) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	if e.closed.Load() {
		return facilitator.SettleOutcome{}, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError,
			"this facilitator is shutting down; nothing was sent, retry", facilitator.ErrClosed)
	}
	id, err := e.verifier.Route(p)
	if err != nil {
		return facilitator.SettleOutcome{}, err
	}
	n := e.networks[id.ID]
	if n == nil {
		return facilitator.SettleOutcome{}, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network %q has no settlement signers", p.Requirements.Network)
	}
	if p.Permit2 {
		return fail(p, facilitator.ReasonUnsupportedPayloadType, "Permit2 payloads are not supported by this facilitator", common.Hash{}), nil
	}
	waitCtx, cancel := context.WithTimeout(ctx, e.cfg.Deadline)
	defer cancel()
	key := facilitator.AuthorizationKey{Network: id.ID, Asset: p.Requirements.Asset, Payer: p.Authorization.From, Nonce: p.Authorization.Nonce}
	fp := p.Fingerprint()

	existing, err := e.store.SettlementByKey(waitCtx, key)
	switch {
	case err == nil:
		return e.follow(ctx, waitCtx, p, fp, existing)
	case !errors.Is(err, facilitator.ErrNotFound):
		return facilitator.SettleOutcome{}, ledgerDown(err)
	}

	row := &facilitator.NewSettlement{
		Key: key, Fingerprint: fp, PayTo: p.Authorization.To, Value: p.Authorization.Value,
		ValidAfter: p.Authorization.ValidAfter, ValidBefore: p.Authorization.ValidBefore,
		X402Version: p.X402Version, Request: p.Body,
	}
	if row.Request == nil {
		row.Request = []byte("{}")
	}
	if p.PaymentID != "" {
		row.PaymentID = &facilitator.PaymentIDBinding{Scope: p.IDScope, ID: p.PaymentID, Fingerprint: p.IDFingerprint(), Summary: p.Summary()}
	}
	row.KeyID, row.Limits = p.KeyID, e.cfg.Limits
	data := eip3009.TransferCalldata(p.Authorization, eip3009.SettlementSignature(p.Signature))

	var (
		s      *sender
		f      *flight
		gas    uint64
		wallet bool
	)
	// A key can be handed to another process between the pick and the commit: then nothing was
	// signed with it, and another key of this process's takes the payment.
	for tries := 0; ; tries++ {
		s = n.pickSender()
		if s == nil {
			if n.leased() == 0 {
				return facilitator.SettleOutcome{}, facilitator.Unavailable(facilitator.ReasonSettlerBusy,
					"no settlement signer of this network is held by this instance right now (another instance holds them); nothing was sent, retry shortly", nil)
			}
			if n.allLow() {
				// The operator was alerted (balance.go); the balance is read again every BalanceInterval.
				return facilitator.SettleOutcome{}, &facilitator.Error{Code: facilitator.EUnavailable, Reason: facilitator.ReasonInsufficientSignerFunds,
					Message:    "every settlement signer of this network is below its minimum balance for gas; nothing was sent, retry later",
					RetryAfter: e.cfg.BalanceInterval}
			}
			return facilitator.SettleOutcome{}, facilitator.Unavailable(facilitator.ReasonSettlerBusy, "every settlement signer is at its in-flight limit; nothing was sent, retry shortly", nil)
		}
		if tries == 0 {
			res, g, w, err := e.verifier.SettleCheck(waitCtx, p, s.addr)
			if err != nil {
				return facilitator.SettleOutcome{}, err
			}
			if !res.IsValid {
				// Possibly ours, committed by a concurrent request (of this process or another)
				// since the lookup above: its transaction may even be mined already, and then the
				// simulation reverts ("authorization is used") rather than reporting the nonce used.
				if existing, err := e.store.SettlementByKey(waitCtx, key); err == nil {
					return e.follow(ctx, waitCtx, p, fp, existing)
				}
				return fail(p, res.InvalidReason, res.InvalidMessage, common.Hash{}), nil
			}
			gas, wallet = g, w
		}
		f, err = s.submit(waitCtx, row, key.Asset, data, gas, wallet)
		if !errors.Is(err, errNotLeased) || tries >= len(n.senders) {
			break
		}
	}
	if errors.Is(err, facilitator.ErrDuplicate) {
		existing, err := e.store.SettlementByKey(waitCtx, key)
		if err != nil {
			return facilitator.SettleOutcome{}, ledgerDown(err)
		}
		return e.follow(ctx, waitCtx, p, fp, existing)
	}
	if facilitator.ErrorCode(err) == facilitator.ELimited {
		e.log.Info("settlement refused by a limit; nothing was sent", "network", id.ID, "payer", key.Payer,
			"nonce", hexutil.Encode(key.Nonce[:]), "api_key", p.KeyID, "reason", facilitator.ErrorReason(err, ""))
		return facilitator.SettleOutcome{}, err
	}
	if err != nil {
		return facilitator.SettleOutcome{}, err
	}
	e.log.Info("settlement signed", f.logAttrs("network", id.ID, "signer", s.addr, "tx_nonce", f.txNonce(), "tx", f.view().hash)...)
	return e.await(ctx, waitCtx, p, f), nil
}

// follow answers a request for an authorization that already has a settlement.
func (e *Engine) follow(ctx, waitCtx context.Context, p *facilitator.Payment, fp facilitator.Fingerprint, s *facilitator.Settlement) (facilitator.SettleOutcome, error) {
	if s.Fingerprint != fp {
		// Someone else's request for the same authorization (a different signature or requirements):
		// it gets no success and does not wait.
		return fail(p, facilitator.ReasonNonceAlreadyUsed, "this authorization is already being settled from a different request", s.TxHash), nil
	}
	if f := e.flight(s.ID); f != nil {
		return e.await(ctx, waitCtx, p, f), nil
	}
	// Not ours in memory: another process's, or resolved.
	return e.poll(ctx, waitCtx, p, s)
}

// poll reads the ledger until the settlement is settled or the deadline passes.
func (e *Engine) poll(ctx, waitCtx context.Context, p *facilitator.Payment, s *facilitator.Settlement) (facilitator.SettleOutcome, error) {
	for !s.State.Succeeded() && s.State.Open() && !e.stepped {
		select {
		case <-waitCtx.Done():
			return e.answer(ctx, waitCtx, p, viewOf(s)), nil
		case <-time.After(e.cfg.PollInterval):
		}
		next, err := e.store.SettlementByID(waitCtx, s.ID)
		if err != nil {
			if waitCtx.Err() != nil {
				return e.answer(ctx, waitCtx, p, viewOf(s)), nil
			}
			return facilitator.SettleOutcome{}, ledgerDown(err)
		}
		s = next
	}
	return e.answer(ctx, waitCtx, p, viewOf(s)), nil
}

func viewOf(s *facilitator.Settlement) view {
	return view{id: s.ID, state: s.State, hash: s.TxHash, block: s.BlockNumber, reason: s.ErrorReason, message: s.ErrorMessage, delivered: s.Delivered}
}

// await waits for f's outcome within the deadline. When this process loses f's key meanwhile,
// the key's next holder finishes f: the answer then comes from the ledger.
func (e *Engine) await(ctx, waitCtx context.Context, p *facilitator.Payment, f *flight) facilitator.SettleOutcome {
	if e.stepped {
		// Nothing moves while a caller waits: the simulator answers with what is known now, and
		// its callers ask again.
		return e.answer(ctx, waitCtx, p, f.view())
	}
	// The first caller to wait offers its claim of the success, so that the watcher writes it
	// with the mined outcome (one row update for both) instead of a statement of the caller's.
	token := e.claimToken(f.id)
	offered := ctx.Err() == nil && f.offerClaim(p.KeyID, token)
	v := f.wait(waitCtx, func(v view) bool { return settled(v) || v.dropped })
	var claimed []byte
	took, at := false, time.Time{}
	if offered {
		took, at = f.takeClaim(token)
	}
	if took {
		claimed = token
	}
	if !v.dropped || settled(v) {
		return e.answerClaimed(ctx, waitCtx, p, v, claimed, at)
	}
	if claimed != nil {
		e.release(ctx, f.id, claimed) // not answered from this view: the poll below claims afresh
	}
	s, err := e.store.SettlementByID(waitCtx, f.id)
	if err != nil {
		return e.answer(ctx, waitCtx, p, v) // open: pending with the hash; the caller asks again
	}
	out, err := e.poll(ctx, waitCtx, p, s)
	if err != nil {
		return e.answer(ctx, waitCtx, p, v)
	}
	return out
}

// claimTimeout bounds recording that a caller is told success.
const claimTimeout = 5 * time.Second

// answer turns a settlement's state into the caller's answer. Success goes to exactly one caller:
// the first with the settlement's own API key to claim it while still connected.
// While another caller's claim of the success is undecided, it asks again every PollInterval
// within waitCtx: the claim is confirmed (already settled), given back, or its lease ends (its
// process died: the success is this caller's), and the official resource server, which retries
// a pending answer once without waiting, gets the outcome.
func (e *Engine) answer(ctx, waitCtx context.Context, p *facilitator.Payment, v view) facilitator.SettleOutcome {
	return e.answerClaimed(ctx, waitCtx, p, v, nil, time.Time{})
}

// answerClaimed is answer for a caller whose claim the ledger already recorded (with the mined
// outcome, in a write begun at at; token claimed, nil when none): it is answered with it, or,
// when the answer is not the success (the caller left, the settlement was reorganised meanwhile),
// gives it back.
func (e *Engine) answerClaimed(ctx, waitCtx context.Context, p *facilitator.Payment, v view, claimed []byte, at time.Time) facilitator.SettleOutcome {
	out, undecided := e.answerWith(ctx, p, v, claimed, at)
	if claimed != nil && !out.Claimed {
		e.release(ctx, v.id, claimed)
	}
	for undecided && !e.stepped {
		select {
		case <-waitCtx.Done():
			undecided = false
			continue
		case <-time.After(e.cfg.PollInterval):
		}
		out, undecided = e.answerWith(ctx, p, v, nil, time.Time{}) // v is mined: only the claim is asked again
	}
	if out.Claimed {
		e.hold(out)
		// The claim is recorded and the answer not written: a crash here must not lose the
		// success (the claim's lease ends unconfirmed, and the next identical request gets it).
		e.fault(FaultAfterClaim)
	}
	return out
}

// answerWith is one answer; undecided: it is pending only because another caller's claim of the
// success is undecided.
func (e *Engine) answerWith(ctx context.Context, p *facilitator.Payment, v view, claimed []byte, at time.Time) (out facilitator.SettleOutcome, undecided bool) {
	out = facilitator.SettleOutcome{SettlementID: v.id}
	switch {
	case v.state.Open():
		out.Response = fail(p, facilitator.ReasonSettlementPending,
			"the transaction is broadcast and has no receipt yet; send the same payload again for its outcome (do not sign a new authorization)", v.hash).Response
	case v.state.Succeeded() && v.reason != "":
		out.Response = fail(p, v.reason, v.message, v.hash).Response
	case v.state.Succeeded():
		if ctx.Err() == nil && claimed != nil {
			out.Claimed, out.Claim, out.ClaimBy = true, claimed, at.Add(e.cfg.ClaimLease/2)
		} else if ctx.Err() == nil && e.answeredHere(v.id) {
			// This process wrote the success to an earlier caller; its confirmation is on its way.
		} else if ctx.Err() == nil {
			// Not the caller's context: a claim the ledger made must come back to be released if
			// the caller leaves meanwhile. Bounded all the same, so a ledger that does not answer
			// turns into a pending answer instead of a hung request.
			claim := e.claimToken(v.id)
			at := e.now() // before the write: the lease begins after it
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
			claimed, err := e.store.ClaimDelivery(cctx, v.id, p.KeyID, claim, e.cfg.ClaimLease)
			cancel()
			if errors.Is(err, facilitator.ErrClaimUndecided) && !e.answeredHere(v.id) && e.awaitHeld(ctx, v.id) {
				// This process's own caller's answer was being written: now it is decided.
				at = e.now()
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
				claimed, err = e.store.ClaimDelivery(cctx, v.id, p.KeyID, claim, e.cfg.ClaimLease)
				cancel()
			}
			if errors.Is(err, facilitator.ErrClaimUndecided) && !e.answeredHere(v.id) {
				// Another caller's claim: its answer is being written, or its process died before
				// it did and the success comes to a retry once the claim's lease ends. Nothing was
				// written for this one.
				out.Response = fail(p, facilitator.ReasonSettlementPending,
					"the transfer is mined and another request's answer of its success is undecided; send the same payload again for the answer", v.hash).Response
				return out, true
			}
			if errors.Is(err, facilitator.ErrClaimUndecided) {
				err = nil // answered here meanwhile: already settled
			}
			if err != nil {
				// The claim may have committed all the same: then nobody would ever be told the
				// success. It is released (this claim only) before the caller, told pending,
				// asks again.
				e.log.Warn("claiming a success; answering pending", "settlement", v.id, "payer", p.Payer,
					"nonce", hexutil.Encode(p.Authorization.Nonce[:]), "tx", v.hash, "err", err)
				e.release(ctx, v.id, claim)
				out.Response = fail(p, facilitator.ReasonSettlementPending, "the transfer is mined; send the same payload again for the answer", v.hash).Response
				return out, false
			}
			out.Claimed, out.Claim = claimed, claim
			if claimed {
				out.ClaimBy = at.Add(e.cfg.ClaimLease / 2)
			}
		}
		if out.Claimed {
			out.Response = facilitator.SettleResponse{Success: true, Transaction: v.hash.Hex(), Network: p.Network, Payer: p.Payer}
		} else {
			out.Response = fail(p, facilitator.ReasonAlreadySettled,
				"this authorization was already settled and its success answered to an earlier request", v.hash).Response
		}
	case v.state == facilitator.StateCanceled:
		out.Response = fail(p, facilitator.ReasonNonceAlreadyUsed, "the authorizer canceled the authorization", common.Hash{}).Response
	case v.state == facilitator.StateSettledElsewhere:
		out.Response = fail(p, facilitator.ReasonNonceAlreadyUsed, "the authorization was used by a transaction that is not ours", common.Hash{}).Response
	default:
		out.Response = fail(p, orDefault(v.reason, facilitator.ReasonTransactionFailed), v.message, v.hash).Response
	}
	return out, false
}

// ReleaseDelivery undoes out's claimed success, whose answer never reached the caller.
func (e *Engine) ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	defer e.decide(out.SettlementID, out.Claim)
	return e.store.ReleaseDelivery(ctx, out.SettlementID, out.Claim)
}

type heldClaim struct {
	token []byte
	until time.Time // out.ClaimBy: past it the claim is not written
	done  chan struct{}
}

// hold registers out's claimed success as handed to its caller, its answer not yet written.
func (e *Engine) hold(out facilitator.SettleOutcome) {
	e.confMu.Lock()
	now := e.now()
	for id, h := range e.held {
		if now.After(h.until) {
			// Never written nor given back in time (a caller of Settle that does neither): its
			// lease decides.
			close(h.done)
			delete(e.held, id)
		}
	}
	if h := e.held[out.SettlementID]; h != nil {
		close(h.done) // a claim that lapsed unanswered: the new one is the settlement's
	}
	e.held[out.SettlementID] = &heldClaim{token: out.Claim, until: out.ClaimBy, done: make(chan struct{})}
	e.confMu.Unlock()
}

// decide ends the hold of claim on settlement id: its answer was written, or it was given back.
func (e *Engine) decide(id int64, claim []byte) {
	e.confMu.Lock()
	if h := e.held[id]; h != nil && bytes.Equal(h.token, claim) {
		close(h.done)
		delete(e.held, id)
	}
	e.confMu.Unlock()
}

// awaitHeld waits for this process's undecided claim of settlement id, if it holds one, to be
// decided, within the caller's context and the claim's own deadline; it reports whether it was.
func (e *Engine) awaitHeld(ctx context.Context, id int64) bool {
	e.confMu.Lock()
	h := e.held[id]
	e.confMu.Unlock()
	if h == nil || e.stepped {
		return false
	}
	t := time.NewTimer(h.until.Sub(e.now()))
	defer t.Stop()
	select {
	case <-h.done:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// confirmGather is how long the confirm loop waits after a written answer for others, so that a
// burst's confirmations share one statement.
const confirmGather = 10 * time.Millisecond

type pendingConfirm struct {
	d facilitator.Delivery
	// giveUp: past it the claim's lease has surely ended, and a confirmation that still cannot be
	// written is counted as lapsed.
	giveUp time.Time
	// tried is closed once the first write of it returned (nil after).
	tried chan struct{}
}

// ConfirmDelivery records that out's claimed success was written to its caller: from then on it
// counts (invariant 4). The confirmations of a burst share one statement (confirmLoop); it
// returns once its own was written (or failed: then it is retried in the background), within
// ctx and claimTimeout. Until it lands, a retry this process sees is told already_settled, and
// one another process sees is told settlement_pending.
func (e *Engine) ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	if !out.Claimed || len(out.Claim) == 0 {
		return nil
	}
	tried := make(chan struct{})
	e.confMu.Lock()
	if bytes.Equal(e.answered[out.SettlementID], out.Claim) {
		// Confirmed already, or on its way (the payment-identifier service confirms a success
		// it stored before the API writes it).
		e.confMu.Unlock()
		return nil
	}
	e.confirms = append(e.confirms, pendingConfirm{d: facilitator.Delivery{ID: out.SettlementID, Claim: out.Claim},
		giveUp: out.ClaimBy.Add(e.cfg.ClaimLease), tried: tried})
	e.answered[out.SettlementID] = out.Claim
	e.confMu.Unlock()
	e.decide(out.SettlementID, out.Claim)
	if e.stepped || e.closed.Load() {
		// No loop writes it (or none may be left to).
		e.flushConfirms(ctx)
		return nil
	}
	select {
	case e.confKick <- struct{}{}:
	default:
	}
	t := time.NewTimer(claimTimeout)
	defer t.Stop()
	select {
	case <-tried:
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// answeredHere reports whether this process wrote settlement id's success to a caller whose claim
// is not confirmed yet.
func (e *Engine) answeredHere(id int64) bool {
	e.confMu.Lock()
	defer e.confMu.Unlock()
	return e.answered[id] != nil
}

// LapsedClaims counts the claimed successes whose confirmation did not land before their lease
// could end: each may have been answered to a second caller too (invariant 4's one exception).
func (e *Engine) LapsedClaims() uint64 { return e.lapsed.Load() }

// confirmLoop writes the written answers' confirmations, and retries those the ledger refused.
func (e *Engine) confirmLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			e.flushConfirms(ctx)
			return
		case <-e.confKick:
			select {
			case <-ctx.Done():
			case <-time.After(confirmGather):
			}
		case <-t.C:
		}
		e.flushConfirms(ctx)
	}
}

// flushConfirms writes every pending confirmation in one statement.
func (e *Engine) flushConfirms(ctx context.Context) {
	e.confMu.Lock()
	todo := e.confirms
	e.confirms = nil
	e.confMu.Unlock()
	if len(todo) == 0 {
		return
	}
	ds := make([]facilitator.Delivery, len(todo))
	for i, c := range todo {
		ds[i] = c.d
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	lapsed, err := e.store.ConfirmDeliveries(cctx, ds)
	cancel()
	for i := range todo {
		if todo[i].tried != nil {
			close(todo[i].tried)
			todo[i].tried = nil
		}
	}
	var done []pendingConfirm
	if err != nil {
		e.log.Warn("confirming written successes; will retry", "count", len(ds), "err", err)
		now := e.now()
		var keep []pendingConfirm
		for _, c := range todo {
			if now.Before(c.giveUp) {
				keep = append(keep, c)
				continue
			}
			lapsed = append(lapsed, c.d.ID)
			done = append(done, c)
		}
		e.confMu.Lock()
		e.confirms = append(keep, e.confirms...)
		e.confMu.Unlock()
	} else {
		done = todo
	}
	for _, id := range lapsed {
		e.lapsed.Add(1)
		e.log.Error("a success was answered whose claim lapsed before its confirmation landed: another caller may be told the same success",
			"settlement", id)
	}
	e.confMu.Lock()
	for _, c := range done {
		if bytes.Equal(e.answered[c.d.ID], c.d.Claim) {
			delete(e.answered, c.d.ID)
		}
	}
	e.confMu.Unlock()
}

// claimToken is a token no other claim has: this process's salt, a count, and the settlement.
func (e *Engine) claimToken(id int64) []byte {
	n := e.claims.Add(1)
	return crypto.Keccak256(e.salt[:], binary.BigEndian.AppendUint64(nil, n), binary.BigEndian.AppendUint64(nil, uint64(id)))[:16]
}

// release undoes a claim whose write's outcome is unknown; while the ledger refuses, it is
// retried by the watcher (retryReleases), or the success would stay claimed by nobody.
func (e *Engine) release(ctx context.Context, id int64, claim []byte) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	err := e.store.ReleaseDelivery(rctx, id, claim)
	cancel()
	if err != nil {
		e.relMu.Lock()
		e.releases = append(e.releases, pendingRelease{id: id, claim: claim})
		e.relMu.Unlock()
	}
}

type pendingRelease struct {
	id    int64
	claim []byte
}

// retryReleases releases the claims release could not.
func (e *Engine) retryReleases(ctx context.Context) {
	e.relMu.Lock()
	todo := e.releases
	e.releases = nil
	e.relMu.Unlock()
	for _, r := range todo {
		e.release(ctx, r.id, r.claim)
	}
}

func fail(p *facilitator.Payment, reason, message string, tx common.Hash) facilitator.SettleOutcome {
	r := facilitator.SettleResponse{Success: false, ErrorReason: reason, ErrorMessage: message, Network: p.Network, Payer: p.Payer}
	if tx != (common.Hash{}) {
		r.Transaction = tx.Hex()
	}
	return facilitator.SettleOutcome{Response: r}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
