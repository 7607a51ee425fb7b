package settle_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// The simulator's second process: the reconcile jobs and the status answers, run against the
// same ledger and chain as the engine, through backends of their own, with an index that lags
// the head. They draw from a stream of their own and their ledger calls draw no fault, so a seed's
// schedule for the engine is what it was without them; what they change (rows resolved, reopened,
// finalised under the engine) is what a replica's jobs change.

// simJobs is the jobs' and status answers' side of a world.
type simJobs struct {
	r     *rand.Rand
	on    bool
	index *settlesim.Index
	// reads is the index the jobs and status read: the stand-in index, or the real indexer's
	// (sim_index_test.go).
	reads    simIndex
	backends []*settlesim.Backend
	jobs     *reconcile.Jobs
	status   *status.Service
	// signers are every key's address, which the jobs and status are given.
	signers []common.Address
	// statusChecks counts the status answers held against the chain; statusLagged those that
	// were behind the chain without contradicting a final or terminal answer.
	statusChecks, statusLagged, runs int
}

// jobsStore is what the jobs and status read: the ledger and the index.
type jobsStore struct {
	*settlesim.Ledger
	simIndex
}

// simIndex is the index's side of what the jobs and status read.
type simIndex interface {
	Cursor(ctx context.Context, network string) (facilitator.Block, bool, error)
	AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error)
	WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error)
	Commit(ctx context.Context, network string, b facilitator.IndexBatch) error
	AuthorizationUsesFrom(ctx context.Context, network string, from uint64, limit int) ([]facilitator.AuthorizationEvent, error)
}

// plain is the world as it was before the second process and the adversaries: the engine alone.
func (w *simWorld) plain() { w.jobsSide.on, w.adversaries.on, w.indexing.on = false, false, false }

func (w *simWorld) setUpJobs() {
	j := &w.jobsSide
	j.r = rand.New(rand.NewPCG(w.seed, 0x70b5))
	j.on = j.r.IntN(3) != 0
	j.index = settlesim.NewIndex(w.chain)
	var backends []*settlesim.Backend
	for i := range 1 + j.r.IntN(2) {
		backends = append(backends, settlesim.NewBackend(w.chain, fmt.Sprintf("jobs%d", i), settlesim.Profile{}, j.r))
	}
	j.backends = backends
	chain := settlesim.NewBalancer(j.r, backends...)
	j.reads = j.index
	if w.setUpIndexer() {
		j.reads = w.indexing.store
	}
	store := jobsStore{w.ledger, j.reads}
	log := slog.New(slog.NewTextHandler(&w.log, &slog.HandlerOptions{Level: slog.LevelDebug})).With("component", "jobs")
	// Every key's address, as the service wires them: a transaction one of them signed is ours
	// even when the ledger lost its row.
	var signers []common.Address
	for _, k := range w.signers {
		signers = append(signers, crypto.PubkeyToAddress(k.PublicKey))
	}
	j.signers = signers
	j.jobs = reconcile.New(reconcile.Config{
		Store: store, Networks: []reconcile.Network{{Network: w.network, Chain: chain, Signers: signers}},
		StaleAfter: time.Duration(10+j.r.IntN(50)) * time.Second, RPCTimeout: time.Second, Now: w.clock.Now, Logger: log,
	})
	j.status = status.New(store, []status.Network{{Network: w.network, Head: chain, Timeout: time.Second, Signers: signers}}, w.clock.Now)
}

// jobsStep is, now and then, a run of the Settlements job, and a status answer held against
// the chain.
func (w *simWorld) jobsStep() error {
	j := &w.jobsSide
	if !j.on {
		return nil
	}
	if j.r.IntN(8) == 0 {
		for _, b := range j.backends {
			b.SetProfile(settlesim.RandomProfile(j.r))
		}
		j.index.SetLag(uint64(j.r.IntN(4)))
	}
	if err := w.indexerStep(); err != nil {
		return err
	}
	if j.r.IntN(6) == 0 {
		j.runs++
		if _, err := j.jobs.Settlements(settlesim.WithoutFaults(w.ctx)); err != nil {
			fmt.Fprintf(&w.log, "sim: the Settlements job: %v\n", err)
		}
	}
	if len(w.payments) > 0 && j.r.IntN(4) == 0 {
		return w.checkStatus(w.payments[j.r.IntN(len(w.payments))])
	}
	return nil
}

