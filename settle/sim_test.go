package settle_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
)

// The simulator: the real engine, stepped (its decision core,
// its watcher rounds, its broadcaster, its recovery), driven from a seed against a simulated
// ledger that fails, commits and then errs, or is slow, and a simulated chain behind several
// backends that lag, answer null receipts, rate-limit, fail, drop answers, and reorganise with our
// transactions dropped or re-included, after third parties' transfers and payers' cancels, with
// foreign transactions on our keys. Beside it, a second process (reconcile, status: sim_jobs_test.go)
// reading an index that is, in half of those worlds, the real indexer's (sim_index_test.go: the real
// indexer.Indexer, stepped, through nodes of its own that lag, fail, drop answers, clip log ranges and
// stay on replaced branches, into settlesim.IndexStore, Postgres's index in memory, held to the chain
// by checkIndex), payers who drain their balance, a lying provider among three; and in a third of
// the worlds (not a regression seed's first, plain run) two or three replicas of the engine over the
// same ledger and chain, each behind its own nodes, leasing the keys through settlesim.Leaser, with
// calls sent to a replica drawn (now and then the same call to a second one), replicas that crash (between
// calls, or in the middle of a commit, a broadcast, a receipt or a claim) and restart, and lease
// sessions cut under a live replica (sim_replicas_test.go). Everything runs on one goroutine with a
// simulated clock (a stepped engine runs its lease loop in its step; the pool of providers reaches
// its endpoints one after the other), so a seed replays exactly (TestSimulationReplay); each new
// kind of choice draws from a stream of its own, so the main stream's schedule, and every
// regression seed, stays as it was. After each seed the invariants are checked (checkInvariants,
// checkLeases, checkStatusAtEnd, checkIndex).
//
// Payments carry their payer's real EIP-712 signature, which the simulated token checks. /verify is
// the real verify.Verifier over a real ethrpc.Reader over a node of the chain (sim_verify_test.go):
// in half the worlds that are not plain, bursts of merchants call it at once (Verify and
// SettleCheck) and their simulations go as one eth_simulateV1, and each answer is held against the
// chain at once (isValid true only for a payment that succeeds alone at a block that node could
// have read); in a third of them the engine checks what it settles with a real verifier too
// (otherwise with simVerifier, which reads the chain's head). A burst's callers run on goroutines,
// in a known order, with the world waiting, so a seed still replays exactly.
//
//	go test ./settle -run TestSimulation -sim.seeds 20000      more seeds
//	go test ./settle -run TestSimulation -sim.seed 1234 -v     replay one, with the engine's log

var (
	simSeeds = flag.Int("sim.seeds", 1000, "simulator: how many seeds to run (50 under the race detector unless set)")
	simFirst = flag.Uint64("sim.first", 1, "simulator: the first seed")
	simSeed  = flag.Uint64("sim.seed", 0, "simulator: replay this one seed (and print the engine's log)")
)

// simRegressions are the seeds that found a bug, kept forever (run before the budget, and whatever
// the seed ranges become). What each found, in the order found:
//
//	3    a fee bump whose ledger write committed but answered an error was signed again with the same
//	     fees (the same hash) and refused as a duplicate forever; then a closed settlement priced out
//	     of the pool could not be bumped; then a foreign transaction mined at our nonce and reorganised
//	     away left a gap the engine skipped over
//	4    two verdicts read at two blocks (the revert's and the cancel log's) replaced each other forever
//	6    a cancel read in a block not final yet was reorganised away and our transfer landed: a
//	     terminal "canceled" for our own payment (terminal answers now wait for the block's finality)
//	83   a bump rested on reads behind a head the engine had been told of in a round that failed
//	123  a reopen whose write answered an error left the mined variant behind: the success answered
//	     named a transaction a bump then replaced
//	154  (the invariant) a payer's cancel after validBefore of an expired authorization
//	177  (the invariant) a success answered at one confirmation whose block a reorganisation removed
//	194  a bump on reads from a node still on a branch a reorganisation replaced (bumps now read twice)
//	240  a terminal answer on two reads from a node still on a replaced branch, final by our head but
//	     not by the node's (finality of evidence now counts from the answering node's head)
//	927  a bump on reads pinned below the answering node's own head
//	300  a new settlement signed at a nonce a node behind the head counted as free
//	3449 a re-sign whose ledger write committed but answered an error was refused as a duplicate
//	     forever (the same bytes signed again)
//	4171 a bump decided on reads at a head that another step of the same round then passed
//	7065 (the invariant) a new settlement signed at a nonce a foreign transaction had taken is not a
//	     fee bump (it is refused as nonce too low and re-signed)
//	8931 a gap fill re-signed at the key's next free nonce instead of into the gap (upwards)
//	10909 a move back down to a nonce signed the settlement's first bytes again: refused as a
//	     duplicate, taken for a lost answer, and the ledger kept the old nonce (a gap)
//	17700 a re-sign whose write's answer was lost, and the read that would tell failed: the flight
//	     kept the old nonce, the row the new one, and the new one became a gap
//
// and since the second process (reconcile and status) and the adversaries (draining payers):
//
//	177  (with the jobs) a status answer "final" for a mined row whose block a reorganisation had
//	     replaced (final by the depth of the number the ledger recorded)
//	789  (a draining payer) our transaction reverted, the node answered null for its receipt twice,
//	     and the engine took its nonce for a foreign transaction's: it re-signed, and two of our
//	     transactions carried the authorization (re-signs now find the nonce's transaction in the
//	     blocks)
//	877  (with the jobs) a re-sign's ledger write committed and answered an error after the job had
//	     resolved the row settled elsewhere: the row's hash was the other party's, the engine took
//	     the move for not made, and the moved nonce was never sent (a gap)
//	2549 (with the jobs) a fee bump's ledger write committed and answered an error; the job resent
//	     the ledger's bytes, the bump was mined, and the engine, not knowing it, answered our own
//	     payment "used by a transaction that is not ours" (TestLostBumpSentElsewhereIsOurs on anvil)
//	4599 (with the jobs) status read the recorded block's hash from a node still on the branch a
//	     reorg had replaced, and answered "final" by another node's head: the block, head and tag are
//	     now read from one node in one request, and finality counts from that node's head
//	20990 a pinned read whose eth_call failed told of head 16 and was dropped whole; the next
//	     round's reads at 15 found the key's nonce unused and a fee bump went out for a nonce mined
//	     in block 16 (a head any answer tells of now counts, whatever else of it failed)
//
// and since the real indexer keeps the index the second process reads (sim_index_test.go):
//
//	120  status answered "final" for our transfer that a reorg had removed: the mined row and the
//	     index, its indexer not yet past the reorg, agreed on the replaced block (status now reads
//	     the block from a node before a final answer resting on the index; TestStatusStaleIndexNotFinal)
//	54925 20990's class again, in the round's own reads: a block read whose element failed told of
//	     head 26 and only a failed round counted its heads; a bump went out on reads at 25 for a
//	     nonce mined in block 26 (every head a round's reads told of now counts)
//	4359 the reconcile job moved a mined row back to the block a stale index had (its indexer not
//	     yet past the reorg that moved our transaction), and the engine's judgement that its own
//	     block was final then marked the row final there: status answered final in a block without
//	     the transfer (the job now reads the index's block from the chain first; MarkFinal and
//	     Reopen move a row only while it is in the block judged; TestReconcileStaleIndexKeepsTheNewBlock,
//	     the ledger contract's JudgedBlock)
//	20495 54925's class in the apply step: a bump signed on reads at 27 was sent after another
//	     step of the same round told of head 28, where the nonce was mined (a bump whose reads a
//	     later head overtook waits for the next round's)
//	23543 20495's fix moved it a round on: the bump held back went out on the resend timer, with
//	     no reads, its nonce mined in the later head by a foreign transaction (a bump not sent yet
//	     is sent only on pinned reads at the highest head seen that found the nonce unused)
//
// and since the ledger can lose its newest commits (sim_loss_test.go):
//
//	4895 the reconcile job here was given no signer addresses (the service's wiring gives every
//	     key's): a retry after the loss signed on another key than the lost settlement's, and the
//	     job took the lost transaction, of our first key, for another's and answered the payment
//	     "used by a transaction that is not ours"
//	4707 an adoption moved an open row to the lost transaction's nonce and slot but left its key:
//	     the row held a nonce of the wrong key, which nothing would send, and that key's expired
//	     settlements above it waited forever (the row now takes the transaction's key too; the
//	     ledger contract's AdoptOtherKey, TestWatcherAdoptsAnotherKeysTransaction)
//	1469 4895's class in settle.Judge, with which the reconcile job decides a row the index
//	     does not name a use for: it counted only the row's own key as ours, and resolved the
//	     retry's row settled elsewhere by the lost transaction of another of our keys; the
//	     engine's adoption was then refused every round, its flight never following the ledger
//	     (Judge now takes every key; an adoption corrects a row settled elsewhere by the very
//	     transaction, the ledger contract's AdoptCorrectsElsewhere; a refused adoption follows
//	     the ledger; TestReconcileAdoptsAnotherKeysTransactionUnindexed)
//	16150 a node that did not give the transaction the use log named (twice, final) had the
//	     watcher answer our own lost transaction "not ours": a sender that could not be read now
//	     decides nothing (TestDecide's unknown sender; status leaves settledBy out,
//	     TestStatusSettledByUnknownWhenWithheld)
//	20423 20990's class in the adoption's reads: the /settle path's look for who used an
//	     authorization read head 32 and did not count it; a bump decided on reads at 30 went out
//	     for a nonce mined in block 32 (findUse and settle.Judge, when the engine judges, now
//	     count every head they read)
var simRegressions = []uint64{3, 4, 6, 83, 123, 154, 177, 194, 240, 927, 300, 3449, 4171, 7065, 8931, 10909, 17700, 789, 877, 2549, 4599, 20990, 120, 54925, 4359, 20495, 23543, 4895, 4707, 1469, 16150, 20423}

