// Package reconcile closes the loops the request path cannot: settlements whose process died
// between signed and final, confirmations that arrive after the answer, authorizations used or
// canceled by someone else, and the block index's own health. Each job reads chain state (the
// index, receipts, authorizationState) and never signs anything new: at most it resends a raw
// transaction the ledger already holds.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// Store is what the jobs read and write.
type Store interface {
	StaleSettlements(ctx context.Context, network string, before time.Time, limit int) ([]facilitator.OpenSettlement, error)
	Resolve(ctx context.Context, rs []facilitator.Resolution) (moved, claimed []int64, err error)
	MarkFinal(ctx context.Context, finals []facilitator.MinedIn) ([]int64, error)
	Reopen(ctx context.Context, m facilitator.MinedIn, detail string) error
	Touch(ctx context.Context, ids []int64) error
	AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error)
	Cursor(ctx context.Context, network string) (facilitator.Block, bool, error)
	WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error)
	Commit(ctx context.Context, network string, b facilitator.IndexBatch) error
	TryLock(ctx context.Context, name string) (release func(), ok bool, err error)
	// TryLead takes a network's indexer lease when no indexer holds it.
	TryLead(ctx context.Context, network string) (release func(), ok bool, err error)
	// RecordReconcileRun writes one run's row and deletes rows beyond keep or older than keepFor.
	RecordReconcileRun(ctx context.Context, r facilitator.ReconcileRun, keep int, keepFor time.Duration) error

	// What the adoption of transactions of our keys the ledger lost reads and writes (adopt.go).
	AdoptSettlements(ctx context.Context, a facilitator.Adoption) (ids []int64, fresh bool, err error)
	SettlementByTx(ctx context.Context, tx common.Hash) (*facilitator.Settlement, error)
	NoncesHeld(ctx context.Context, network string, signer common.Address, from uint64) ([]uint64, error)
	MinedBlockBelow(ctx context.Context, network string, signer common.Address, nonce uint64) (uint64, bool, error)
	AuthorizationUsesFrom(ctx context.Context, network string, from uint64, limit int) ([]facilitator.AuthorizationEvent, error)
}

// Observer hears what the jobs do that operators count (metrics).
type Observer interface {
	// Adopted: a mined transaction of signer's that the ledger lacked was recorded from the chain.
	Adopted(network, signer string)
}

type noObserver struct{}

func (noObserver) Adopted(string, string) {}

// What the run rows keep: enough for an operator to see the last days' runs, bounded.
const (
	runsKept    = 1000
	runsKeptFor = 7 * 24 * time.Hour
	runTimeout  = 5 * time.Second
)

// Network is one chain the jobs watch; its finality rule is Network.Finality.
type Network struct {
	Network facilitator.Network
	Chain   ethrpc.Chain
	// Signers are the network's signer keys' addresses (held by any replica): a transaction one
	// of them signed is ours, whether or not the ledger still has it.
	Signers []common.Address
}

// ours reports whether one of n's signer keys is addr.
func (n Network) ours(addr common.Address) bool {
	for _, s := range n.Signers {
		if s == addr {
			return true
		}
	}
	return false
}

// Config configures the jobs.
type Config struct {
	Store    Store
	Networks []Network
	// StaleAfter is how long a settlement may go without an update before the job looks at it
	// (the engine owns fresher ones).
	StaleAfter time.Duration
	// Batch bounds how many settlements one run looks at per network (and how many indexed
	// authorization uses the look for lost transactions reads).
	Batch      int
	RPCTimeout time.Duration
	Now        func() time.Time
	Logger     *slog.Logger
	// Observer hears adoptions; nil: nobody.
	Observer Observer
}

// Jobs runs the reconcile jobs.
type Jobs struct {
	cfg Config
	log *slog.Logger
	// floors is each network's highest tagged final block answered consistently: a lower answer
	// is a node gone backwards, and says nothing.
	floors map[string]*facilitator.FinalityFloor
	// holes are the ledger's nonce holes already looked for without result (adopt.go).
	holes *scannedHoles
}

