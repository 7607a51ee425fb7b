package settle

import (
	"context"
	"errors"
	"math/big"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// The ledger write before the broadcast (ARCHITECTURE.md invariant 2): a key's submissions are
// signed at its next nonces and their rows committed in one ledger transaction, through the
// key's lease, and only what committed is handed to the broadcaster (enqueue, broadcast.go). Two
// entry points, one per way of signing: commitGroupLocked (each submission its own
// transaction) and commitBatchLocked (one Multicall3 transaction for all); both go through the
// same steps (commitLocked): readyLocked, sign, writeLocked, landLocked, committedLocked.

// template is the transaction a submission's row records: its own, or its batch's.
type template struct {
	to   common.Address
	data []byte
	gas  uint64
	fees Fees
	raw  []byte
}

// signedGroup is what one ledger write commits: subs[i]'s row is rows[i], recording txs[i].
type signedGroup struct {
	rows []*facilitator.NewSettlement
	subs []*submission
	txs  []template
}

// commitGroupLocked signs each of subs as its own transaction, at the key's next nonces in order,
// commits their rows in one ledger transaction (a group commit), and hands what committed to the
// broadcaster; it sets every submission's outcome. Caller holds mu. ctx carries no cancellation:
// the submissions are several callers'.
func (s *sender) commitGroupLocked(ctx context.Context, subs []*submission) {
	s.commitLocked(ctx, subs, s.signEach)
}

// commitBatchLocked signs subs as one Multicall3 transaction at the key's next nonce (one left
// alone is signed as its own), commits every member's row with it in one ledger transaction, and
// hands it to the broadcaster; it sets every submission's outcome. Caller holds mu. ctx carries
// no cancellation.
func (s *sender) commitBatchLocked(ctx context.Context, subs []*submission) {
	s.commitLocked(ctx, subs, s.signAsBatch)
}

// commitLocked is the commit both entry points share; sign is theirs. A write refused because
// the ledger holds one of the nonces already (our view of the key is stale: a commit whose
// answer was lost, another process on the key) is signed again at the next free ones, up to
// three times.
func (s *sender) commitLocked(ctx context.Context, subs []*submission, sign func(context.Context, []*submission) signedGroup) {
	e := s.net.engine
	for attempt := 0; ; attempt++ {
		l, err := s.readyLocked(ctx)
		if err != nil {
			answerAll(subs, err)
			return
		}
		g := sign(ctx, subs)
		if len(g.rows) == 0 {
			return // nothing signed: the signing's error answered every submission
		}
		e.fault(FaultBeforeCommit)
		ids, err := s.writeLocked(ctx, l, g.rows)
		if errors.Is(err, facilitator.ErrNonceTaken) && attempt < 3 {
			e.cfg.Observer.NonceGap(s.net.net.ID, s.addr.Hex(), NonceTaken)
			s.nonces.reset()
			continue
		}
		s.landLocked(ctx, subs, g, ids, err)
		return
	}
}

// readyLocked is the key's lease, with the key's nonces loaded: a commit needs both. The error
// is errNotLeased when this process does not hold the key. Caller holds mu.
func (s *sender) readyLocked(ctx context.Context) (facilitator.SignerLease, error) {
	l := s.held()
	if l == nil {
		return nil, errNotLeased
	}
	if !s.nonces.loaded {
		lctx, cancel := context.WithTimeout(ctx, s.net.engine.cfg.RPCTimeout)
		err := s.load(lctx)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	return l, nil
}

// signEach signs every submission not answered yet as its own transaction, at consecutive
// nonces from the key's next. A signing that fails answers its submission and every later one
// (a signer that failed one is down or refusing: the rest would only wait out the same timeout
// each), and none of them has a row (no row, no broadcast); its nonce goes to the next one.
func (s *sender) signEach(ctx context.Context, subs []*submission) signedGroup {
	var g signedGroup
	for i, sub := range subs {
		if sub.done {
			continue
		}
		nonce := s.next + uint64(len(g.rows))
		st, err := s.sign(ctx, nonce, sub.to, sub.data, sub.gas, sub.fees)
		if err != nil {
			s.net.engine.log.Warn("signing failed; nothing was sent", "network", s.net.net.ID, "signer", s.addr, "err", errors.Unwrap(err))
			answerAll(subs[i:], err)
			break
		}
		sub.row.Signer, sub.row.TxNonce, sub.row.BatchSlot = s.addr, nonce, 0
		sub.row.Tx = facilitator.TxRecord{Hash: st.tx.Hash(), Raw: st.raw, TipCap: sub.fees.TipCap, FeeCap: sub.fees.FeeCap, Gas: sub.gas}
		sub.row.GasReserved = new(big.Int).Mul(new(big.Int).SetUint64(sub.gas), sub.fees.FeeCap)
		g.rows, g.subs = append(g.rows, sub.row), append(g.subs, sub)
		g.txs = append(g.txs, template{to: sub.to, data: sub.data, gas: sub.gas, fees: sub.fees, raw: st.raw})
	}
	return g
}

// signAsBatch signs the submissions not answered yet as one batch (signBatch), or one left alone
// as its own transaction.
func (s *sender) signAsBatch(ctx context.Context, subs []*submission) signedGroup {
	if open := undone(subs); len(open) > 1 {
		return s.signBatch(ctx, open)
	}
	return s.signEach(ctx, subs)
}

// signBatch signs subs as one Multicall3 aggregate3 transaction at the key's next nonce, every
// call allowed to fail on its own, and makes their rows its members, slots 0..n-1. Its gas is
// what the members need by their own estimates, with Multicall3's measured cost per call
// (multicall3.NeededGas), plus the usual margin; its fees are the latest submission's. A signing
// that fails answers every member: nothing is committed or sent. Caller holds mu, with the
// nonces loaded.
func (s *sender) signBatch(ctx context.Context, subs []*submission) signedGroup {
	calls := make([]multicall3.Call, len(subs))
	estimates := make([]uint64, len(subs))
	for i, sub := range subs {
		calls[i] = multicall3.Call{Target: sub.to, AllowFailure: true, CallData: sub.data}
		estimates[i] = sub.estimate
	}
	gas := eip3009.GasLimit(multicall3.NeededGas(estimates))
	share := (gas + uint64(len(subs)) - 1) / uint64(len(subs))
	data := multicall3.Aggregate3Calldata(calls)
	fees := subs[len(subs)-1].fees
	nonce := s.next
	st, err := s.sign(ctx, nonce, multicall3.Address, data, gas, fees)
	if err != nil {
		s.net.engine.log.Warn("signing a batch failed; nothing was sent", "network", s.net.net.ID, "signer", s.addr, "count", len(subs), "err", errors.Unwrap(err))
		answerAll(subs, err)
		return signedGroup{}
	}
	tx := template{to: multicall3.Address, data: data, gas: gas, fees: fees, raw: st.raw}
	g := signedGroup{rows: make([]*facilitator.NewSettlement, len(subs)), subs: subs, txs: make([]template, len(subs))}
	for i, sub := range subs {
		sub.row.Signer, sub.row.TxNonce, sub.row.BatchSlot = s.addr, nonce, i
		sub.row.Tx = facilitator.TxRecord{Hash: st.tx.Hash(), Raw: st.raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: gas}
		// Each member reserves its share of the batch's gas against its key's budget.
		sub.row.GasReserved = new(big.Int).Mul(new(big.Int).SetUint64(share), fees.FeeCap)
		g.rows[i], g.txs[i] = sub.row, tx
	}
	return g
}

// writeLocked commits rows in one ledger transaction through the key's lease l: it fails if this
// process no longer holds the key. Nothing of them has left the process yet.
func (s *sender) writeLocked(ctx context.Context, l facilitator.SignerLease, rows []*facilitator.NewSettlement) ([]int64, error) {
	wctx, cancel := context.WithTimeout(ctx, leaseWriteTimeout)
	defer cancel()
	if len(rows) == 1 {
		id, err := l.InsertSettlement(wctx, rows[0])
		return []int64{id}, err
	}
	return l.InsertSettlements(wctx, rows)
}

// landLocked acts on the write's answer (ids, err): what committed goes on (committedLocked);
// what may have committed is found out; what did not is answered with its error.
func (s *sender) landLocked(ctx context.Context, subs []*submission, g signedGroup, ids []int64, err error) {
	e := s.net.engine
	if len(g.rows) > 1 && (errors.Is(err, facilitator.ErrDuplicate) || errors.Is(err, facilitator.ErrPaymentIDTaken) ||
		errors.Is(err, facilitator.ErrGroupRefused)) {
		// One of the group collides with a row committed meanwhile (a concurrent request for the
		// same authorization or payment id), or a limit refused one: nothing of the group was
		// written. Commit them one by one, so that only that one fails, and the others take
		// consecutive nonces (a refused row takes none).
		for _, sub := range g.subs {
			s.commitGroupLocked(ctx, []*submission{sub}) // a batch falls back to lone settlements
		}
		return
	}
	if facilitator.ErrorCode(err) == facilitator.ELimited {
		// A limit refused the row (a group's rows are refused only one by one, above): nothing
		// was written, and the nonce is not taken (s.next stays), so the signed transaction is
		// simply dropped.
		answerAll(subs, err)
		return
	}
	if err != nil && !errors.Is(err, facilitator.ErrDuplicate) && !errors.Is(err, facilitator.ErrNonceTaken) && !errors.Is(err, facilitator.ErrPaymentIDTaken) {
		// A write that timed out or lost its connection may have committed all the same: then
		// the transactions are the ledger's and must go out (an answer "nothing was sent" would
		// be false: a client that believed it would sign again and pay twice, and the nonces
		// would be a gap holding back the key's later transactions).
		switch committed, known := s.commitOutcome(ctx, g.rows); {
		case known && committed != nil:
			e.log.Warn("a settlement write reported an error but had committed; sending", "network", s.net.net.ID, "signer", s.addr, "count", len(g.rows))
			ids, err = committed, nil
		case known:
			s.nonces.reset() // re-derive the key's next nonce from the ledger next time
			err = ledgerDown(err)
		default:
			s.unknownLocked(g, err)
			return
		}
	}
	if err != nil {
		answerAll(subs, err)
		return
	}
	s.committedLocked(g, ids)
}

// unknownLocked answers the submissions of a write whose outcome is not known either way: their
// callers wait on flights that are answered pending with the hash they may land under, and the
// outcome is settled in the background (resolveUnknown, unknown.go).
func (s *sender) unknownLocked(g signedGroup, err error) {
	s.nonces.reset()
	s.net.engine.log.Warn("a settlement write's outcome is unknown; answering pending and finding out", "network", s.net.net.ID,
		"signer", s.addr, "count", len(g.rows), "err", err)
	flights := s.newFlights(g, nil)
	for i, sub := range g.subs {
		sub.done, sub.f = true, flights[i]
	}
	s.resolveUnknown(g.rows, flights)
}

// committedLocked goes on with rows the ledger committed (ids): the key's nonces move past
// them, and each submission's flight is tracked and handed to the broadcaster (enqueue,
// broadcast.go), the one way a committed transaction leaves the process.
func (s *sender) committedLocked(g signedGroup, ids []int64) {
	e := s.net.engine
	s.nonces.take(noncesHeld(g.rows))
	e.fault(FaultAfterCommit)
	flights := s.newFlights(g, ids)
	for i, sub := range g.subs {
		f := flights[i]
		f.count(true)
		e.track(f)
		s.enqueue(f)
		sub.done, sub.f = true, f
	}
}

// newFlights are the flights of g's submissions, their rows committed as ids (nil: not known
// yet); a batch's are one family.
func (s *sender) newFlights(g signedGroup, ids []int64) []*flight {
	flights := make([]*flight, len(g.subs))
	for i, sub := range g.subs {
		var id int64
		if ids != nil {
			id = ids[i]
		}
		flights[i] = s.newFlight(id, sub, g.txs[i])
	}
	if len(g.rows) > 1 && g.rows[1].BatchSlot > 0 {
		linkFamily(flights)
	}
	return flights
}

// answerAll answers every submission of subs not answered yet with err.
func answerAll(subs []*submission, err error) {
	for _, sub := range subs {
		if !sub.done {
			sub.done, sub.err = true, err
		}
	}
}

// newFlight is the flight of a submission whose row was committed (or may have been) as id.
func (s *sender) newFlight(id int64, sub *submission, tx template) *flight {
	row := sub.row
	f := newFlight(id, facilitator.StateSigned)
	f.key, f.fingerprint, f.payTo, f.value, f.validBefore = row.Key, row.Fingerprint, row.PayTo, row.Value, row.ValidBefore
	f.sender, f.nonce, f.gas, f.data, f.to = s, row.TxNonce, tx.gas, tx.data, tx.to
	f.estimate = sub.estimate
	f.batched = tx.to == multicall3.Address
	if row.PaymentID != nil {
		f.paymentID = row.PaymentID.ID
	}
	f.txs = []*sentTx{{hash: row.Tx.Hash, nonce: row.TxNonce, raw: tx.raw, fees: tx.fees, signedAt: s.net.engine.now()}}
	return f
}

// noncesHeld is how many of the key's nonces committed rows hold: one per lone settlement, one
// for a whole batch (its members share its nonce). Rows hold consecutive nonces, in order.
func noncesHeld(rows []*facilitator.NewSettlement) int {
	return int(rows[len(rows)-1].TxNonce-rows[0].TxNonce) + 1
}

func undone(subs []*submission) []*submission {
	var out []*submission
	for _, sub := range subs {
		if !sub.done {
			out = append(out, sub)
		}
	}
	return out
}
