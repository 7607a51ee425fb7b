package settle

import (
	"context"
	"encoding/json"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// scriptedNode answers the pinned reads from a fixed view of the chain: the fault of a provider
// that lies (an authorization "used" by a transaction that does not exist) is one a real node
// cannot be made to produce.
type scriptedNode struct {
	head      uint64
	hash      common.Hash // every block's hash
	keyNonce  uint64
	used      bool
	useTx     common.Hash // zero: no use log
	receipt   *types.Receipt
	noBlock   bool   // the node lacks the pinned block (it lags)
	finalized uint64 // its answer for the "finalized" tag (0: it serves none)
	callCount int
}

func (n *scriptedNode) CallContext(context.Context, any, string, ...any) error { return nil }

func (n *scriptedNode) BatchCallContext(_ context.Context, b []rpc.BatchElem) error {
	n.callCount++
	return answerBatch(b, n.answer)
}

func (n *scriptedNode) answer(el *rpc.BatchElem) (any, error) {
	switch el.Method {
	case "eth_getBlockByNumber":
		if el.Args[0] == facilitator.TagFinalized {
			if n.finalized > 0 {
				return map[string]any{"number": hexutil.Uint64(n.finalized), "hash": n.hash}, nil
			}
		} else if !n.noBlock {
			return map[string]any{"hash": n.hash, "timestamp": hexutil.Uint64(1_000)}, nil
		}
	case "eth_getTransactionCount":
		return hexutil.Uint64(n.keyNonce), nil
	case "eth_call":
		word := make([]byte, 32)
		if n.used {
			word[31] = 1
		}
		return hexutil.Bytes(word), nil
	case "eth_getLogs":
		logs := []types.Log{}
		if n.useTx != (common.Hash{}) {
			logs = append(logs, types.Log{Address: token, Topics: []common.Hash{eip3009.AuthorizationUsedTopic, common.BytesToHash(payer.Bytes()), {7}},
				TxHash: n.useTx, BlockNumber: 5, BlockHash: n.hash})
		}
		return logs, nil
	case "eth_blockNumber":
		return hexutil.Uint64(n.head), nil
	case "eth_getTransactionReceipt":
		return n.receipt, nil
	}
	return nil, nil
}

// answerBatch answers each element of a batch as a node's JSON does: what answer gives for it,
// encoded and decoded into its result; an error of answer's is the element's own.
func answerBatch(b []rpc.BatchElem, answer func(el *rpc.BatchElem) (any, error)) error {
	for i := range b {
		a, err := answer(&b[i])
		if err != nil {
			b[i].Error = err
			continue
		}
		raw, err := json.Marshal(a)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, b[i].Result); err != nil {
			b[i].Error = err
		}
	}
	return nil
}

// pair is a chain of two endpoints.
type pair struct {
	ethrpc.Chain
	a, b ethrpc.Chain
}

func (p pair) Pair() (ethrpc.Chain, ethrpc.Chain, bool) { return p.a, p.b, p.b != nil }
func (p pair) Endpoints() int                           { return 2 }

var (
	token = common.HexToAddress("0x00000000000000000000000000000000000000aa")
	payer = common.HexToAddress("0x00000000000000000000000000000000000000bb")
)

func pinned(at uint64) *pinnedRead {
	key := facilitator.AuthorizationKey{Network: "eip155:1", Asset: token, Payer: payer, Nonce: [32]byte{7}}
	t := track{state: facilitator.StateBroadcast, variants: []variant{{hash: common.Hash{1}, nonce: 3}}, validBefore: big.NewInt(1 << 40)}
	return newPinnedRead(key, common.Address{9}, nil, Expected{Key: key}, t, at)
}

func direct(c ethrpc.Chain) func(context.Context, []rpc.BatchElem) error { return c.BatchCallContext }