// New builds the jobs.
func New(cfg Config) *Jobs {
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = 2 * time.Minute
	}
	if cfg.Batch == 0 {
		cfg.Batch = 500
	}
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	j := &Jobs{cfg: cfg, log: cfg.Logger.With("component", "reconcile"), floors: map[string]*facilitator.FinalityFloor{},
		holes: newScannedHoles()}
	for _, n := range cfg.Networks {
		j.floors[n.Network.ID] = new(facilitator.FinalityFloor)
	}
	return j
}

// Changes counts what a run changed.
type Changes struct {
	Looked, Mined, Final, Reopened, Elsewhere, Canceled, Expired, Reverted, Resent, Rewound int
	// Adopted counts transactions of our keys the ledger lacked, recorded from the chain.
	Adopted int
}

func (c Changes) attrs() []any {
	return []any{"looked", c.Looked, "mined", c.Mined, "final", c.Final, "reopened", c.Reopened, "settled_elsewhere", c.Elsewhere,
		"canceled", c.Canceled, "expired", c.Expired, "reverted", c.Reverted, "resent", c.Resent, "index_rewound", c.Rewound, "adopted", c.Adopted}
}

// once runs job under a lock named name, so that replicas run each job once at a time.
func (j *Jobs) once(ctx context.Context, name string, job func(context.Context) (Changes, error)) (Changes, error) {
	release, ok, err := j.cfg.Store.TryLock(ctx, name)
	if err != nil {
		return Changes{}, err
	}
	if !ok {
		return Changes{}, nil // another replica is running it
	}
	defer release()
	started := j.cfg.Now()
	ch, err := job(ctx)
	j.record(ctx, name, started, ch, err)
	if err != nil {
		j.log.Warn("reconcile job failed", append([]any{"job", name, "err", err}, ch.attrs()...)...)
		return ch, err
	}
	if ch != (Changes{Looked: ch.Looked}) {
		j.log.Info("reconcile job changed settlements", append([]any{"job", name}, ch.attrs()...)...)
	}
	return ch, nil
}

// record writes the run's row for the operations overview. A failed write is logged and costs
// the run nothing: the row is a report, not a step of the job.
func (j *Jobs) record(ctx context.Context, name string, started time.Time, ch Changes, runErr error) {
	r := facilitator.ReconcileRun{Job: name, Started: started, Finished: j.cfg.Now(), Examined: ch.Looked, Changed: ch.kinds()}
	if runErr != nil {
		r.Error = runErr.Error()
	}
	// A run cut short by its bound still records itself, within a bound of its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runTimeout)
	defer cancel()
	if err := j.cfg.Store.RecordReconcileRun(ctx, r, runsKept, runsKeptFor); err != nil {
		j.log.Warn("recording a reconcile run", "job", name, "err", err)
	}
}

// kinds is what the run changed, by kind; what it did not change is absent.
func (c Changes) kinds() map[string]int {
	out := map[string]int{}
	attrs := c.attrs()
	for i := 2; i+1 < len(attrs); i += 2 { // past "looked", which is not a change
		if n := attrs[i+1].(int); n > 0 {
			out[attrs[i].(string)] = n
		}
	}
	return out
}

// Settlements resolves every settlement that has waited longer than StaleAfter, from what the
// chain shows: the index's AuthorizationUsed by (payer, nonce), our transactions' receipts, and
// the authorization's state once validBefore has passed. It moves mined settlements to final at
// depth, and back to broadcast when their transaction left the chain.
func (j *Jobs) Settlements(ctx context.Context) (Changes, error) {
	return j.once(ctx, "settlements", func(ctx context.Context) (Changes, error) {
		var total Changes
		for _, n := range j.cfg.Networks {
			ch, err := j.settlements(ctx, n)
			total = add(total, ch)
			if err != nil {
				return total, fmt.Errorf("%s: %w", n.Network.ID, err)
			}
		}
		return total, nil
	})
}