// checkStatus holds one status answer against the chain as it is now. A final or terminal answer
// must agree with it; a settled answer that is not final yet may name a block a reorganisation
// has since replaced (it says how many confirmations it has); unused and used are read at the
// head they name, and must be true there once that head is final; pending promises nothing.
func (w *simWorld) checkStatus(p *simPayment) error {
	j := &w.jobsSide
	a := p.p.Authorization
	key := facilitator.AuthorizationKey{Network: w.network.ID, Asset: w.chain.Token(), Payer: a.From, Nonce: a.Nonce}
	st, _, err := j.status.Authorization(settlesim.WithoutFaults(w.ctx), key)
	if err != nil {
		return nil // unavailable: an error, not an answer
	}
	j.statusChecks++
	use, used := w.chain.AuthorizationUse(a.From, a.Nonce)
	head := w.chain.Head()
	agrees := func() bool {
		return used && st.Transaction == use.TxHash.Hex() && st.BlockNumber == use.BlockNumber
	}
	wrong := func(why string) error {
		return fmt.Errorf("status of authorization %x answered %+v; %s (the chain's use: %+v, used %v, head %d)", a.Nonce[:4], st, why, use, used, head.Number)
	}
	switch st.State {
	case facilitator.StatusSettled:
		switch {
		case agrees() && use.Kind == settlesim.UseTransfer:
		case st.Final:
			return wrong("final, and the chain does not show that transfer there")
		default:
			j.statusLagged++
		}
	case facilitator.StatusCanceled:
		if !(used && use.Kind == settlesim.UseCancel) {
			if st.Final {
				return wrong("canceled and final, and the chain shows no cancel")
			}
			j.statusLagged++
		}
	case facilitator.StatusExpired:
		if (used && use.Kind == settlesim.UseTransfer) || head.Time < a.ValidBefore.Uint64() {
			return wrong("expired, and the chain shows a transfer or a time before validBefore")
		}
	case facilitator.StatusUnused:
		// Read at the head it names: a use in a block that deep and final by now was there.
		if used && use.BlockNumber <= st.Head && use.BlockNumber+w.depth <= head.Number {
			return wrong(fmt.Sprintf("unused at head %d, and the chain holds the use in a final block below it", st.Head))
		}
	case facilitator.StatusUsed:
		// Used, not known how: the chain must show a use, unless a reorganisation has since taken
		// it away (the head it was read at is not final yet).
		if !used {
			if st.Head+w.depth <= head.Number {
				return wrong(fmt.Sprintf("used at head %d, a final block, and the chain shows no use", st.Head))
			}
			j.statusLagged++
		}
	case facilitator.StatusFailed:
		// Ours failed; someone may use the authorization later, and the answer then follows the
		// index. A use the index already holds must be in the answer.
		if cur, ok, _ := j.reads.Cursor(w.ctx, w.network.ID); used && ok && use.BlockNumber <= cur.Number {
			return wrong(fmt.Sprintf("failed, and the index (cursor %d) holds the authorization's use", cur.Number))
		}
		if used {
			j.statusLagged++
		}
	}
	return nil
}

// checkStatusAtEnd is every payment's status once the world has settled down, with the index at
// the head: each must be the chain's truth.
func (w *simWorld) checkStatusAtEnd() error {
	j := &w.jobsSide
	if !j.on {
		return nil
	}
	j.index.SetLag(0)
	for _, b := range j.backends {
		b.SetProfile(settlesim.Profile{})
	}
	if err := w.indexerAtEnd(); err != nil {
		return err
	}
	ours := map[common.Hash]bool{}
	for _, r := range w.ledger.Rows() {
		for _, t := range r.Txs {
			ours[t.Hash] = true
		}
	}
	for _, p := range w.payments {
		a := p.p.Authorization
		key := facilitator.AuthorizationKey{Network: w.network.ID, Asset: w.chain.Token(), Payer: a.From, Nonce: a.Nonce}
		st, _, err := j.status.Authorization(settlesim.WithoutFaults(w.ctx), key)
		if err != nil {
			return fmt.Errorf("status of authorization %x at the end: %v", a.Nonce[:4], err)
		}
		use, used := w.chain.AuthorizationUse(a.From, a.Nonce)
		row, _ := w.ledger.SettlementByKey(settlesim.WithoutFaults(w.ctx), key)
		want := facilitator.StatusExpired
		switch {
		case used && use.Kind == settlesim.UseCancel:
			want = facilitator.StatusCanceled
		case used:
			want = facilitator.StatusSettled
		case row != nil && row.State == facilitator.StateReverted:
			want = facilitator.StatusFailed
		case row == nil:
			want = facilitator.StatusUnused
		}
		// A cancel after validBefore of an authorization the ledger found expired changes
		// nothing: no transfer could happen either way, and both answers are true.
		lateCancel := want == facilitator.StatusCanceled && row != nil && row.State == facilitator.StateExpired && st.State == facilitator.StatusExpired
		if !lateCancel && (st.State != want || (used && st.Transaction != use.TxHash.Hex())) {
			return fmt.Errorf("status of authorization %x at the end: %+v, want %s (the chain's use %+v, used %v, the row %+v)", a.Nonce[:4], st, want, use, used, row)
		}
		if used && use.Kind == settlesim.UseTransfer {
			// Ours: a transaction the ledger has, or one any of our keys signed (the service's
			// status knows every key's address, as the jobs here do).
			by := "other"
			if ours[use.TxHash] || slices.Contains(j.signers, use.Sender) {
				by = "facilitator"
			}
			if st.SettledBy != by || st.BlockNumber != use.BlockNumber || st.To != use.To.Hex() || st.Value != new(big.Int).Set(use.Value).String() {
				return fmt.Errorf("status of authorization %x at the end: %+v, want settled by %s in block %d paying %s %s", a.Nonce[:4], st, by, use.BlockNumber, use.To, use.Value)
			}
		}
	}
	return nil
}

