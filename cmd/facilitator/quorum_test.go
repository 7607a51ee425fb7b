package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// liarRPC is a provider in front of the node that lies in the two ways one provider's word must
// not decide an outcome (the trust model of docs/configuration.md, "Finality"): it invents a mined receipt, with
// status 1 and the Transfer log the settlement expects, for a transaction that is only pending;
// and it answers one request with a head and a "finalized" block far ahead, consistent with each
// other. Everything else passes through.
type liarRPC struct {
	nodeLink
	// invent: answer a null receipt of a pending transaction with an invented one.
	invent atomic.Bool
	// ahead is how many more watcher requests (a head, the finalized tag and a block at a height,
	// in one batch) to answer far ahead.
	ahead               atomic.Int32
	invented, aheadTold atomic.Int64
	// lies, when set, are told at random on top of invent and ahead (a liar under load).
	lies               atomic.Pointer[liarShares]
	nulled, behindTold atomic.Int64
	finalizedHigh      atomic.Uint64 // the highest "finalized" block answered so far
}

// liarShares are the chances of each lie: Invent, of a null receipt of a pending transaction
// answered with an invented one; Null, of a mined receipt answered null; Ahead, of a request
// holding eth_blockNumber answered with a head (and any "finalized" beside it) far ahead; Behind,
// of a "finalized" block answered below one answered before.
type liarShares struct {
	Invent, Null, Ahead, Behind float64
}

func (p *liarRPC) String() string {
	return fmt.Sprintf("%d receipts invented, %d mined receipts nulled, %d answers far ahead, %d finalized answers behind",
		p.invented.Load(), p.nulled.Load(), p.aheadTold.Load(), p.behindTold.Load())
}

func newLiarRPC(t *testing.T, target string) (*liarRPC, string) {
	t.Helper()
	p := &liarRPC{nodeLink: newNodeLink(target, false)}
	return p, serveProxy(t, p)
}