// settlements is the job on one network: it reads the stale settlements and the index's cursor,
// looks at each settlement in turn, and writes what it decided in one go at the end.
func (j *Jobs) settlements(ctx context.Context, n Network) (Changes, error) {
	adopted, err := j.adoptLost(ctx, n)
	if err != nil {
		return adopted, err
	}
	rows, err := j.cfg.Store.StaleSettlements(ctx, n.Network.ID, j.cfg.Now().Add(-j.cfg.StaleAfter), j.cfg.Batch)
	if err != nil || len(rows) == 0 {
		return adopted, err
	}
	cursor, _, err := j.cfg.Store.Cursor(ctx, n.Network.ID)
	if err != nil {
		return Changes{}, err
	}
	p := &pass{n: n, cursor: cursor, fp: j.finalPoint(ctx, n, cursor.Number), unlanded: map[int64]*facilitator.OpenSettlement{}}
	p.ch.Adopted = adopted.Adopted
	for _, row := range rows {
		if err := j.look(ctx, p, row); err != nil {
			return p.ch, err
		}
	}
	err = j.write(ctx, p) // before p.ch is read: write counts what it resends
	return p.ch, err
}

// pass is one run of the settlements job over one network: where the index stands, and what the
// run has seen and decided so far, for the writes at its end.
type pass struct {
	n      Network
	cursor facilitator.Block
	fp     facilitator.FinalPoint
	ch     Changes

	resolutions []facilitator.Resolution
	finals      []facilitator.MinedIn
	looked      []int64
	unlanded    map[int64]*facilitator.OpenSettlement // resolved without a receipt of ours
}

// terminal says whether an indexed use of the authorization decides the settlement. A terminal
// answer from the index rests on a block the index holds, the network's rule calls final, and the
// chain still has: an indexer not yet past a reorg keeps the branch it replaced, however deep its
// number.
func (j *Jobs) terminal(ctx context.Context, p *pass, u *facilitator.AuthorizationUse) bool {
	return u.BlockNumber <= p.cursor.Number && p.fp.Covers(u.BlockNumber) && j.stillInBlock(ctx, p.n, u.BlockNumber, u.BlockHash) == blockFinal
}

// look reads what the index holds of one settlement's authorization and acts on it: a mined
// settlement is checked for where its transaction is now, an open one is resolved.
func (j *Jobs) look(ctx context.Context, p *pass, row facilitator.OpenSettlement) error {
	p.ch.Looked++
	p.looked = append(p.looked, row.ID)
	ours := map[common.Hash]bool{}
	for _, t := range row.Txs {
		ours[t.Hash] = true
	}
	use, err := j.cfg.Store.AuthorizationUse(ctx, p.n.Network.ID, row.Key.Asset, row.Key.Payer, row.Key.Nonce)
	if err != nil {
		return err
	}
	decided := use != nil && j.terminal(ctx, p, use)
	if use != nil && !use.Canceled && !ours[use.TxHash] && (row.State.Open() || decided) {
		// None of the row's transactions: someone else's, or one of our key's whose record the
		// ledger lost (a failover, a restore). Then it is adopted as the row's, not answered
		// settled elsewhere.
		switch adopted, err := j.adoptUse(ctx, p, row, use); {
		case err != nil:
			return err
		case adopted:
			return nil
		}
	}
	if row.State.Succeeded() {
		return j.lookMined(ctx, p, row, use, use != nil && ours[use.TxHash], decided)
	}
	return j.lookOpen(ctx, p, row, use, use != nil && ours[use.TxHash], decided)
}

