package settle

import (
	"context"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// The evidence a terminal decision rests on is read pinned at one block number, in one request,
// together with that block's header: a node that lacks the block answers an error or null for it
// (so a lagging backend cannot answer "unused" or "nonce free" from its past), and a header whose
// hash differs from the expected one is another branch (a reorg since the first read).

// logLookback is how many blocks before the pinned block the authorization's use log is looked
// for. The use precedes the revert it explains, and follows the settlement's signing, so it is
// rarely more than minutes back; past the window nothing is decided from the watcher and the
// reconcile job answers from the index.
const logLookback = 10_000

// pinnedElems is how many reads a pinned read makes before the variants' receipts.
const pinnedElems = 5

// pinnedRead is one settlement's pinned reads.
type pinnedRead struct {
	key    facilitator.AuthorizationKey
	signer common.Address
	// ours reports whether an address is one of the network's signer keys (nil: only signer).
	ours   func(common.Address) bool
	want   Expected
	t      track
	at     uint64
	atHash common.Hash // expected hash at at (zero: any)

	read     *chainRead                  // nil: the reads failed, or the node lacked the block
	receipts map[common.Hash]receiptRead // every variant's, read in the same request
	voided   bool                        // the block at at is not atHash any more
	// told is the highest head an answering node told of in these reads, whether or not the
	// rest of them came in: a bump must never rest on reads behind a head any answer told of
	// (the simulator's seed 20990: a pinned read whose eth_call failed told of head 16, the
	// next round's reads at 15 found the nonce unused, and a bump went out for a nonce mined
	// in block 16).
	told uint64
}

// newPinnedRead is the pinned reads of a settlement at block at; a verdict read there before holds
// them to the block it was read in (a different block there now voids it).
func newPinnedRead(key facilitator.AuthorizationKey, signer common.Address, ours func(common.Address) bool, want Expected, t track, at uint64) *pinnedRead {
	pr := &pinnedRead{key: key, signer: signer, ours: ours, want: want, t: t, at: at}
	if t.verdict != nil && t.verdict.at == at {
		pr.atHash = t.verdict.atHash
	}
	return pr
}

// apply folds the reads into the settlement's track and observation, and reports whether they
// came in (false: not known this round).
func (pr *pinnedRead) apply(t *track, o *observation) bool {
	if pr.voided {
		t.verdict = nil // the block it was read at is no longer there
	}
	if pr.read == nil {
		return false
	}
	for h, r := range pr.receipts {
		o.receipts[h] = r
	}
	o.chain = pr.read
	return true
}

// readPinned makes the pinned reads of every settlement in prs, in one batch. With a finality tag
// (the network's rule names one), each settlement's reads carry the node's answer for it, so
// that the evidence and the block it is final below come from the same node; the tag's read
// failing fails nothing (finality then counts by depth).
func readPinned(ctx context.Context, batch func(context.Context, []rpc.BatchElem) error, tag string, prs []*pinnedRead) error {
	var elems []rpc.BatchElem
	all := make([]*pinnedSlots, len(prs))
	for i, pr := range prs {
		all[i], elems = pr.queue(elems, tag)
	}
	if err := batch(ctx, elems); err != nil {
		return err
	}
	for i, pr := range prs {
		pr.take(all[i], elems)
	}
	return readSenders(ctx, batch, prs)
}

// readSenders reads, for each settlement whose authorization a transaction that is none of its
// variants used, who signed that transaction: one of our keys (the ledger lost the variant that
// mined) or not. Only then, so a round costs what it did without a loss. The sender is
// recovered from the transaction's signature, not taken from the node (ethrpc.Verified), so a
// node can withhold a transaction of ours but never make one ours. A request that failed makes
// the reads not known this round; a transaction the node does not give (or not the one named)
// leaves its sender unknown, and nothing is decided on it: a node withholding a transaction of
// ours twice would otherwise have it answered "not ours" (the simulator's seed 16150).
func readSenders(ctx context.Context, batch func(context.Context, []rpc.BatchElem) error, prs []*pinnedRead) error {
	var asks []*pinnedRead
	var elems []rpc.BatchElem
	for _, pr := range prs {
		if c := pr.read; c != nil && c.use != nil && !c.use.canceled && !pr.t.has(c.use.tx) {
			asks = append(asks, pr)
			elems = append(elems, ethrpc.TransactionByHash(c.use.tx, new(*types.Transaction)))
		}
	}
	if len(elems) == 0 {
		return nil
	}
	if err := batch(ctx, elems); err != nil {
		for _, pr := range asks {
			pr.read, pr.receipts = nil, nil // not known this round; the others' reads stand
		}
		return nil
	}
	for i, pr := range asks {
		use := *pr.read.use
		tx := *elems[i].Result.(**types.Transaction)
		if elems[i].Error != nil || tx == nil {
			use.senderUnknown = true
		} else if _, from, err := ethrpc.Verified(tx, use.tx); err != nil {
			use.senderUnknown = true
		} else {
			use.ours = from == pr.signer || (pr.ours != nil && pr.ours(from))
		}
		pr.read.use = &use
	}
	return nil
}

// pinnedSlots is where one settlement's pinned reads are in readPinned's batch, and their answers.
type pinnedSlots struct {
	header *struct {
		Hash common.Hash    `json:"hash"`
		Time hexutil.Uint64 `json:"timestamp"`
	}
	count hexutil.Uint64
	head  hexutil.Uint64
	state hexutil.Bytes
	logs  []types.Log
	rcpts []*ethrpc.Receipt
	first int
	tag   int // the tag's element (-1: none)
	// balance is the payer's balance element, read for a batch's member (-1: none): a call
	// of its that failed inside the batch is its own failure when the balance is short.
	balance int
	bal     hexutil.Bytes
	rcpt    int // the first receipt's element
}

// queue appends pr's reads to elems, all pinned at pr.at: the block's header, the signer's nonce,
// the authorization's state and its use log, the node's head (with the tag's block, and for a
// batch's member the payer's balance), then every variant's receipt.
func (pr *pinnedRead) queue(elems []rpc.BatchElem, tag string) (*pinnedSlots, []rpc.BatchElem) {
	s := &pinnedSlots{first: len(elems), rcpts: make([]*ethrpc.Receipt, len(pr.t.variants))}
	at := hexutil.EncodeUint64(pr.at)
	key := pr.key
	from := uint64(0)
	if pr.at > logLookback {
		from = pr.at - logLookback
	}
	call := map[string]any{"to": key.Asset, "input": hexutil.Bytes(eip3009.AuthorizationStateCalldata(key.Payer, key.Nonce))}
	filter := map[string]any{
		"address":   key.Asset,
		"fromBlock": hexutil.EncodeUint64(from),
		"toBlock":   at,
		"topics":    eip3009.AuthorizationTopics(key.Payer, key.Nonce),
	}
	elems = append(elems,
		ethrpc.Block(at, false, &s.header),
		ethrpc.TransactionCount(pr.signer, at, &s.count),
		ethrpc.Call(call, at, &s.state),
		ethrpc.Logs(filter, &s.logs),
		ethrpc.BlockNumber(&s.head))
	s.tag = -1
	if tag != "" {
		s.tag = len(elems)
		elems = append(elems, ethrpc.TagElem(tag))
	}
	s.balance = -1
	if pr.want.Batched {
		s.balance = len(elems)
		bal := map[string]any{"to": key.Asset, "input": hexutil.Bytes(eip3009.BalanceOfCalldata(key.Payer))}
		elems = append(elems, ethrpc.Call(bal, at, &s.bal))
	}
	s.rcpt = len(elems)
	for j, v := range pr.t.variants {
		elems = append(elems, ethrpc.TransactionReceipt(v.hash, &s.rcpts[j]))
	}
	return s, elems
}

// take reads pr's answers from elems (at s): the head they told of, and, when every read came in
// from a node that has the block (the expected one), the chain read and the variants' receipts.
func (pr *pinnedRead) take(s *pinnedSlots, elems []rpc.BatchElem) {
	if el := elems[s.first+4]; el.Error == nil {
		pr.told = max(pr.told, uint64(s.head))
	}
	failed := false
	for _, el := range elems[s.first : s.first+pinnedElems] {
		failed = failed || el.Error != nil
	}
	if s.balance >= 0 && elems[s.balance].Error != nil {
		failed = true
	}
	if failed || s.header == nil {
		return // the node lacks the block (it lags) or did not answer: not known yet
	}
	if pr.atHash != (common.Hash{}) && s.header.Hash != pr.atHash {
		pr.voided = true
		return
	}
	c := &chainRead{at: pr.at, atHash: s.header.Hash, time: uint64(s.header.Time), keyNonce: uint64(s.count), nodeHead: uint64(s.head),
		used: len(s.state) == 32 && s.state[31] == 1, receiptsComplete: true}
	if s.tag >= 0 {
		c.tag = ethrpc.TagAnswer(elems[s.tag])
	}
	if s.balance >= 0 {
		b, ok := eip3009.DecodeBalance(s.bal)
		if !ok {
			return // not a balance: not known
		}
		c.balance = b
	}
	for _, l := range s.logs {
		if l.Removed || len(l.Topics) < 3 {
			continue
		}
		c.use = &authLog{tx: l.TxHash, canceled: l.Topics[0] == eip3009.AuthorizationCanceledTopic, block: l.BlockNumber, blockHash: l.BlockHash}
	}
	if c.use != nil && !c.used {
		// A log the node's state does not agree with: its indexes are inconsistent. Not known.
		return
	}
	want := pr.want
	pr.receipts = map[common.Hash]receiptRead{}
	for j, v := range pr.t.variants {
		el := elems[s.rcpt+j]
		if el.Error != nil {
			c.receiptsComplete = false
			pr.receipts[v.hash] = receiptRead{}
			continue
		}
		pr.receipts[v.hash] = receiptRead{ok: true, r: summarize(s.rcpts[j], want)}
	}
	pr.read = c
}

// Judge decides an open settlement's outcome from the chain alone, the way the watcher does, for
// a process that does not work the settlement (the reconcile job): the receipts of every
// transaction it signed, then the pinned reads, and the whole read made twice, since one read
// never decides. ok is false when the chain does not tell yet; a mined outcome needs no second
// read (it is not terminal: finality is checked later).
// With several endpoints (ethrpc.Pool), its pinned reads, and the receipts a mined outcome rests
// on, are read on a quorum of them, as the watcher's are; batchOn makes the batch function over
// one chain. ours says whether an address is one of the network's signer keys: a use of the
// authorization by a transaction one of them signed that none of s.Txs is (the ledger lost it)
// is an adoption, never "settled elsewhere"; nil: only s's own signer is ours. told hears every
// head the reads told of (nil: nobody): an engine judging counts them, as it counts every
// answer's head, so that no fee bump rests on reads behind one of them.
func Judge(ctx context.Context, chain ethrpc.Chain, batchOn func(ethrpc.Chain) func(context.Context, []rpc.BatchElem) error,
	s *facilitator.OpenSettlement, fin facilitator.Finality, ours func(common.Address) bool, told func(uint64), now time.Time) (facilitator.Resolution, bool, error) {
	batch := batchOn(chain)
	t := track{state: s.State, txNonce: s.TxNonce, validBefore: s.ValidBefore, value: s.Value}
	batchTx := false
	for _, x := range s.Txs {
		var tx types.Transaction
		if err := tx.UnmarshalBinary(x.Raw); err != nil {
			return facilitator.Resolution{}, false, err
		}
		// Past every timer: the job resends nothing, it only reads.
		t.variants = append(t.variants, variant{hash: x.Hash, nonce: tx.Nonce(), signedAt: s.CreatedAt, sentAt: s.CreatedAt, tried: s.CreatedAt})
		// A member the engine would settle again alone (its newest transaction a batch's) is not
		// decided here: the job signs nothing, and the key's holder settles it.
		t.batched = tx.To() != nil && *tx.To() == multicall3.Address
		batchTx = batchTx || t.batched
	}
	want, err := ExpectedOf(s)
	if err != nil {
		return facilitator.Resolution{}, false, err
	}
	p := policy{finality: fin, retryInterval: time.Hour, rebroadcastAfter: time.Hour, bumpAfter: time.Hour, resignMargin: resignMargin}
	// A batch's member is judged by its own pair of logs, as the watcher judges it.
	want.Batched = want.Batched || batchTx
	var head hexutil.Uint64
	var floor uint64 // the highest tagged block answered consistently in these rounds
	for round := 0; round < 3; round++ {
		o := observation{now: now, receipts: map[common.Hash]receiptRead{}, floor: floor}
		var rr receiptReads
		rr.elems = append(rr.elems, ethrpc.BlockNumber(&head))
		for _, v := range t.variants {
			rr.receipt(&o, v.hash, want)
		}
		if err := batch(ctx, rr.elems); err != nil {
			return facilitator.Resolution{}, false, err
		}
		if rr.elems[0].Error != nil {
			return facilitator.Resolution{}, false, rr.elems[0].Error
		}
		for _, f := range rr.after {
			f()
		}
		o.head = uint64(head)
		if told != nil {
			told(o.head)
		}
		d := decide(t, o, p)
		if d.act == actReadAt {
			at := d.at
			if at == 0 {
				at = o.head
			}
			pr := newPinnedRead(s.Key, s.Signer, ours, want, t, at)
			err := readCorroborated(ctx, chain, batchOn, fin.Tag, []*pinnedRead{pr}, func() {})
			if told != nil {
				told(pr.told)
			}
			if err != nil {
				return facilitator.Resolution{}, false, err
			}
			if !pr.apply(&t, &o) {
				return facilitator.Resolution{}, false, nil
			}
			if c := o.chain; c.tag.OK && fin.At(c.nodeHead, c.tag, floor).Known {
				floor = max(floor, c.tag.Number)
			}
			d = decide(t, o, p)
		}
		if recordsOutcome(d) && quorumSize(chain) > 1 {
			// Mined on one endpoint's word: recorded once a quorum of them agrees.
			qr := quorumFor(t, want)
			if err := readQuorum(ctx, chain, batchOn, fin.Tag, []*quorumRead{qr}, func() {}); err != nil {
				return facilitator.Resolution{}, false, err
			}
			if !qr.confirmed(t, o, p, d) {
				return facilitator.Resolution{}, false, nil
			}
		}
		switch {
		case d.act == actResolve || d.act == actAdopt:
			// An adoption is a mined outcome by a transaction none of s.Txs: the caller records
			// the transaction with it (reconcile adopts it).
			d.res.ID = s.ID
			return d.res, true, nil
		case d.verdict == nil:
			return facilitator.Resolution{}, false, nil
		}
		t.verdict = d.verdict
	}
	return facilitator.Resolution{}, false, nil
}