// TestCorroboratedReads: a pinned read counts only where two endpoints say the same about the
// block; a lying endpoint (an authorization "used" by a transaction that does not exist) makes it
// "not known" and is counted, one that lacks the block makes it "not known" and is not; an
// agreed read's finality counts from the lower head; a receipt mined after the pinned block on one
// endpoint only is no disagreement.
func TestCorroboratedReads(t *testing.T) {
	ctx := context.Background()
	honest := func() *scriptedNode { return &scriptedNode{head: 20, hash: common.Hash{0xb}, keyNonce: 3} }
	for _, c := range []struct {
		name       string
		b          func(*scriptedNode)
		known      bool
		disagreed  int
		wantHead   uint64
		wantUseLog bool
	}{
		{"both honest", func(*scriptedNode) {}, true, 0, 18, false},
		{"one says used by a transaction that does not exist", func(n *scriptedNode) { n.used, n.useTx = true, common.Hash{0xee} }, false, 1, 0, false},
		{"one has another block there", func(n *scriptedNode) { n.hash = common.Hash{0xc} }, false, 1, 0, false},
		{"one says the signer's nonce moved", func(n *scriptedNode) { n.keyNonce = 4 }, false, 1, 0, false},
		{"one lacks the block", func(n *scriptedNode) { n.noBlock = true }, false, 0, 0, false},
		{"one has our receipt, mined past the pinned block", func(n *scriptedNode) {
			n.receipt = &types.Receipt{TxHash: common.Hash{1}, Status: 1, BlockNumber: big.NewInt(12), BlockHash: common.Hash{0xd}}
		}, true, 0, 18, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := honest(), honest()
			a.head = 18
			c.b(b)
			pr := pinned(10)
			n := 0
			if err := readCorroborated(ctx, pair{Chain: a, a: a, b: b}, direct, "", []*pinnedRead{pr}, func() { n++ }); err != nil {
				t.Fatal(err)
			}
			if (pr.read != nil) != c.known || n != c.disagreed {
				t.Fatalf("read known %v, disagreements %d; want %v, %d", pr.read != nil, n, c.known, c.disagreed)
			}
			// An endpoint whose use log names a transaction none of the settlement's variants is
			// asked once more: who signed it (readSenders); only then.
			wantB := 1
			if b.used && b.useTx != (common.Hash{}) && b.useTx != (common.Hash{1}) {
				wantB = 2
			}
			if a.callCount != 1 || b.callCount != wantB {
				t.Fatalf("endpoints asked %d and %d times; want 1 and %d", a.callCount, b.callCount, wantB)
			}
			if c.known && pr.read.nodeHead != c.wantHead {
				t.Fatalf("finality counts from head %d; want the lower, %d", pr.read.nodeHead, c.wantHead)
			}
		})
	}
	t.Run("two endpoints, one healthy: not known", func(t *testing.T) {
		a := honest()
		pr := pinned(10)
		if err := readCorroborated(ctx, pair{Chain: a, a: a}, direct, "", []*pinnedRead{pr}, func() { t.Fatal("a disagreement with one endpoint up") }); err != nil {
			t.Fatal(err)
		}
		if pr.read != nil || a.callCount != 0 {
			t.Fatalf("with the second endpoint down, a read was kept (%+v) or made (%d)", pr.read, a.callCount)
		}
	})
	t.Run("one endpoint: the read is the node's", func(t *testing.T) {
		a := honest()
		a.used, a.useTx = true, common.Hash{0xee}
		pr := pinned(10)
		if err := readCorroborated(ctx, a, direct, "", []*pinnedRead{pr}, func() { t.Fatal("a disagreement with one endpoint") }); err != nil {
			t.Fatal(err)
		}
		if pr.read == nil || !pr.read.used {
			t.Fatalf("a single endpoint's read: %+v", pr.read)
		}
	})
}