func (p *liarRPC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	out, status, err := p.post(r.Context(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if status == http.StatusOK && len(trimmed) > 0 && trimmed[0] == '[' {
		out = p.rewrite(r.Context(), body, out)
	} else if status == http.StatusOK {
		if b, err := json.Marshal([]json.RawMessage{body}); err == nil {
			var one []json.RawMessage
			if json.Unmarshal(p.rewrite(r.Context(), b, mustJSON([]json.RawMessage{out})), &one) == nil && len(one) == 1 {
				out = one[0]
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// rewrite tells the batch's lies into the node's answers to it.
func (p *liarRPC) rewrite(ctx context.Context, body, out []byte) []byte {
	var msgs, answers []*rpcMsg
	if json.Unmarshal(body, &msgs) != nil || json.Unmarshal(out, &answers) != nil {
		return out
	}
	byID := map[string]*rpcMsg{}
	for _, a := range answers {
		byID[string(a.ID)] = a
	}
	lies := p.lies.Load()
	chance := func(share func(*liarShares) float64) bool { return lies != nil && mrand.Float64() < share(lies) }
	var heads, tags []*rpcMsg
	atHeight := false
	for _, m := range msgs {
		a := byID[string(m.ID)]
		if a == nil || a.Error != nil {
			continue
		}
		switch m.Method {
		case "eth_getTransactionReceipt":
			if isNull(a.Result) && (p.invent.Load() || chance(func(l *liarShares) float64 { return l.Invent })) {
				if r := p.inventReceipt(ctx, m.Params); r != nil {
					a.Result = r
					p.invented.Add(1)
				}
			} else if !isNull(a.Result) && chance(func(l *liarShares) float64 { return l.Null }) {
				a.Result = jsonNull
				p.nulled.Add(1)
			}
		case "eth_blockNumber":
			heads = append(heads, a)
		case "eth_getBlockByNumber":
			var params []json.RawMessage
			if json.Unmarshal(m.Params, &params) == nil && len(params) > 0 {
				if string(params[0]) == `"finalized"` {
					tags = append(tags, a)
				} else if strings.HasPrefix(string(params[0]), `"0x`) {
					atHeight = true
				}
			}
		}
	}
	told := len(heads) > 0 && len(tags) > 0 && atHeight && p.ahead.Load() > 0 && p.ahead.Add(-1) >= 0
	if !told && len(heads) > 0 && chance(func(l *liarShares) float64 { return l.Ahead }) {
		told = true
	}
	if told {
		var head hexutil.Uint64
		if json.Unmarshal(heads[0].Result, &head) == nil {
			far := uint64(head) + 10_000
			for _, h := range heads {
				h.Result = hexNumber(far)
			}
			for _, tg := range tags {
				var b map[string]any
				if json.Unmarshal(tg.Result, &b) == nil && b != nil {
					b["number"] = hexutil.EncodeUint64(far - 100)
					tg.Result = mustJSON(b)
				}
			}
			p.aheadTold.Add(1)
		}
	} else {
		for _, tg := range tags {
			p.finalizedBehind(tg, chance(func(l *liarShares) float64 { return l.Behind }))
		}
	}
	if b, err := json.Marshal(answers); err == nil {
		return b
	}
	return out
}

// finalizedBehind remembers the highest "finalized" block answered and, if lie, answers tg a few
// blocks below it instead: finality gone backwards, as a backend that is behind its peers says.
func (p *liarRPC) finalizedBehind(tg *rpcMsg, lie bool) {
	var b map[string]any
	if json.Unmarshal(tg.Result, &b) != nil || b == nil {
		return
	}
	s, _ := b["number"].(string)
	n, err := hexutil.DecodeUint64(s)
	if err != nil {
		return
	}
	high := p.finalizedHigh.Load()
	for n > high && !p.finalizedHigh.CompareAndSwap(high, n) {
		high = p.finalizedHigh.Load()
	}
	high = max(high, n)
	if !lie || high < 5 {
		return
	}
	b["number"] = hexutil.EncodeUint64(high - 1 - uint64(mrand.IntN(4)))
	tg.Result = mustJSON(b)
	p.behindTold.Add(1)
}

// inventReceipt is a plausible receipt for a pending transferWithAuthorization, lone or batched
// (nil when the transaction is not pending): mined at the node's head, successful, with the
// token's AuthorizationUsed and Transfer logs for each authorization it carries.
func (p *liarRPC) inventReceipt(ctx context.Context, params json.RawMessage) json.RawMessage {
	var args []common.Hash
	if json.Unmarshal(params, &args) != nil || len(args) != 1 {
		return nil
	}
	var tx *struct {
		BlockNumber *hexutil.Uint64 `json:"blockNumber"`
		From        common.Address  `json:"from"`
		To          *common.Address `json:"to"`
		Input       hexutil.Bytes   `json:"input"`
	}
	if p.call(ctx, &tx, "eth_getTransactionByHash", args[0]) != nil || tx == nil || tx.BlockNumber != nil || tx.To == nil {
		return nil
	}
	var head *struct {
		Number hexutil.Uint64 `json:"number"`
		Hash   common.Hash    `json:"hash"`
	}
	if p.call(ctx, &head, "eth_getBlockByNumber", "latest", false) != nil || head == nil {
		return nil
	}
	// The calls it makes: itself, or each call of a batched settlement's aggregate3.
	type call struct {
		to    common.Address
		input []byte
	}
	calls := []call{{*tx.To, tx.Input}}
	if batch, ok := multicall3.DecodeAggregate3Calldata(tx.Input); ok {
		calls = calls[:0]
		for _, c := range batch {
			calls = append(calls, call{c.Target, c.CallData})
		}
	}
	// Each transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, ...) logs what
	// the token does: AuthorizationUsed(from, nonce), then Transfer(from, to, value).
	var logs []any
	for _, c := range calls {
		if len(c.input) < 4+6*32 {
			continue
		}
		in := c.input[4:]
		for _, l := range [][]any{
			{[]common.Hash{eip3009.AuthorizationUsedTopic, common.BytesToHash(in[:32]), common.BytesToHash(in[160:192])}, hexutil.Bytes{}},
			{[]common.Hash{eip3009.TransferTopic, common.BytesToHash(in[:32]), common.BytesToHash(in[32:64])}, hexutil.Bytes(in[64:96])},
		} {
			logs = append(logs, map[string]any{
				"address": c.to, "topics": l[0], "data": l[1], "blockNumber": head.Number, "blockHash": head.Hash, "transactionHash": args[0],
				"transactionIndex": "0x0", "logIndex": hexutil.EncodeUint64(uint64(len(logs))), "removed": false,
			})
		}
	}
	if len(logs) == 0 {
		return nil
	}
	return mustJSON(map[string]any{
		"transactionHash": args[0], "transactionIndex": "0x0", "blockHash": head.Hash, "blockNumber": head.Number,
		"from": tx.From, "to": *tx.To, "cumulativeGasUsed": "0x17700", "gasUsed": "0x17700", "effectiveGasPrice": "0x3b9aca00",
		"contractAddress": nil, "logs": logs, "logsBloom": hexutil.Bytes(make([]byte, 256)), "status": "0x1", "type": "0x2",
	})
}

// settleOnce posts body to c's /settle and decodes the answer.
func settleOnce(t *testing.T, c *child, body []byte) facilitator.SettleResponse {
	t.Helper()
	res, err := c.client.Post(c.base+"/settle", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out facilitator.SettleResponse
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatalf("/settle answered %d, not a SettleResponse: %v", res.StatusCode, err)
	}
	return out
}

// waitFor polls cond every 50 ms until it holds, failing the test with what after bound (a bound
// on liveness, not a timed assertion).
func waitFor(ctx context.Context, t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s", what, bound)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// quorumStack is the real binary on a network of two providers in front of one anvil: the node
// itself, and a liar.
func quorumStack(ctx context.Context, t *testing.T, db string, tag string) (*child, *liarRPC, *faultLoad, *devchain.Chain, string) {
	t.Helper()
	dbURL, chain := freshStack(ctx, t, db, devchain.Options{})
	bin := buildFacilitator(ctx, t)
	liar, liarURL := newLiarRPC(t, chain.RPCURL)
	load := newFaultLoad(ctx, t, chain, 1)
	load.idShare = 0
	env := serveEnv(t, dbURL, chain, chain.RPCURL, load.key)
	env["FACILITATOR_NETWORKS"] = editNetworks(t, withRPCs(t, env["FACILITATOR_NETWORKS"], liarURL), func(n map[string]any) {
		if tag != "" {
			n["finalityTag"] = tag
		}
	})
	env["FACILITATOR_LOG_LEVEL"] = "info"
	return startServe(ctx, t, bin, env, "facilitator"), liar, load, chain, dbURL
}

// TestQuorumInventedReceipt: one of two providers invents a receipt (status 1, the Transfer log
// the settlement expects) for our transaction while nothing is mined. The merchant must not be
// told success: "mined" rests on both providers' receipts. Once the transaction is mined, it is.
func TestQuorumInventedReceipt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, liar, load, chain, _ := quorumStack(ctx, t, "quorum_receipt", "")
	if err := chain.RPC.CallContext(ctx, nil, "anvil_setAutomine", false); err != nil {
		t.Fatal(err)
	}
	liar.invent.Store(true)
	p := load.newPayment()
	before, err := chain.USDC.BalanceOf(ctx, load.merchant)
	if err != nil {
		t.Fatal(err)
	}
	// The merchant retries while pending, as the official resource server does, until the liar has
	// told its receipt to the watcher (its full sweeps read every receipt; the pool sends each to
	// either provider), and twice more after: the round that read the lie has decided by then.
	var last facilitator.SettleResponse
	pending := func() bool {
		last = settleOnce(t, c, p.body)
		if last.Success {
			bal, _ := chain.USDC.BalanceOf(ctx, load.merchant)
			t.Fatalf("success: true for %s while nothing is mined (the merchant holds %s more)", last.Transaction, new(big.Int).Sub(bal, before))
		}
		return last.ErrorReason == facilitator.ReasonSettlementPending
	}
	waitFor(ctx, t, 150*time.Second, "the lying provider invents a receipt", func() bool { pending(); return liar.invented.Load() >= 1 })
	for range 2 {
		if !pending() {
			t.Fatalf("with nothing mined: success %v, %q; want settlement_pending", last.Success, last.ErrorReason)
		}
	}
	if bal, err := chain.USDC.BalanceOf(ctx, load.merchant); err != nil || bal.Cmp(before) != 0 {
		t.Fatalf("the merchant's balance moved with nothing mined: %v, %v", bal, err)
	}
	liar.invent.Store(false)
	if err := chain.RPC.CallContext(ctx, nil, "anvil_setAutomine", true); err != nil {
		t.Fatal(err)
	}
	if err := chain.Mine(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "success once mined", func() bool {
		last = settleOnce(t, c, p.body)
		return last.Success
	})
	bal, err := chain.USDC.BalanceOf(ctx, load.merchant)
	if err != nil || new(big.Int).Sub(bal, before).Cmp(p.value) != 0 {
		t.Fatalf("the merchant received %v (%v), want exactly %s", new(big.Int).Sub(bal, before), err, p.value)
	}
	t.Logf("receipts invented: %d", liar.invented.Load())
	c.stop(t)
}

// TestQuorumFinalizedAhead: one of two providers answers one watcher request with a head and a
// "finalized" block far ahead, consistent with each other. That answer must neither make the
// settlement final nor turn tag finality off: once the honest finalized block reaches it, the
// settlement is final.
func TestQuorumFinalizedAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, liar, load, chain, dbURL := quorumStack(ctx, t, "quorum_finalized", facilitator.TagFinalized)
	p := load.newPayment()
	var last facilitator.SettleResponse
	waitFor(ctx, t, 60*time.Second, "success", func() bool {
		last = settleOnce(t, c, p.body)
		return last.Success
	})
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	state := func() string {
		var s string
		if err := conn.QueryRow(ctx, `SELECT state FROM settlements WHERE tx_hash = $1`, common.HexToHash(last.Transaction).Bytes()).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	liar.ahead.Store(1)
	waitFor(ctx, t, 90*time.Second, "the lying provider answers far ahead", func() bool { return liar.aheadTold.Load() == 1 })
	if s := state(); s != string(facilitator.StateMined) {
		t.Fatalf("after one answer far ahead, with the honest finalized block below it: %s, want mined", s)
	}
	// anvil's finalized block is 64 below its head: past it, the settlement is final by the tag.
	if err := chain.RPC.CallContext(ctx, nil, "anvil_mine", hexutil.Uint64(70)); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "final once the honest finalized block reaches it", func() bool { return state() == string(facilitator.StateFinal) })
	c.stop(t)
}