// lookMined checks a mined settlement against the index: still in its block, final, moved by a
// reorg the ledger did not see, or beaten to the authorization by another use.
func (j *Jobs) lookMined(ctx context.Context, p *pass, row facilitator.OpenSettlement, use *facilitator.AuthorizationUse, ours, decided bool) error {
	at := facilitator.MinedIn{ID: row.ID, BlockHash: row.BlockHash}
	switch {
	case use != nil && ours && (use.BlockNumber != row.BlockNumber || use.BlockHash != row.BlockHash):
		// The index has our transaction in another block than the ledger: a reorg the ledger did
		// not see moved it, or the index has not yet followed one the engine did (its use is on
		// the branch the reorg replaced). Only the chain tells which: the index's block, read twice.
		if !j.holds(ctx, p.n, use) {
			return nil
		}
		if err := j.reopen(ctx, at, "reconcile: the transaction moved to another block"); err != nil {
			return err
		}
		p.resolutions = append(p.resolutions, minedResolution(row.ID, use))
		p.ch.Reopened++
		p.ch.Mined++
	case use != nil && ours && decided:
		p.finals = append(p.finals, at)
		p.ch.Final++
	case use != nil && !ours && decided:
		// A reorg the ledger did not see put another use of the authorization (a third
		// party's transfer, the payer's cancel) before ours, which reverted there.
		if err := j.reopen(ctx, at, "reconcile: another transaction used the authorization first"); err != nil {
			return err
		}
		p.ch.Reopened++
		p.resolutions = append(p.resolutions, useResolution(row.ID, use))
		if use.Canceled {
			p.ch.Canceled++
		} else {
			p.ch.Elsewhere++
		}
	case use == nil && p.cursor.Number > row.BlockNumber:
		return j.unindexed(ctx, p, row)
	}
	return nil
}

// holds says whether the chain still has the block an indexed use is in: an index not yet past a
// reorg keeps the branch it replaced.
func (j *Jobs) holds(ctx context.Context, n Network, use *facilitator.AuthorizationUse) bool {
	fate := j.stillInBlock(ctx, n, use.BlockNumber, use.BlockHash)
	return fate == blockThere || fate == blockFinal
}

// unindexed handles a mined settlement the index is past with no use there: the block was
// reorganised away, or the index does not hold it (it started above it, or has a gap). Only the
// chain tells which: its block at that height, read twice.
func (j *Jobs) unindexed(ctx context.Context, p *pass, row facilitator.OpenSettlement) error {
	at := facilitator.MinedIn{ID: row.ID, BlockHash: row.BlockHash}
	switch j.stillInBlock(ctx, p.n, row.BlockNumber, row.BlockHash) {
	case blockGone:
		if err := j.reopen(ctx, at, "reconcile: the transaction left the canonical chain"); err != nil {
			return err
		}
		p.ch.Reopened++
		if j.resend(ctx, p.n, row) {
			p.ch.Resent++
		}
	case blockFinal:
		p.finals = append(p.finals, at)
		p.ch.Final++
	default:
		j.log.Warn("a mined settlement's block is above the index's cursor with no use indexed, and the chain still holds it (or did not answer): the index does not cover it",
			"network", p.n.Network.ID, "settlement", row.ID, "block", row.BlockNumber, "cursor", p.cursor.Number)
	}
	return nil
}