// TestQuorumConfirmsOutcomes: a decision that records what one endpoint's read said (mined on its
// receipt, final on its block and tag) stands only when the quorum's reads decide the same: an
// endpoint inventing a receipt, or a finalized block far ahead, decides nothing alone, and is
// counted as a disagreement; two endpoints that agree decide.
func TestQuorumConfirmsOutcomes(t *testing.T) {
	ctx := context.Background()
	ours := common.Hash{1}
	blockHash := common.Hash{0xb}
	mined := func() *types.Receipt {
		return &types.Receipt{TxHash: ours, Status: 1, BlockNumber: big.NewInt(10), BlockHash: blockHash, Logs: paidLogs(quorumWant)}
	}
	open := pinned(0).t
	minedTrack := track{state: facilitator.StateMined, variants: open.variants, mined: minedAt{tx: ours, block: 10, blockHash: blockHash}}
	p := policy{finality: facilitator.Finality{Tag: facilitator.TagFinalized, Depth: 64}}
	for _, c := range []struct {
		name      string
		t         track
		a, b      func(*scriptedNode)
		confirmed bool
		disagreed int
	}{
		{"open: one endpoint invents our receipt", open, func(n *scriptedNode) { n.receipt = mined() }, func(*scriptedNode) {}, false, 1},
		{"open: both have our receipt", open, func(n *scriptedNode) { n.receipt = mined() }, func(n *scriptedNode) { n.receipt = mined() }, true, 0},
		{"mined: one endpoint's finalized block is far ahead", minedTrack,
			func(n *scriptedNode) { n.receipt, n.head, n.finalized = mined(), 1_000, 900 },
			func(n *scriptedNode) { n.receipt, n.finalized = mined(), 4 }, false, 0},
		{"mined: both say final", minedTrack,
			func(n *scriptedNode) { n.receipt, n.finalized = mined(), 12 },
			func(n *scriptedNode) { n.receipt, n.finalized = mined(), 11 }, true, 0},
		{"mined: one endpoint has another block there", minedTrack,
			func(n *scriptedNode) { n.receipt, n.finalized = mined(), 12 },
			func(n *scriptedNode) { n.receipt, n.finalized, n.hash = mined(), 12, common.Hash{0xc} }, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := &scriptedNode{head: 20, hash: blockHash}, &scriptedNode{head: 20, hash: blockHash}
			c.a(a)
			c.b(b)
			// The first read, from endpoint a alone, decides an outcome.
			rr := receiptReads{tag: p.finality.Tag}
			o := observation{receipts: map[common.Hash]receiptRead{}}
			qr := quorumFor(c.t, quorumWant)
			for _, h := range qr.hashes {
				rr.receipt(&o, h, quorumWant)
			}
			if qr.at > 0 {
				rr.canon(&o, qr.at)
			}
			if err := rr.runWith(ctx, direct(a)); err != nil {
				t.Fatal(err)
			}
			ct := c.t
			if ct.state.Succeeded() {
				// The second read of a finality verdict: the first recorded it.
				ct.verdict = &verdict{act: actFinalize, at: 10, atHash: blockHash}
			}
			d := decide(ct, o, p)
			if !recordsOutcome(d) {
				t.Fatalf("endpoint a's read alone: %v (%s), want an outcome to confirm", d.act, d.why)
			}
			n := 0
			if err := readQuorum(ctx, pair{Chain: a, a: a, b: b}, direct, p.finality.Tag, []*quorumRead{qr}, func() { n++ }); err != nil {
				t.Fatal(err)
			}
			if got := qr.confirmed(ct, o, p, d); got != c.confirmed || n != c.disagreed {
				t.Fatalf("confirmed %v with %d disagreements; want %v, %d", got, n, c.confirmed, c.disagreed)
			}
		})
	}
	t.Run("two endpoints, one healthy: not confirmed", func(t *testing.T) {
		a := &scriptedNode{head: 20, hash: blockHash, receipt: mined()}
		qr := quorumFor(open, quorumWant)
		if err := readQuorum(ctx, pair{Chain: a, a: a}, direct, "", []*quorumRead{qr}, func() {}); err != nil {
			t.Fatal(err)
		}
		if qr.agreed || a.callCount != 0 {
			t.Fatalf("with the second endpoint down: agreed %v, %d reads", qr.agreed, a.callCount)
		}
	})
}