func TestSimulation(t *testing.T) {
	seeds := slices.Clone(simRegressions)
	budget := *simSeeds
	if raceEnabled && !flagSet("sim.seeds") {
		budget = 50
	}
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	} else {
		for s := *simFirst; s < *simFirst+uint64(budget); s++ {
			seeds = append(seeds, s)
		}
	}
	began := time.Now()
	var total simStats
	// A regression seed runs first in the world it was found in (the engine alone: no second
	// process, no adversary), so that it replays its bug exactly whatever the world grows, and
	// then with everything on, as every budget seed runs.
	plain := map[uint64]bool{}
	if *simSeed == 0 {
		plain = map[uint64]bool{}
		for _, s := range simRegressions {
			plain[s] = true
		}
	}
	for i := 0; i < len(seeds); i++ {
		seed := seeds[i]
		w := newSimWorldOf(seed, facilitator.BatchPolicy{}, plain[seed])
		if plain[seed] {
			delete(plain, seed)
			i-- // and once more, with everything on
		}
		err := w.run()
		total.add(w.stats)
		if err != nil || *simSeed != 0 {
			t.Logf("engine log of seed %d:\n%s", seed, w.logTail())
		}
		if err != nil {
			t.Fatalf("seed %d: %v\nreplay: go test ./settle -run TestSimulation -sim.seed %d -v", seed, err, seed)
		}
	}
	t.Logf("%d seeds in %v: %s", len(seeds), time.Since(began).Round(time.Millisecond), total)
}

// TestSimulationReplay runs seeds twice each, of the worlds whose engines run concurrently
// with something (several replicas; a pool of providers whose broadcasts fan out), and of the
// worlds where the real indexer keeps the index: the engines' and the indexer's logs (without
// their wall-clock stamps), the counts, with replicas the leaser's journal, and with the indexer
// the index it kept must be the same, or a failing seed could not be replayed.
// Worlds retiring a key are among them: their restarts must replay too.
func TestSimulationReplay(t *testing.T) {
	var replicas, liars, indexers, retiring int
	// The first three of each kind, and three that parted before the pool's broadcasts were
	// made serial in the simulator (a liar's world, with replicas too for 233).
	kept := map[uint64]bool{178: true, 200: true, 233: true}
	for seed := uint64(1); seed < 300; seed++ {
		probe := newSimWorld(seed)
		rep, liar, ix, ret := probe.replicas.on, probe.providers.liar != nil, probe.indexing.on, probe.retiring.on
		if !(rep && replicas < 3 || liar && liars < 3 || ix && indexers < 3 || ret && retiring < 2 || kept[seed]) {
			continue
		}
		if ret {
			retiring++
		}
		if ix {
			indexers++
		}
		if rep {
			replicas++
		}
		if liar {
			liars++
		}
		var logs [2]string
		var stats [2]simStats
		var journal [2]string
		for i := range 2 {
			w := newSimWorld(seed)
			err := w.run()
			logs[i], stats[i] = wallClockless(w.log.String()), w.stats
			journal[i] = fmt.Sprint(err)
			if rep {
				journal[i] += fmt.Sprint(w.replicas.leaser.Grants(), w.replicas.leaser.Writes())
			}
			if ix {
				journal[i] += fmt.Sprint(w.indexing.store.Events(w.network.ID))
			}
		}
		if stats[0] != stats[1] || journal[0] != journal[1] {
			t.Fatalf("seed %d (replicas %v, a liar %v) ran twice: counts %+v and %+v, or the outcomes or leaser's journals differ", seed, rep, liar, stats[0], stats[1])
		}
		if logs[0] != logs[1] {
			a, b := strings.Split(logs[0], "\n"), strings.Split(logs[1], "\n")
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("seed %d (replicas %v, a liar %v) ran twice: the engines' logs part at line %d:\n%s\n%s", seed, rep, liar, i, a[i], b[i])
				}
			}
			t.Fatalf("seed %d ran twice: the engines' logs have %d and %d lines", seed, len(a), len(b))
		}
	}
	if replicas < 3 || liars < 3 || indexers < 3 || retiring < 2 {
		t.Fatalf("below seed 300: %d worlds of several replicas, %d with a liar, %d with the real indexer, %d retiring a key; want 3 of each (2 retiring)", replicas, liars, indexers, retiring)
	}
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// simStats counts what the seeds did, so that a run shows it exercised the faults.
type simStats struct {
	payments, settles, successes, pending, errors, refused  int
	reorgs, thirdParty, cancels, foreign, drops, mines      int
	mined, elsewhere, canceled, expired, reverted, resigned int
	bumps, reopened, undone                                 int
	jobRuns, statusChecks, statusLagged                     int
	drains, ourReverted                                     int
	lyingWorlds, lies                                       int
	// The worlds of several replicas: their replicas, crashes, restarts, lease sessions cut under
	// a live replica, keys taken over by another process, and calls sent to a second replica.
	replicaWorlds, replicas, crashes, midCall, restarts, cuts, takeovers, seconds int
	// lostAnswers: successes claimed whose answer never reached the merchant (the process died
	// before writing it); lostConfirms: successes the merchant read whose claim was never
	// confirmed (it died after writing it, before confirming).
	lostAnswers, lostConfirms int
	// retired: worlds whose first key was retired partway; retiredOpen: the settlements it had
	// open then, which it finished.
	retired, retiredOpen int
	// ledgerLosses: the ledger lost its newest commits (sim_loss_test.go); adopted: settlements
	// the ledger then recorded again from the chain.
	// adoptedInPlace: adopted where they were (the transaction's nonce another settlement's).
	ledgerLosses, adopted, adoptBlocked, adoptedInPlace int
	verify                                              verifyStats
	index                                               indexStats
}