// lookOpen resolves a settlement not mined yet: from the index's use of its authorization when
// there is one, else from our transactions' receipts, else by sending its transaction again.
func (j *Jobs) lookOpen(ctx context.Context, p *pass, row facilitator.OpenSettlement, use *facilitator.AuthorizationUse, ours, decided bool) error {
	switch {
	case use != nil && !ours && !decided:
		// Someone else's use, in a block a reorg can still take away (and let ours land), or
		// one already took away: not decided yet; a later run looks again.
	case use != nil && use.Canceled:
		p.resolutions = append(p.resolutions, useResolution(row.ID, use))
		p.ch.Canceled++
		p.unlanded[row.ID] = &row
	case use != nil && ours && j.holds(ctx, p.n, use):
		p.resolutions = append(p.resolutions, minedResolution(row.ID, use))
		p.ch.Mined++
	case use != nil && !ours:
		p.resolutions = append(p.resolutions, useResolution(row.ID, use))
		p.ch.Elsewhere++
		p.unlanded[row.ID] = &row
	default:
		// No use indexed, or ours in a block the chain no longer has (the index has not followed
		// a reorg yet): the chain's receipts tell.
		res, ok, err := j.fromReceipts(ctx, p.n, &row)
		if err != nil {
			return err
		}
		if ok && res.State.Succeeded() && !slices.ContainsFunc(row.Txs, func(t facilitator.TxRecord) bool { return t.Hash == res.TxHash }) {
			// Mined by a transaction of its key that none of its records is: the ledger lost it.
			_, err := j.adoptUse(ctx, p, row, &facilitator.AuthorizationUse{TxHash: res.TxHash, BlockNumber: res.BlockNumber, BlockHash: res.BlockHash})
			return err
		}
		if ok {
			p.resolutions = append(p.resolutions, res)
			if res.TxHash == (common.Hash{}) {
				p.unlanded[row.ID] = &row
			}
			p.ch.count(res.State)
		} else if j.resend(ctx, p.n, row) {
			p.ch.Resent++
		}
	}
	return nil
}

// count adds a resolution the receipts proved to the changes, by the state it moves to.
func (c *Changes) count(s facilitator.State) {
	switch s {
	case facilitator.StateMined:
		c.Mined++
	case facilitator.StateExpired:
		c.Expired++
	case facilitator.StateSettledElsewhere:
		c.Elsewhere++
	default:
		c.Reverted++
	}
}

// write records what the pass decided: the resolutions (resending what they leave holding a
// nonce), the settlements now final, and the time every looked-at settlement was looked at.
func (j *Jobs) write(ctx context.Context, p *pass) error {
	if len(p.resolutions) > 0 {
		if _, _, err := j.cfg.Store.Resolve(ctx, p.resolutions); err != nil {
			return err
		}
		// A resolved settlement none of whose transactions landed still holds its signer's tx
		// nonce: send the signed bytes once more so that the nonce is used (the transaction can
		// only revert now), or every later transaction of the signer waits behind the gap.
		for _, r := range p.resolutions {
			if r.State.Succeeded() || p.unlanded[r.ID] == nil {
				continue
			}
			if j.resend(ctx, p.n, *p.unlanded[r.ID]) {
				p.ch.Resent++
			}
		}
	}
	if len(p.finals) > 0 {
		if _, err := j.cfg.Store.MarkFinal(ctx, p.finals); err != nil {
			return err
		}
	}
	return j.cfg.Store.Touch(ctx, p.looked)
}

// minedResolution is the outcome an indexed use by our own transaction proves: mined there.
func minedResolution(id int64, use *facilitator.AuthorizationUse) facilitator.Resolution {
	return facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: use.TxHash, BlockNumber: use.BlockNumber, BlockHash: use.BlockHash}
}

// fromReceipts resolves an open settlement the index does not know about (yet) from the chain,
// by the engine's own rules (settle.Judge): our transactions' receipts, and the authorization's
// state and use log read pinned at a block the answering node has, twice.
func (j *Jobs) fromReceipts(ctx context.Context, n Network, s *facilitator.OpenSettlement) (facilitator.Resolution, bool, error) {
	return settle.Judge(ctx, n.Chain, j.batchOn, s, n.Network.Finality, n.ours, nil, j.cfg.Now())
}

// blockFate is what the chain says of a mined settlement's recorded block.
type blockFate int

const (
	blockUnknown blockFate = iota // not read, or the reads disagree
	blockGone                     // another block (or none below the node's head) is at that height
	blockThere                    // the recorded block is there, not final yet by both reads
	blockFinal                    // the recorded block is there, final by the network's rule
)