// TestQuorumBesideTheFirstRead: on a pool, the endpoint whose answer a decision rests on is one
// vote of the quorum, and only the others are asked (one more receipt read per mined
// settlement, with two providers): a lie from the first is refuted by the second, and the truth
// from both stands.
func TestQuorumBesideTheFirstRead(t *testing.T) {
	ctx := context.Background()
	ours := common.Hash{1}
	mined := func() *types.Receipt {
		return &types.Receipt{TxHash: ours, Status: 1, BlockNumber: big.NewInt(10), BlockHash: common.Hash{0xb}, Logs: paidLogs(quorumWant)}
	}
	open := pinned(0).t
	for _, c := range []struct {
		name      string
		second    *types.Receipt
		confirmed bool
		disagreed int
	}{
		{"the first endpoint invented our receipt", nil, false, 1},
		{"both have it", mined(), true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Both have our receipt until the first read; the pool picks which answers it, and the
			// other then answers c.second.
			nodes := map[string]*scriptedNode{
				"rpc0": {head: 20, hash: common.Hash{0xb}, receipt: mined()},
				"rpc1": {head: 20, hash: common.Hash{0xb}, receipt: mined()},
			}
			pool, err := ethrpc.NewPool([]ethrpc.Endpoint{{Name: "rpc0", Chain: nodes["rpc0"]}, {Name: "rpc1", Chain: nodes["rpc1"]}}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			rctx, from := ethrpc.WithAnswered(ctx)
			rr := receiptReads{}
			o := observation{receipts: map[common.Hash]receiptRead{}}
			rr.receipt(&o, ours, quorumWant)
			if err := rr.runWith(rctx, direct(pool)); err != nil {
				t.Fatal(err)
			}
			names := from.Names()
			if len(names) != 1 || nodes[names[0]] == nil || nodes[names[0]].callCount != 1 {
				t.Fatalf("the first read was answered by %v, want one endpoint asked once", names)
			}
			first, second := nodes[names[0]], nodes["rpc1"]
			if names[0] == "rpc1" {
				second = nodes["rpc0"]
			}
			if second.callCount != 0 {
				t.Fatalf("the first read asked both endpoints")
			}
			second.receipt = c.second
			d := decide(open, o, policy{})
			if !recordsOutcome(d) {
				t.Fatalf("%s's receipt alone: %v (%s), want an outcome to confirm", names[0], d.act, d.why)
			}
			qr := quorumFor(open, quorumWant)
			qr.beside(names[0], o)
			n := 0
			if err := readQuorum(ctx, pool, direct, "", []*quorumRead{qr}, func() { n++ }); err != nil {
				t.Fatal(err)
			}
			if first.callCount != 1 || second.callCount != 1 {
				t.Fatalf("the first endpoint asked %d times, the second %d; want the first not asked again, the second once", first.callCount, second.callCount)
			}
			if got := qr.confirmed(open, o, policy{}, d); got != c.confirmed || n != c.disagreed {
				t.Fatalf("confirmed %v with %d disagreements; want %v, %d", got, n, c.confirmed, c.disagreed)
			}
		})
	}
}