func (s *simStats) add(o simStats) {
	s.payments += o.payments
	s.settles += o.settles
	s.successes += o.successes
	s.pending += o.pending
	s.errors += o.errors
	s.refused += o.refused
	s.reorgs += o.reorgs
	s.thirdParty += o.thirdParty
	s.cancels += o.cancels
	s.foreign += o.foreign
	s.drops += o.drops
	s.mines += o.mines
	s.mined += o.mined
	s.elsewhere += o.elsewhere
	s.canceled += o.canceled
	s.expired += o.expired
	s.reverted += o.reverted
	s.resigned += o.resigned
	s.bumps += o.bumps
	s.reopened += o.reopened
	s.undone += o.undone
	s.jobRuns += o.jobRuns
	s.statusChecks += o.statusChecks
	s.statusLagged += o.statusLagged
	s.drains += o.drains
	s.ourReverted += o.ourReverted
	s.lyingWorlds += o.lyingWorlds
	s.lies += o.lies
	s.lostAnswers += o.lostAnswers
	s.lostConfirms += o.lostConfirms
	s.ledgerLosses += o.ledgerLosses
	s.adopted += o.adopted
	s.adoptBlocked += o.adoptBlocked
	s.adoptedInPlace += o.adoptedInPlace
	s.verify.add(o.verify)
	s.index.add(o.index)
	s.replicaWorlds += o.replicaWorlds
	s.replicas += o.replicas
	s.crashes += o.crashes
	s.midCall += o.midCall
	s.restarts += o.restarts
	s.cuts += o.cuts
	s.takeovers += o.takeovers
	s.seconds += o.seconds
	s.retired += o.retired
	s.retiredOpen += o.retiredOpen
}

func (s simStats) String() string {
	return fmt.Sprintf("%d payments, %d settle calls (%d success, %d pending, %d errors, %d refused); chain: %d blocks, %d reorgs, "+
		"%d third-party transfers, %d cancels, %d foreign txs on our keys, %d pool drops; outcomes: %d transferred by us, %d settled elsewhere, "+
		"%d canceled, %d expired, %d reverted; %d re-signed, %d fee bumps, %d reopened; %d successes undone by a reorg; "+
		"%d reconcile runs, %d status answers held against the chain (%d behind it, none contradicting a final or terminal answer); "+
		"%d payers drained their balance; %d transactions of ours mined reverted (at most one per nonce of a settlement that did not transfer); "+
		"%d worlds with a lying provider among three (quorum 2), %d lies told; "+
		"%d successes lost before their answer, %d after it and before their confirmation; %d ledger losses of the newest commits, %d settlements adopted from the chain (%d of them where they were, %d not, their nonce another's); %s; "+
		"%d worlds of several replicas (%d replicas, %d crashes (%d in the middle of a commit, a broadcast, a receipt or a claim), %d restarts, %d lease sessions cut, %d keys taken over, %d calls sent to a second replica); %d worlds retiring a key (%d settlements open on it then, finished from it); %s",
		s.payments, s.settles, s.successes, s.pending, s.errors, s.refused, s.mines, s.reorgs, s.thirdParty, s.cancels, s.foreign, s.drops,
		s.mined, s.elsewhere, s.canceled, s.expired, s.reverted, s.resigned, s.bumps, s.reopened, s.undone, s.jobRuns, s.statusChecks, s.statusLagged, s.drains, s.ourReverted,
		s.lyingWorlds, s.lies, s.lostAnswers, s.lostConfirms, s.ledgerLosses, s.adopted, s.adoptedInPlace, s.adoptBlocked, s.verify,
		s.replicaWorlds, s.replicas, s.crashes, s.midCall, s.restarts, s.cuts, s.takeovers, s.seconds, s.retired, s.retiredOpen, s.index)
}

// simPayment is one authorization the simulated merchants ask the engine to settle.
type simPayment struct {
	p       *facilitator.Payment
	answers []facilitator.SettleResponse
}

type simWorld struct {
	seed uint64
	r    *rand.Rand
	// lost draws which claimed successes die with their process (a stream of its own: the
	// schedule drawn from r is the same with it or without).
	lost     *rand.Rand
	clock    *settlesim.Clock
	chain    *settlesim.Chain
	backends []*settlesim.Backend
	oracle   *settlesim.Backend // an honest node, for the checks
	ledger   *settlesim.Ledger
	// engine is the world's engine; in a world of several replicas, the first replica's (the
	// others, and its restarts, are in replicas).
	engine   *settle.Engine
	config   settle.Config // the engine's, for the replicas and the restarts
	network  facilitator.Network
	signers  []*ecdsa.PrivateKey
	payers   []*ecdsa.PrivateKey
	payments []*simPayment
	spy      *sendSpy
	log      bytes.Buffer
	stats    simStats
	batching batchStats // the batched seeds' own counts (sim_batch_test.go)
	ctx      context.Context
	depth    uint64 // the network's finality depth
	// final: the honest final retries are under way.
	final bool
	// conflictAfter: a reorg that can put another use of an authorization before ours happened
	// (its index in steps); successes answered before it may be undone by it.
	conflictReorgs int
	jobsSide       simJobs
	adversaries    simAdversaries
	providers      simProviders
	verifying      simVerifying
	replicas       simReplicas
	indexing       simIndexing
	retiring       simRetiring
	losses         simLosses
}