// stillInBlock reads the chain's block at number with the node's head and finality tag, in one
// request, twice: gone only when both reads show another block there (or none below a head past
// it), final only when both show the recorded one final by both nodes' word. Absence from the
// index is not absence from the chain: an index that started above the block, or has a gap,
// holds no use of a settlement that never moved.
func (j *Jobs) stillInBlock(ctx context.Context, n Network, number uint64, hash common.Hash) blockFate {
	if hash == (common.Hash{}) {
		return blockUnknown
	}
	fin := n.Network.Finality
	read := func() (there, gone bool, point facilitator.FinalPoint, ok bool) {
		h, ok := ethrpc.ReadHeight(ctx, j.batchOn(n.Chain), number, fin)
		if !ok || h.Head < number {
			return false, false, facilitator.FinalPoint{}, false
		}
		there = h.Has(hash)
		return there, !there, h.Final, true
	}
	t1, g1, p1, ok1 := read()
	t2, g2, p2, ok2 := read()
	switch {
	case !ok1 || !ok2:
		return blockUnknown
	case g1 && g2:
		return blockGone
	case t1 && t2 && p1.Covers(number) && p2.Covers(number):
		return blockFinal
	case t1 && t2:
		return blockThere
	}
	return blockUnknown
}

// reopen moves a mined row back to broadcast; a row no longer mined in that block (the engine
// moved it first) is left as it is.
func (j *Jobs) reopen(ctx context.Context, at facilitator.MinedIn, detail string) error {
	if err := j.cfg.Store.Reopen(ctx, at, detail); err != nil && !errors.Is(err, facilitator.ErrNotFound) {
		return err
	}
	return nil
}

// useResolution is the outcome an indexed use of the authorization by someone else proves.
func useResolution(id int64, use *facilitator.AuthorizationUse) facilitator.Resolution {
	r := facilitator.Resolution{ID: id, State: facilitator.StateSettledElsewhere, TxHash: use.TxHash, BlockNumber: use.BlockNumber,
		BlockHash: use.BlockHash, ErrorReason: facilitator.ReasonNonceAlreadyUsed,
		ErrorMessage: "the authorization was used by a transaction that is not ours"}
	if use.Canceled {
		r.State, r.ErrorMessage = facilitator.StateCanceled, "the authorizer canceled the authorization"
	}
	return r
}

// resend broadcasts the settlement's latest signed transaction again: the chain may have lost it
// (a node restart, a reorg), and the raw bytes are in the ledger. It never signs anything.
func (j *Jobs) resend(ctx context.Context, n Network, s facilitator.OpenSettlement) bool {
	if len(s.Txs) == 0 {
		return false
	}
	raw := s.Txs[len(s.Txs)-1].Raw
	var h common.Hash
	ctx, cancel := context.WithTimeout(ctx, j.cfg.RPCTimeout)
	defer cancel()
	err := ethrpc.One(ctx, n.Chain, ethrpc.SendRawTransaction(raw, &h))
	if err != nil {
		j.log.Debug("resend refused", "settlement", s.ID, "err", err)
		return false
	}
	return true
}

// finalPoint is where finality stands for the index's answers, whose head is indexed. By a tag,
// the tag is read twice, each time with the answering node's head, and the lower answer counts
// (one read never decides; a read whose answer cannot be right makes nothing final); a read of
// the tag that fails falls back to depth, counted from the index's head, as with no tag.
func (j *Jobs) finalPoint(ctx context.Context, n Network, indexed uint64) facilitator.FinalPoint {
	rule := n.Network.Finality
	floor := j.floors[n.Network.ID]
	read := func() facilitator.FinalPoint {
		var head hexutil.Uint64
		elems := []rpc.BatchElem{ethrpc.BlockNumber(&head), ethrpc.TagElem(rule.Tag)}
		if err := j.batch(ctx, n, elems); err != nil || elems[0].Error != nil || !ethrpc.TagAnswer(elems[1]).OK {
			return rule.At(indexed, facilitator.TagRead{}, 0)
		}
		return floor.At(rule, uint64(head), ethrpc.TagAnswer(elems[1]))
	}
	if rule.Tag == "" {
		return rule.At(indexed, facilitator.TagRead{}, 0)
	}
	a, b := read(), read()
	if !a.Known || !b.Known {
		return facilitator.FinalPoint{Rule: a.Rule}
	}
	if b.Block < a.Block {
		return b
	}
	return a
}