// TestJudgeMinedRestsOnQuorum: the reconcile job's Judge records a settlement mined only when a
// quorum of endpoints has its receipt: one endpoint inventing it decides nothing.
func TestJudgeMinedRestsOnQuorum(t *testing.T) {
	ctx := context.Background()
	tx := types.NewTx(&types.DynamicFeeTx{Nonce: 3, Gas: 100_000, GasTipCap: big.NewInt(1), GasFeeCap: big.NewInt(2)})
	raw, err := tx.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	key := quorumWant.Key
	s := &facilitator.OpenSettlement{
		Settlement: facilitator.Settlement{ID: 1, Key: key, PayTo: quorumWant.PayTo, Value: quorumWant.Value, State: facilitator.StateBroadcast, TxNonce: 3,
			ValidBefore: big.NewInt(1 << 40), Signer: common.Address{9}},
		Txs: []facilitator.TxRecord{{Hash: tx.Hash(), Raw: raw}},
	}
	mined := func() *types.Receipt {
		return &types.Receipt{TxHash: tx.Hash(), Status: 1, BlockNumber: big.NewInt(10), BlockHash: common.Hash{0xb}, Logs: paidLogs(quorumWant)}
	}
	for _, c := range []struct {
		name   string
		second *types.Receipt
		mined  bool
	}{
		{"one endpoint invents the receipt", nil, false},
		{"both have it", mined(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &scriptedNode{head: 20, hash: common.Hash{0xb}, keyNonce: 3, receipt: mined()}
			b := &scriptedNode{head: 20, hash: common.Hash{0xb}, keyNonce: 3, receipt: c.second}
			res, ok, err := Judge(ctx, pair{Chain: a, a: a, b: b}, direct, s, facilitator.Finality{Depth: 1}, nil, nil, time.Unix(1_000, 0))
			if err != nil {
				t.Fatal(err)
			}
			if got := ok && res.State == facilitator.StateMined; got != c.mined {
				t.Fatalf("judged %+v (ok %v); want mined %v", res, ok, c.mined)
			}
		})
	}
}

// quorumWant is the settlement the quorum tests' receipts pay: a receipt proves a transfer only by
// the authorization's own AuthorizationUsed+Transfer pair (eip3009.EffectOf).
var quorumWant = Expected{Key: facilitator.AuthorizationKey{Network: "eip155:1", Asset: token, Payer: payer, Nonce: [32]byte{7}},
	PayTo: common.Address{0x77}, Value: big.NewInt(5)}

func paidLogs(w Expected) []*types.Log {
	return []*types.Log{eip3009.AuthorizationLog(w.Key.Asset, w.Key.Payer, w.Key.Nonce, false), eip3009.TransferLog(w.Key.Asset, w.Key.Payer, w.PayTo, w.Value)}
}