// The adversaries: payers who drain their balance between verify and settle, so that a payment
// verified valid reverts on chain (the outcome the honest schedule almost never reaches). Drawn
// from a stream of their own; off in a plain world.
type simAdversaries struct {
	r      *rand.Rand
	on     bool
	drains int
}

func (w *simWorld) setUpAdversaries() {
	a := &w.adversaries
	a.r = rand.New(rand.NewPCG(w.seed, 0xad5e))
	a.on = a.r.IntN(2) == 0
	if a.on {
		for _, k := range w.payers {
			w.chain.Fund(crypto.PubkeyToAddress(k.PublicKey), big.NewInt(1e18)) // gas for their own transfers
		}
	}
}

// adversaryStep is, now and then, a payer moving all but a little of its balance away.
func (w *simWorld) adversaryStep() {
	a := &w.adversaries
	if !a.on || a.r.IntN(25) != 0 {
		return
	}
	k := w.payers[a.r.IntN(len(w.payers))]
	from := crypto.PubkeyToAddress(k.PublicKey)
	bal := w.chain.TokenBalance(from)
	keep := big.NewInt(int64(a.r.IntN(1000)))
	if bal.Cmp(keep) <= 0 {
		w.chain.Mint(from, big.NewInt(1_000_000)) // and back in funds, for later payments
		return
	}
	token := w.chain.Token()
	sink := common.BigToAddress(big.NewInt(0xdead))
	if _, err := w.chain.SubmitForeign(settlesim.ForeignTx{Key: k, To: &token, Data: eip3009.ERC20TransferCalldata(sink, new(big.Int).Sub(bal, keep))}); err == nil {
		a.drains++
	}
}

// Several providers, one of them lying: in a third of the worlds the engine reads and sends
// through the real ethrpc.Pool over three providers with a quorum of two, one of which invents
// receipts of transactions nobody mined, answers heads far ahead and finalized blocks that go
// backwards, on top of the faults every node has. Drawn from a stream of its own.
type simProviders struct {
	liar *settlesim.Backend
	all  []*settlesim.Backend
}

// setUpProviders builds the providers of a world that has several, and returns the engine's chain.
func (w *simWorld) setUpProviders() ethrpc.Chain {
	pr := rand.New(rand.NewPCG(w.seed, 0x9e0))
	if pr.IntN(3) != 0 {
		return w.spy
	}
	p := &w.providers
	p.all = slices.Clone(w.backends)
	for i := len(p.all); i < 3; i++ {
		p.all = append(p.all, settlesim.NewBackend(w.chain, fmt.Sprintf("prov%d", i), settlesim.Profile{}, pr))
	}
	p.liar = p.all[pr.IntN(len(p.all))]
	pool := w.serialPool(p.all, w.seed^0x9e1)
	if err := pool.SetQuorum(2); err != nil {
		panic(err)
	}
	w.backends = p.all // the world's faults reach every provider
	w.spy.Chain = pool
	return quorumSpy{w.spy, pool}
}

// serialPool is the real ethrpc.Pool over backends on the world's clock, its picks of endpoints
// replayed from seed, reaching its endpoints one after the other: its calls (and its broadcasts)
// reach the one simulated chain in a fixed order.
func (w *simWorld) serialPool(backends []*settlesim.Backend, seed uint64) *ethrpc.Pool {
	var eps []ethrpc.Endpoint
	for _, b := range backends {
		eps = append(eps, ethrpc.Endpoint{Name: b.Name(), Chain: b})
	}
	pool, err := ethrpc.NewPool(eps, nil, w.clock.Now)
	if err != nil {
		panic(err)
	}
	pool.SetSerial()
	pool.SetSeed(seed)
	return pool
}

// setProfile gives b its faults, and the liar its lies on top of them.
func (w *simWorld) setProfile(b *settlesim.Backend, p settlesim.Profile) {
	if b == w.providers.liar && b != nil {
		lies := settlesim.Lying(w.adversaries.r)
		p.InventReceipt, p.HeadAhead, p.FinalizedBack = lies.InventReceipt, lies.HeadAhead, lies.FinalizedBack
	}
	b.SetProfile(p)
}

func (w *simWorld) providerStats() {
	if w.providers.liar != nil {
		w.stats.lyingWorlds++
		w.stats.lies += w.providers.liar.Lies()
	}
}

// quorumSpy is the send spy over a pool, with the pool's quorum methods (the engine reads an
// outcome on a quorum of its chain's endpoints when the chain can name them).
type quorumSpy struct {
	*sendSpy
	pool *ethrpc.Pool
}

func (q quorumSpy) Pair() (a, b ethrpc.Chain, ok bool) { return q.pool.Pair() }
func (q quorumSpy) Endpoints() int                     { return q.pool.Endpoints() }
func (q quorumSpy) Quorum() int                        { return q.pool.Quorum() }
func (q quorumSpy) Serial() bool                       { return q.pool.Serial() }
func (q quorumSpy) Several(n int, except ...string) ([]ethrpc.Chain, bool) {
	return q.pool.Several(n, except...)
}