func newSimWorld(seed uint64) *simWorld { return newSimWorldWith(seed, facilitator.BatchPolicy{}) }

// newSimWorldWith is newSimWorld on a network with the batch policy given (which draws nothing
// from the seed's streams: a seed's world is the same with batching on or off).
func newSimWorldWith(seed uint64, batch facilitator.BatchPolicy) *simWorld {
	return newSimWorldOf(seed, batch, false)
}

// newSimWorldOf is newSimWorldWith, plain: the engine alone behind one load-balanced provider, as
// the world was before the second process, the adversaries and several providers (a regression
// seed found then replays exactly).
func newSimWorldOf(seed uint64, batch facilitator.BatchPolicy, plain bool) *simWorld {
	w := &simWorld{seed: seed, r: rand.New(rand.NewPCG(seed, 0x5e771e)), lost: rand.New(rand.NewPCG(seed, 0x1057)), ctx: context.Background()}
	w.clock = settlesim.NewClock(time.Unix(1_800_000_000, 0))
	// Half the worlds decide finality by the chain's "finalized" tag, which the simulated chain
	// serves finalizedDepth blocks below its head (and never reorganises below). Drawn from a
	// stream of its own, so that the main stream, and every regression seed, stays as it was.
	fr := rand.New(rand.NewPCG(seed, 0xf1a7))
	byTag := fr.IntN(2) == 0
	finalizedDepth := uint64(1 + fr.IntN(6))
	// The token checks the payments' signatures, which are real (newPayment), as verify's are.
	cc := settlesim.ChainConfig{ChainID: 1337, FixedBaseFee: w.r.IntN(2) == 0, CheckSignatures: true}
	if byTag {
		cc.FinalizedDepth = finalizedDepth
	}
	w.chain = settlesim.NewChain(cc, w.clock)
	w.network = facilitator.Network{ID: "eip155:1337", ChainID: 1337, Tokens: []facilitator.Token{{Address: w.chain.Token(), Name: "USDC", Version: "2"}}}
	for i := range 1 + w.r.IntN(3) {
		w.backends = append(w.backends, settlesim.NewBackend(w.chain, fmt.Sprintf("node%d", i), settlesim.Profile{}, w.r))
	}
	w.oracle = settlesim.NewBackend(w.chain, "oracle", settlesim.Profile{}, w.r)
	w.ledger = settlesim.NewLedger(w.clock, settlesim.LedgerFaults{}, w.r)
	key := func() *ecdsa.PrivateKey {
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(w.r.UintN(256))
		}
		b[0] |= 1
		k, err := crypto.ToECDSA(b)
		if err != nil {
			panic(err)
		}
		return k
	}
	for range 1 + w.r.IntN(2) {
		k := key()
		w.signers = append(w.signers, k)
		w.chain.Fund(crypto.PubkeyToAddress(k.PublicKey), new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18)))
	}
	for range 3 + w.r.IntN(5) {
		k := key()
		w.payers = append(w.payers, k)
		w.chain.Mint(crypto.PubkeyToAddress(k.PublicKey), big.NewInt(1_000_000_000))
	}
	w.chain.Mine()
	// Reorgs stay inside the finality window (depth − 1 blocks at most): past it no facilitator
	// can be right, and the network's depth is the operator's promise that it does not happen.
	w.depth = uint64(2 + w.r.IntN(3))
	w.network.Finality = facilitator.Finality{Depth: w.depth}
	if byTag {
		w.network.Finality.Tag = facilitator.TagFinalized
	}
	w.network.Batch = batch
	lb := settlesim.NewBalancer(w.r, w.backends...)
	w.spy = &sendSpy{Chain: lb, w: w, variants: map[spyKey][]common.Hash{}}
	var chain ethrpc.Chain = w.spy
	if !plain {
		chain = w.setUpProviders()
	}
	w.config = settle.Config{
		Networks: []settle.NetworkConfig{{Network: w.network, Chain: chain, Signers: w.signers}},
		Store:    w.ledger, Verifier: w.engineVerifier(plain),
		Deadline: time.Minute, RetryInterval: 2 * time.Second, RebroadcastAfter: 10 * time.Second,
		BumpAfter: time.Duration(20+w.r.IntN(40)) * time.Second, RPCTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&w.log, &slog.HandlerOptions{Level: slog.LevelDebug})), Now: w.clock.Now,
	}
	w.engine = w.newEngine(w.config)
	if !plain && batch.Max == 0 {
		// After every draw of the main stream's set-up: a stream of its own. Not in the batched
		// worlds, whose callers run concurrently on one engine (sim_batch_test.go).
		w.setUpReplicas()
		w.setUpRetiring()
	}
	w.setUpJobs()
	w.setUpAdversaries()
	if plain {
		w.plain()
	}
	w.setUpVerifying(plain)
	w.setUpLosses(plain)
	return w
}

// logTail is the end of the engine's log (the part that tells a failure).
func (w *simWorld) logTail() string {
	s := w.log.String()
	if len(s) > 60_000 && *simSeed == 0 { // a replay prints all of it
		s = "…" + s[len(s)-60_000:]
	}
	return s
}