// TestQuorumOutvotesALiar: with three endpoints, a quorum of two, and one that answers every
// mined receipt as reverted (the authorization unused, no log: TestTwoProviders' liar), the reads
// an outcome rests on stand on the two honest endpoints whichever pair the pool picks first: where
// the quorum asked disagrees, the other healthy endpoints are asked, and an answer a quorum agrees
// on stands. (Asking only the pair picked at random left the outcome unknown whenever it held the
// liar: two thirds of the picks, and settlements pending for minutes.) Three endpoints answering
// three ways decide nothing.
func TestQuorumOutvotesALiar(t *testing.T) {
	ctx := context.Background()
	ours := common.Hash{1}
	blockHash := common.Hash{0xb}
	mined := func() *types.Receipt {
		return &types.Receipt{TxHash: ours, Status: 1, BlockNumber: big.NewInt(10), BlockHash: blockHash, Logs: paidLogs(quorumWant)}
	}
	reverted := mined()
	reverted.Status, reverted.Logs = 0, nil
	honest := func() *scriptedNode {
		return &scriptedNode{head: 20, hash: blockHash, keyNonce: 4, used: true, useTx: ours, receipt: mined(), finalized: 12}
	}
	liar := func() *scriptedNode {
		return &scriptedNode{head: 20, hash: blockHash, keyNonce: 4, receipt: reverted, finalized: 12}
	}
	open := pinned(0).t
	minedTrack := track{state: facilitator.StateMined, variants: open.variants, mined: minedAt{tx: ours, block: 10, blockHash: blockHash},
		verdict: &verdict{act: actFinalize, at: 10, atHash: blockHash}}
	p := policy{finality: facilitator.Finality{Tag: facilitator.TagFinalized, Depth: 64}}
	newPool := func(t *testing.T, seed uint64, nodes ...*scriptedNode) *ethrpc.Pool {
		var eps []ethrpc.Endpoint
		for i, n := range nodes {
			eps = append(eps, ethrpc.Endpoint{Name: "rpc" + string(rune('0'+i)), Chain: n})
		}
		pool, err := ethrpc.NewPool(eps, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		pool.SetSeed(seed)
		return pool
	}
	// honestRead is what the honest endpoints say of t: the decision a quorum must confirm.
	honestRead := func(t *testing.T, tr track) (observation, decision) {
		rr := receiptReads{tag: p.finality.Tag}
		o := observation{receipts: map[common.Hash]receiptRead{}}
		qr := quorumFor(tr, quorumWant)
		for _, h := range qr.hashes {
			rr.receipt(&o, h, quorumWant)
		}
		if qr.at > 0 {
			rr.canon(&o, qr.at)
		}
		if err := rr.runWith(ctx, direct(honest())); err != nil {
			t.Fatal(err)
		}
		d := decide(tr, o, p)
		if !recordsOutcome(d) {
			t.Fatalf("the honest read: %v (%s), want an outcome to confirm", d.act, d.why)
		}
		return o, d
	}
	disagreements := 0
	for seed := range uint64(12) {
		for _, c := range []struct {
			name string
			t    track
			from string // the endpoint the first read came from ("": none, the whole quorum is asked)
		}{
			{"open", open, ""},
			{"open, beside rpc0", open, "rpc0"},
			{"open, beside rpc1", open, "rpc1"},
			{"mined: final", minedTrack, ""},
			{"mined: final, beside rpc1", minedTrack, "rpc1"},
		} {
			o, d := honestRead(t, c.t)
			qr := quorumFor(c.t, quorumWant)
			qr.beside(c.from, o)
			pool := newPool(t, seed, honest(), honest(), liar())
			if err := readQuorum(ctx, pool, direct, p.finality.Tag, []*quorumRead{qr}, func() { disagreements++ }); err != nil {
				t.Fatal(err)
			}
			if !qr.confirmed(c.t, o, p, d) {
				t.Fatalf("seed %d, %s: %v (%s) not confirmed with two honest endpoints of three", seed, c.name, d.act, d.why)
			}
		}
		pr := pinned(10)
		pool := newPool(t, seed, honest(), honest(), liar())
		if err := readCorroborated(ctx, pool, direct, p.finality.Tag, []*pinnedRead{pr}, func() { disagreements++ }); err != nil {
			t.Fatal(err)
		}
		if pr.read == nil || !pr.read.used || pr.read.use == nil || pr.read.use.tx != ours || !pr.receipts[ours].ok {
			t.Fatalf("seed %d: the pinned reads with two honest endpoints of three: %+v", seed, pr.read)
		}
	}
	if disagreements == 0 {
		t.Fatal("the liar was never asked: no disagreement counted")
	}

	t.Run("three endpoints, three answers: not known", func(t *testing.T) {
		nulled := honest()
		nulled.receipt, nulled.used, nulled.useTx = nil, false, common.Hash{}
		stranger := honest()
		stranger.useTx = common.Hash{0xee}
		for seed := range uint64(6) {
			o, d := honestRead(t, open)
			qr := quorumFor(open, quorumWant)
			n := 0
			if err := readQuorum(ctx, newPool(t, seed, honest(), nulled, liar()), direct, "", []*quorumRead{qr}, func() { n++ }); err != nil {
				t.Fatal(err)
			}
			if qr.agreed || qr.confirmed(open, o, p, d) || n == 0 {
				t.Fatalf("seed %d: three receipts told three ways: agreed %v, %d disagreements", seed, qr.agreed, n)
			}
			pr := pinned(10)
			if err := readCorroborated(ctx, newPool(t, seed, honest(), stranger, liar()), direct, "", []*pinnedRead{pr}, func() {}); err != nil {
				t.Fatal(err)
			}
			if pr.read != nil {
				t.Fatalf("seed %d: pinned reads told three ways were kept: %+v", seed, pr.read)
			}
		}
	})
}