func (j *Jobs) batch(ctx context.Context, n Network, elems []rpc.BatchElem) error {
	return j.batchOn(n.Chain)(ctx, elems)
}

// batchOn is batch over one chain (one endpoint of a network's, for corroborated reads).
func (j *Jobs) batchOn(c ethrpc.Chain) func(context.Context, []rpc.BatchElem) error {
	return func(ctx context.Context, elems []rpc.BatchElem) error {
		if len(elems) == 0 {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, j.cfg.RPCTimeout)
		defer cancel()
		return c.BatchCallContext(ctx, elems)
	}
}

// IndexHealth compares the index's kept blocks with the canonical chain. A kept block that is no
// longer canonical below the cursor is a reorg the indexer did not see (it was down, or not
// leading): the index is rewound to the highest kept block still canonical, and the indexer
// re-indexes from there.
func (j *Jobs) IndexHealth(ctx context.Context) (Changes, error) {
	return j.once(ctx, "index-health", func(ctx context.Context) (Changes, error) {
		var ch Changes
		for _, n := range j.cfg.Networks {
			// An indexer that is leading checks parents itself, and rewinding under it would race
			// its cursor: the check is for networks whose indexer is not running.
			release, free, err := j.cfg.Store.TryLead(ctx, n.Network.ID)
			if err != nil {
				return ch, err
			}
			if !free {
				continue
			}
			c, err := j.indexHealth(ctx, n)
			release()
			ch = add(ch, c)
			if err != nil {
				return ch, err
			}
		}
		return ch, nil
	})
}

func (j *Jobs) indexHealth(ctx context.Context, n Network) (Changes, error) {
	var ch Changes
	cur, ok, err := j.cfg.Store.Cursor(ctx, n.Network.ID)
	if err != nil || !ok {
		return ch, err
	}
	from := uint64(0)
	if cur.Number > 256 {
		from = cur.Number - 256
	}
	kept, err := j.cfg.Store.WindowBlocks(ctx, n.Network.ID, from)
	if err != nil || len(kept) == 0 {
		return ch, err
	}
	hashes := make([]*struct {
		Hash common.Hash `json:"hash"`
	}, len(kept))
	elems := make([]rpc.BatchElem, len(kept))
	for i, b := range kept {
		elems[i] = ethrpc.Block(ethrpc.At(b.Number), false, &hashes[i])
	}
	if err := j.batch(ctx, n, elems); err != nil {
		return ch, err
	}
	var good *facilitator.Block
	for i := range kept {
		if elems[i].Error != nil || hashes[i] == nil || hashes[i].Hash != kept[i].Hash {
			if good == nil {
				j.log.Error("index health: no kept block is canonical; the index needs a person", "network", n.Network.ID, "from", kept[0].Number)
				return ch, nil
			}
			if err := j.cfg.Store.Commit(ctx, n.Network.ID, facilitator.IndexBatch{RollbackTo: good, Cursor: *good}); err != nil {
				return ch, err
			}
			ch.Rewound++
			j.log.Warn("index health: rewound the index to the last canonical block", "network", n.Network.ID, "to", good.Number, "cursor_was", cur.Number)
			return ch, nil
		}
		good = &kept[i]
	}
	return ch, nil
}

func add(a, b Changes) Changes {
	return Changes{Looked: a.Looked + b.Looked, Mined: a.Mined + b.Mined, Final: a.Final + b.Final, Reopened: a.Reopened + b.Reopened,
		Elsewhere: a.Elsewhere + b.Elsewhere, Canceled: a.Canceled + b.Canceled, Expired: a.Expired + b.Expired,
		Reverted: a.Reverted + b.Reverted, Resent: a.Resent + b.Resent, Rewound: a.Rewound + b.Rewound, Adopted: a.Adopted + b.Adopted}
}