func (w *simWorld) run() error {
	if err := w.startEngines(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer w.stopEngines()
	// The faults come on once the engine is up.
	for _, b := range w.backends {
		w.setProfile(b, settlesim.RandomProfile(w.r))
	}
	w.ledger.SetFaults(w.ledgerFaults())
	w.replicaFaults()
	steps := 120 + w.r.IntN(120)
	for i := range steps {
		if err := w.act(i); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		if err := w.jobsStep(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		w.adversaryStep()
		if err := w.verifyStep(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		if err := w.replicaStep(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		w.retireStep(i)
		if err := w.lossStep(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	// The end: faults off, time past every validBefore, until nothing is left to do.
	for _, b := range append(w.backends, w.verifying.engineNodes...) {
		b.SetProfile(settlesim.Profile{})
	}
	w.ledger.SetFaults(settlesim.LedgerFaults{})
	if err := w.replicasAtEnd(); err != nil {
		return err
	}
	for _, p := range w.payments {
		w.settle(p) // the merchants retry what they have no answer for
	}
	if err := w.settleDown(); err != nil {
		return err
	}
	w.final = true
	for _, p := range w.payments {
		w.settle(p) // the honest final retry: an unanswered success is owed to it
	}
	if w.losses.count > 0 {
		// A final retry can adopt a transaction the lost ledger lacked: its row is mined, and
		// the engine takes it to final.
		if err := w.settleDown(); err != nil {
			return err
		}
	}
	if err := w.checkInvariants(); err != nil {
		return err
	}
	if err := w.checkRetiring(); err != nil {
		return err
	}
	w.stats.jobRuns, w.stats.statusChecks, w.stats.statusLagged = w.jobsSide.runs, w.jobsSide.statusChecks, w.jobsSide.statusLagged
	w.stats.drains = w.adversaries.drains
	w.providerStats()
	w.stats.verify = w.verifyCounts()
	w.replicaStats()
	err := w.checkStatusAtEnd()
	w.stats.index = w.indexing.stats
	return err
}

// settleDown mines and steps, 3 s of the clock at a time, until the clock is past every
// payment's validBefore and the engine has nothing left to do.
func (w *simWorld) settleDown() error {
	last := int64(0)
	for _, p := range w.payments {
		last = max(last, p.p.Authorization.ValidBefore.Int64())
	}
	for i := 0; ; i++ {
		if err := w.replicasAtEnd(); err != nil { // a replica that died in the retries comes back
			return err
		}
		w.clock.Advance(3 * time.Second)
		w.chain.Mine()
		w.stats.mines++
		w.stepEngines()
		if err := w.jobsStep(); err != nil {
			return err
		}
		if w.quiet() && w.clock.Now().Unix() > last {
			return nil
		}
		if i == 600 {
			return fmt.Errorf("not settled down 30 simulated minutes after the end of the schedule: %s", w.openRows())
		}
	}
}

func (w *simWorld) ledgerFaults() settlesim.LedgerFaults {
	if w.r.IntN(3) == 0 {
		return settlesim.LedgerFaults{}
	}
	return settlesim.LedgerFaults{Fail: w.r.Float64() * 0.1, Ambiguous: w.r.Float64() * 0.1, Slow: w.r.Float64() * 0.1, SlowBy: time.Second}
}

// act is one step of the schedule, drawn from the seed.
func (w *simWorld) act(step int) error {
	switch x := w.r.IntN(100); {
	case x < 20:
		if len(w.payments) < 24 {
			w.settle(w.newPayment())
		}
	case x < 38:
		if len(w.payments) > 0 {
			w.settle(w.payments[w.r.IntN(len(w.payments))])
		}
	case x < 60:
		w.clock.Advance(time.Duration(1+w.r.IntN(3)) * time.Second)
		w.chain.Mine()
		w.stats.mines++
	case x < 82:
		w.clock.Advance(time.Duration(w.r.IntN(1000)) * time.Millisecond)
		w.stepEngines()
	case x < 85:
		if p := w.somePayment(); p != nil {
			a := p.p.Authorization
			if _, err := w.chain.ThirdPartyTransfer(eip3009.TransferCalldata(a, eip3009.SettlementSignature(p.p.Signature))); err == nil {
				w.stats.thirdParty++
			}
		}
	case x < 87:
		if p := w.somePayment(); p != nil {
			if _, err := w.chain.Cancel(p.p.Authorization.From, p.p.Authorization.Nonce); err == nil {
				w.stats.cancels++
			}
		}
	case x < 89:
		// A transaction on one of our keys that the engine did not sign: at the key's next mined
		// nonce (taking the slot of ours in the pool) or at its next pending one.
		k := w.signers[w.r.IntN(len(w.signers))]
		f := settlesim.ForeignTx{Key: k, Force: true}
		if w.r.IntN(2) == 0 {
			n := w.chain.Nonce(crypto.PubkeyToAddress(k.PublicKey))
			f.Nonce = &n
		}
		if _, err := w.chain.SubmitForeign(f); err == nil {
			w.stats.foreign++
		}
	case x < 93:
		policies := []settlesim.ReorgPolicy{settlesim.ReorgToPool, settlesim.ReorgDrop, settlesim.ReorgReinclude,
			settlesim.ReorgConflictTransfer, settlesim.ReorgConflictCancel}
		pol := policies[w.r.IntN(len(policies))]
		if _, err := w.chain.Reorg(1+w.r.IntN(int(w.depth-1)), pol); err == nil {
			w.stats.reorgs++
			if pol == settlesim.ReorgConflictTransfer || pol == settlesim.ReorgConflictCancel {
				w.conflictReorgs++
			}
		}
	case x < 95:
		w.chain.DropPool()
		w.stats.drops++
	case x < 98:
		b := w.backends[w.r.IntN(len(w.backends))]
		w.setProfile(b, settlesim.RandomProfile(w.r))
	default:
		w.ledger.SetFaults(w.ledgerFaults())
	}
	return nil
}

func (w *simWorld) somePayment() *simPayment {
	if len(w.payments) == 0 {
		return nil
	}
	return w.payments[w.r.IntN(len(w.payments))]
}

// signAuthorization is key's EIP-712 signature of a in the token's domain, as a payer's wallet
// makes it (v 27 or 28).
func (w *simWorld) signAuthorization(key *ecdsa.PrivateKey, a facilitator.Authorization) []byte {
	t := w.network.Tokens[0]
	digest := eip3009.AuthorizationDigest(eip3009.DomainSeparator(t.Name, t.Version, w.network.ChainID, t.Address), a)
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		panic(err)
	}
	sig[64] += 27
	return sig
}

func (w *simWorld) newPayment() *simPayment {
	payer := w.payers[w.r.IntN(len(w.payers))]
	from := crypto.PubkeyToAddress(payer.PublicKey)
	var nonce [32]byte
	for i := range nonce {
		nonce[i] = byte(w.r.UintN(256))
	}
	payTo := common.BigToAddress(big.NewInt(int64(0x1000 + w.r.IntN(4))))
	value := big.NewInt(int64(1 + w.r.IntN(1000)))
	// The 65 bytes a made-up signature once took are still drawn, so that every seed's schedule
	// stays as it was; the payment is signed for real (crypto.Sign draws nothing).
	for range 65 {
		w.r.UintN(256)
	}
	auth := facilitator.Authorization{From: from, To: payTo, Value: value, ValidAfter: big.NewInt(0),
		ValidBefore: big.NewInt(w.clock.Now().Unix() + int64(60+w.r.IntN(540))), Nonce: nonce}
	sig := w.signAuthorization(payer, auth)
	p := &facilitator.Payment{X402Version: 2, Scheme: "exact", Network: w.network.ID,
		Requirements: facilitator.Requirements{Scheme: "exact", Network: w.network.ID, Amount: value, Asset: w.chain.Token(), PayTo: payTo,
			MaxTimeoutSeconds: 60, Name: "USDC", Version: "2"},
		Authorization: auth, Signature: sig, Payer: from.Hex()}
	sp := &simPayment{p: p}
	w.payments = append(w.payments, sp)
	w.stats.payments++
	return sp
}

// settle is one merchant's /settle of p's payload (always the same payload: never re-signed), to
// a replica drawn, and now and then, at once, to another.
func (w *simWorld) settle(p *simPayment) {
	e, second := w.pickEngines()
	if e == nil {
		w.stats.settles++
		w.stats.errors++ // no replica up: the call fails, and the merchant retries
		return
	}
	w.settleTo(e, p)
	if second != nil && w.up(second) {
		if w.replicas.r.IntN(3) == 0 {
			w.stepEngines() // the second call a step later
		}
		w.replicas.seconds++
		w.settleTo(second, p)
	}
}

// settleTo is one merchant's /settle of p's payload to e; if e's replica dies in the call, the
// merchant hears nothing.
func (w *simWorld) settleTo(e *settle.Engine, p *simPayment) {
	w.guard(e, func() { w.settleOn(e, p) })
}

func (w *simWorld) settleOn(e *settle.Engine, p *simPayment) {
	w.stats.settles++
	out, err := e.Settle(w.ctx, p.p)
	if err != nil {
		w.stats.errors++
		return
	}
	res := out.Response
	if out.Claimed && !w.final {
		// The process dies between the claim and the answer, or between the answer and its
		// confirmation: the engine hears nothing more of this claim (in the final retries,
		// nobody dies).
		switch x := w.lost.IntN(100); {
		case x < 4:
			w.stats.lostAnswers++
			w.died(e)
			return // nobody was told: the success is owed to a later identical request
		case x < 6:
			w.stats.lostConfirms++
			w.stats.successes++
			p.answers = append(p.answers, res)
			w.died(e)
			return
		}
	}
	if out.Claimed {
		// The merchant read it: the claim counts (as the API confirms it once written).
		if err := e.ConfirmDelivery(w.ctx, out); err != nil {
			w.stats.errors++
		}
	}
	switch {
	case res.Success:
		w.stats.successes++
	case res.ErrorReason == facilitator.ReasonSettlementPending:
		w.stats.pending++
	default:
		w.stats.refused++
	}
	p.answers = append(p.answers, res)
}

// quiet reports whether the engine has nothing left to do: every row has its final outcome and
// no settlement is watched any more.
func (w *simWorld) quiet() bool {
	for _, r := range w.ledger.Rows() {
		if st := r.Settlement.State; st.Open() || st == facilitator.StateMined {
			return false
		}
	}
	for _, e := range w.engines() {
		if len(e.Busy()) > 0 {
			return false
		}
	}
	return true
}

func (w *simWorld) openRows() string {
	var out []string
	for _, r := range w.ledger.Rows() {
		if st := r.Settlement.State; st.Open() || st == facilitator.StateMined {
			out = append(out, fmt.Sprintf("settlement %d %s nonce %d", r.Settlement.ID, st, r.Settlement.TxNonce))
		}
	}
	for _, e := range w.engines() {
		out = append(out, e.Busy()...)
	}
	for _, k := range w.signers {
		addr := crypto.PubkeyToAddress(k.PublicKey)
		out = append(out, fmt.Sprintf("signer %s: mined nonce %d, pending %d", addr, w.chain.Nonce(addr), w.chain.PendingNonce(addr)))
		for _, r := range w.ledger.Rows() {
			if s := r.Settlement; s.Signer == addr && s.TxNonce >= w.chain.Nonce(addr) {
				out = append(out, fmt.Sprintf("settlement %d %s holds nonce %d", s.ID, s.State, s.TxNonce))
			}
		}
	}
	for _, h := range w.chain.Pool() {
		if tx, ok := w.chain.Tx(h); ok {
			out = append(out, fmt.Sprintf("pool: %s from %s nonce %d tip %s cap %s (%s)", h, tx.From, tx.Nonce, tx.Tx.GasTipCap(), tx.Tx.GasFeeCap(), tx.Source))
		}
	}
	out = append(out, fmt.Sprintf("head %d base fee %v", w.chain.Head().Number, w.chain.Head().BaseFee))
	return strings.Join(out, "; ")
}

// checkInvariants is ARCHITECTURE.md's invariants, read off the chain (the oracle) and the ledger.
func (w *simWorld) checkInvariants() error {
	ours := map[common.Hash]int64{} // every transaction of ours → its settlement
	rows := w.ledger.Rows()
	byKey := map[facilitator.AuthorizationKey]settlesim.LedgerRow{}
	signers := map[common.Address]bool{}
	for _, k := range w.signers {
		signers[crypto.PubkeyToAddress(k.PublicKey)] = true
	}
	w.stats.ledgerLosses = w.losses.count
	for _, r := range rows {
		byKey[r.Settlement.Key] = r
		for _, t := range r.Txs {
			ours[t.Hash] = r.Settlement.ID
		}
		if r.Settlement.Adopted {
			w.stats.adopted++
		}
		if r.Settlement.State == facilitator.StateReverted {
			w.stats.reverted++
		}
		for _, ev := range r.Events {
			switch ev.State {
			case "renonced":
				w.stats.resigned++
			case "bumped":
				w.stats.bumps++
			case "broadcast":
				if strings.Contains(ev.Detail, "reorganised") {
					w.stats.reopened++
				}
			}
		}
	}
	for _, spy := range w.spies() {
		if len(spy.violations) > 0 {
			return fmt.Errorf("fee bumps of mined nonces: %s", strings.Join(spy.violations, "; "))
		}
	}
	if err := w.checkLeases(); err != nil {
		return err
	}
	head := w.chain.Head()
	// Transactions that were in a block a reorganisation removed: a success answered for one of
	// them (at one confirmation, before finality) may name a transaction that no longer transfers.
	reorged := map[common.Hash]bool{}
	for _, b := range w.chain.Reorged() {
		for _, h := range b.Txs {
			reorged[h] = true
		}
	}
	for _, p := range w.payments {
		a := p.p.Authorization
		key := facilitator.AuthorizationKey{Network: w.network.ID, Asset: w.chain.Token(), Payer: a.From, Nonce: a.Nonce}
		use, used := w.chain.AuthorizationUse(a.From, a.Nonce)
		// Ours: a transaction the ledger holds, or one our key signed (the ledger may have lost it).
		byUs := used && use.Kind == settlesim.UseTransfer && (ours[use.TxHash] != 0 || signers[use.Sender])
		// At most one of our transactions mined carrying the authorization.
		carried := 0
		for _, tx := range w.chain.AuthorizationTxs(a.From, a.Nonce) {
			if tx.Mined && ours[tx.Hash] != 0 {
				carried++
			}
		}
		// A second only once the first could no longer transfer it: a batch mined without
		// transferring for it (settled again alone, once: "renonced" in its events), or a nonce a
		// foreign transaction took.
		// (A ledger that lost its commits lost the transactions it had signed: a retry may sign the
		// authorization again while the lost one is still in a pool; it reverts if the other lands.)
		if row := byKey[key]; carried > 1 && w.stats.foreign == 0 && w.losses.count == 0 && (carried > 2 || !renonced(row)) {
			return fmt.Errorf("authorization %x of %s carried by %d of our mined transactions", a.Nonce[:4], a.From, carried)
		}
		successes := 0
		for _, res := range p.answers {
			if !res.Success {
				continue
			}
			successes++
			if byUs && res.Transaction == use.TxHash.Hex() {
				// The transaction named transferred exactly this authorization's value to its payee.
				if use.To != a.To || use.Value.Cmp(a.Value) != 0 {
					return fmt.Errorf("authorization %x: success named %s, which paid %s to %s; the authorization pays %s to %s", a.Nonce[:4],
						res.Transaction, use.Value, use.To, a.Value, a.To)
				}
				continue
			}
			if reorged[common.HexToHash(res.Transaction)] {
				w.stats.undone++ // answered at one confirmation, then reorganised away: the status tells
				continue
			}
			return fmt.Errorf("authorization %x: success named %s, the chain's use is %+v (by us %v)", a.Nonce[:4], res.Transaction, use, byUs)
		}
		// No caller is told a terminal failure for an authorization our transaction used (an
		// answer given before a reorganisation put a conflicting use first aside).
		if byUs && w.conflictReorgs == 0 {
			for _, res := range p.answers {
				switch res.ErrorReason {
				case facilitator.ReasonTransactionFailed, facilitator.ReasonBatchCallFailed, facilitator.ReasonNonceAlreadyUsed, facilitator.ReasonValidBefore:
					if res.Transaction != "" {
						return fmt.Errorf("authorization %x transferred by our %s: a caller was told %s (%+v)", a.Nonce[:4], use.TxHash, res.ErrorReason, res)
					}
				}
			}
		}
		row, hasRow := byKey[key]
		switch {
		case byUs && !hasRow && w.losses.count > 0 && nonceLost(w.chain, rows, use.TxHash):
			// A transaction the lost ledger lacked, whose nonce the restarted engine gave another
			// settlement (signed while the lost one waited in a pool) that then ended there: the
			// ledger cannot adopt it at that nonce (invariant 7's key), and its callers are told
			// pending, never a failure (checked above).
			w.stats.adoptBlocked++
			continue
		case byUs && successes != 1 && !(successes == 2 && w.stats.undone > 0) &&
			!(hasRow && successes > 1 && (w.stats.lostConfirms > 0 || w.replicas.crashes > 0) && successes <= 1+row.Settlement.ClaimTakeovers) &&
			!(hasRow && successes > 1 && w.losses.count > 0 && successes <= 1+w.losses.before[p]+row.Settlement.ClaimTakeovers):
			// And a ledger that lost its commits lost the record of the successes answered before:
			// the payment's success can be answered once more after each loss.
			// The one allowed exception: a success answered, its claim never confirmed (its
			// process died: the world's lost confirmations, or a replica crashed with its
			// confirmation still to be written), then taken over by a retry once its lease ended,
			// counted on the row.
			return fmt.Errorf("authorization %x transferred by us in %s: %d successes answered, want exactly 1 (takeovers %d; answers %+v)",
				a.Nonce[:4], use.TxHash, successes, row.Settlement.ClaimTakeovers, p.answers)
		case !byUs && successes > 1 && w.stats.undone == 0:
			return fmt.Errorf("authorization %x: %d successes", a.Nonce[:4], successes)
		case byUs && !hasRow:
			return fmt.Errorf("authorization %x transferred by our %s with no ledger row", a.Nonce[:4], use.TxHash)
		}
		if !hasRow {
			continue
		}
		s := row.Settlement
		if info, ok := w.chain.Tx(s.TxHash); ok && s.State.Succeeded() && info.Call != nil {
			// Mined by a lone transaction after a batch of ours carrying it was mined.
			for _, tx := range w.chain.AuthorizationTxs(a.From, a.Nonce) {
				if tx.Mined && tx.Batch != nil && ours[tx.Hash] != 0 {
					w.batching.resettled++
					break
				}
			}
		}
		switch s.State {
		case facilitator.StateFinal:
			w.stats.mined++
			if !byUs || s.TxHash != use.TxHash || s.BlockHash != use.BlockHash {
				return fmt.Errorf("settlement %d final with %s block %d, the chain: %+v (by us %v)", s.ID, s.TxHash, s.BlockNumber, use, byUs)
			}
			// The row holds the key and nonce its transaction used: a row left at another key's
			// nonce (an adoption that moved it and not its key) holds that nonce with nothing to
			// send there. The one exception: adopted where it was, the transaction's place held
			// by another settlement, its own nonce used on chain.
			if info, ok := w.chain.Tx(s.TxHash); !ok || info.From != s.Signer || info.Nonce != s.TxNonce {
				if !ok || !s.Adopted || w.chain.Nonce(s.Signer) <= s.TxNonce {
					return fmt.Errorf("settlement %d final with %s, recorded at signer %s nonce %d, the chain has it from %s nonce %d",
						s.ID, s.TxHash, s.Signer, s.TxNonce, info.From, info.Nonce)
				}
				w.stats.adoptedInPlace++
			}
		case facilitator.StateSettledElsewhere:
			w.stats.elsewhere++
			if !used || use.Kind != settlesim.UseTransfer || byUs {
				return fmt.Errorf("settlement %d settled elsewhere, the chain: %+v (by us %v)", s.ID, use, byUs)
			}
		case facilitator.StateCanceled:
			w.stats.canceled++
			if !used || use.Kind != settlesim.UseCancel {
				return fmt.Errorf("settlement %d canceled, the chain: %+v (used %v)", s.ID, use, used)
			}
		case facilitator.StateExpired:
			w.stats.expired++
			// A cancel after validBefore changes nothing: no transfer can happen either way.
			if (used && use.Kind == settlesim.UseTransfer) || head.Time < a.ValidBefore.Uint64() {
				return fmt.Errorf("settlement %d expired, the chain: %+v (used %v, head time %d, validBefore %s)", s.ID, use, used, head.Time, a.ValidBefore)
			}
		case facilitator.StateReverted:
			// Ours reverted with the authorization unused; it stays usable, and a later use (a third
			// party's transfer, the payer's cancel) is the index's to tell, not the row's.
			if used && use.BlockNumber <= s.BlockNumber {
				return fmt.Errorf("settlement %d reverted, but the authorization is used: %+v (by us %v)", s.ID, use, byUs)
			}
		default:
			return fmt.Errorf("settlement %d still %s at the end", s.ID, s.State)
		}
	}
	// The gas we spend on transactions that can only revert is bounded: at most one of ours mined
	// reverted per tx nonce a settlement was signed at whose transaction did not transfer (its
	// first, and one per re-sign: fee-bumped variants share a nonce). A re-sign rests on the
	// settlement's nonce used with no receipt of ours read twice, which a node's null receipts for
	// a reverted transaction of ours can also show: then ours reverted and the re-signed one may
	// revert too (each re-sign is bounded by validBefore's margin).
	reverted := 0
	var which []string
	for _, tx := range w.chain.Txs() {
		if tx.Mined && signers[tx.From] && tx.Status == 0 {
			reverted++
			which = append(which, fmt.Sprintf("%s (nonce %d, block %d, settlement %d, %s)", tx.Hash, tx.Nonce, tx.BlockNumber, ours[tx.Hash], tx.Source))
		}
	}
	notOurs := 0 // the tx nonces our settlements were signed at whose transaction did not transfer
	for _, r := range rows {
		notOurs++
		for _, ev := range r.Events {
			if ev.State == "renonced" {
				notOurs++
			}
		}
		if u, used := w.chain.AuthorizationUse(r.Settlement.Key.Payer, r.Settlement.Key.Nonce); used && ours[u.TxHash] != 0 {
			notOurs--
		}
	}
	w.stats.ourReverted = reverted
	// (A ledger that lost commits lost the settlements whose nonces it would count.)
	if reverted > notOurs && w.losses.count == 0 {
		return fmt.Errorf("%d of our transactions mined reverted, for %d nonces of settlements that did not transfer: %s", reverted, notOurs, strings.Join(which, "; "))
	}
	// No nonce gap: every tx nonce the ledger gave a signer is used on chain.
	for _, k := range w.signers {
		addr := crypto.PubkeyToAddress(k.PublicKey)
		mined := w.chain.Nonce(addr)
		for _, r := range rows {
			if r.Settlement.Signer == addr && r.Settlement.TxNonce >= mined {
				return fmt.Errorf("nonce gap: signer %s has mined nonces below %d, settlement %d holds %d (%s)", addr, mined, r.Settlement.ID,
					r.Settlement.TxNonce, r.Settlement.State)
			}
		}
	}
	return nil
}

// simVerifier is verify's answer, read off the chain's canonical head: the engine's verifier in the
// plain worlds and most others (engineVerifier; sim_verify_test.go drives the real one).
type simVerifier struct{ w *simWorld }

func (v *simVerifier) Route(p *facilitator.Payment) (*facilitator.Network, error) {
	return &v.w.network, nil
}

func (v *simVerifier) SettleCheck(ctx context.Context, p *facilitator.Payment, signer common.Address) (facilitator.VerifyResponse, uint64, bool, error) {
	a := p.Authorization
	switch {
	case v.w.clock.Now().Unix()+6 >= a.ValidBefore.Int64():
		return facilitator.VerifyResponse{Payer: p.Payer, InvalidReason: facilitator.ReasonValidBefore}, 0, false, nil
	case v.w.chain.TokenBalance(a.From).Cmp(a.Value) < 0:
		return facilitator.VerifyResponse{Payer: p.Payer, InvalidReason: facilitator.ReasonInsufficientBalance}, 0, false, nil
	}
	if _, used := v.w.chain.AuthorizationUse(a.From, a.Nonce); used {
		return facilitator.VerifyResponse{Payer: p.Payer, InvalidReason: facilitator.ReasonNonceAlreadyUsed}, 0, false, nil
	}
	return facilitator.VerifyResponse{IsValid: true, Payer: p.Payer}, 90_000, false, nil
}

// sendSpy is the engine's chain, watching what it sends: a new variant at a nonce of ours that
// already had one is a fee bump, and must never replace a transaction whose nonce was mined at
// a block the engine had already been told of.
type sendSpy struct {
	ethrpc.Chain
	w          *simWorld
	replica    string // the replica sending through it ("" in a world of one engine)
	maxHead    uint64 // the highest head any answer told the engine of
	variants   map[spyKey][]common.Hash
	violations []string
}

type spyKey struct {
	from  common.Address
	nonce uint64
}

func (s *sendSpy) CallContext(ctx context.Context, result any, method string, args ...any) error {
	s.sends(method, args)
	err := s.Chain.CallContext(ctx, result, method, args...)
	if h, ok := result.(*hexutil.Uint64); ok && err == nil && method == "eth_blockNumber" {
		s.saw(uint64(*h))
	}
	return err
}

func (s *sendSpy) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	for _, el := range b {
		s.sends(el.Method, el.Args)
	}
	err := s.Chain.BatchCallContext(ctx, b)
	for _, el := range b {
		if h, ok := el.Result.(*hexutil.Uint64); ok && err == nil && el.Error == nil && el.Method == "eth_blockNumber" {
			s.saw(uint64(*h))
		}
	}
	return err
}

// isBump reports whether the ledger recorded h as a fee-bumped replacement (the write before its
// broadcast).
func (s *sendSpy) isBump(h common.Hash) bool {
	for _, row := range s.w.ledger.Rows() { // the oracle's read: no faults, no draw from the seed
		for _, ev := range row.Events {
			if ev.State == "bumped" && strings.Contains(ev.Detail, h.Hex()) {
				return true
			}
		}
	}
	return false
}

func (s *sendSpy) saw(head uint64) {
	if head > s.maxHead {
		s.maxHead = head
		fmt.Fprintf(&s.w.log, "sim: the engine %swas told of head %d\n", s.replica, head)
	}
}

func (s *sendSpy) sends(method string, args []any) {
	if method != "eth_sendRawTransaction" || len(args) != 1 {
		return
	}
	raw, ok := args[0].(hexutil.Bytes)
	if !ok {
		return
	}
	var tx types.Transaction
	if tx.UnmarshalBinary(raw) != nil {
		return
	}
	from, err := types.Sender(types.LatestSignerForChainID(big.NewInt(1337)), &tx)
	if err != nil {
		return
	}
	k := spyKey{from, tx.Nonce()}
	s.w.replicas.sent(s.replica, k, tx.Hash())
	known := s.variants[k]
	if slices.Contains(known, tx.Hash()) {
		return
	}
	s.variants[k] = append(known, tx.Hash())
	if len(known) == 0 || !s.isBump(tx.Hash()) {
		return // the first of the nonce, or a new settlement or a re-sign there (not a replacement)
	}
	if w := s.w.replicas; w.on && w.resentBump(strings.TrimSpace(s.replica), from, tx.Hash()) {
		return // a bump written under another lease, resent from the ledger by the key's next holder (its recovery)
	}
	// A replacement: was the nonce already mined at the highest head the engine knew?
	var count hexutil.Uint64
	if err := s.w.oracle.CallContext(context.Background(), &count, "eth_getTransactionCount", from, hexutil.EncodeUint64(s.maxHead)); err == nil &&
		uint64(count) > tx.Nonce() {
		s.violations = append(s.violations, fmt.Sprintf("%s replaces nonce %d of %s, mined by block %d", tx.Hash(), tx.Nonce(), from, s.maxHead))
	}
}
