package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
)

// laggyRPC is a JSON-RPC proxy in front of the node that answers like a load-balanced provider
// whose backends disagree (ARCHITECTURE.md invariant 8). Each HTTP request (a batch as a whole) goes to
// one "backend": most are in step with the node; some lag it by a few blocks and answer as a node
// whose head is that far behind (heads, blocks, receipts, state reads and logs all agree with
// that older head); some fail (a JSON-RPC rate-limit error, or HTTP 429); some do the work and
// hang up without answering. On top of that, any backend may answer null for a receipt it has
// not indexed. flakyRPC is the network's faults (drops, delays); this is the provider's.
type laggyRPC struct {
	nodeLink
	faults atomic.Pointer[laggyFaults] // nil: every request goes to an in-step backend, untouched
	heads  *headWatch

	requests, healthy, lagged                             atomic.Int64
	lagHeads, lagNulls, lagPinned, lagRefused, lagClamped atomic.Int64
	nullReceipts, rpcErrors, http429, dropped, reverted   atomic.Int64
	sends, sendsFailed, sendsDropped                      atomic.Int64
}

// laggyFaults are the shares of requests each fault takes. Lag, Error and Drop are drawn once per
// HTTP request (at most one of them applies); NullReceipt is drawn per eth_getTransactionReceipt,
// in any request, since a backend that has the block may still not have indexed the receipt.
type laggyFaults struct {
	Lag         float64
	LagBlocks   uint64
	NullReceipt float64
	Error       float64
	Drop        float64
	// Revert is the share of answers the backend rewrites to tell that a mined transaction
	// reverted: its receipt (alone or in its block's) says so and logs nothing, log queries find
	// nothing, and a used authorization reads unused. A provider answering wrong receipts,
	// consistently.
	Revert float64
}

// providerFaults are the shares the fault tests' acceptance target names (a copy is set, so that a
// test may change its own).
var providerFaults = laggyFaults{Lag: 0.30, LagBlocks: 2, NullReceipt: 0.05, Error: 0.05, Drop: 0.02}

func newLaggyRPC(t *testing.T, target string) (*laggyRPC, string) {
	t.Helper()
	heads, err := watchHeads(t, target)
	if err != nil {
		t.Fatal(err)
	}
	p := &laggyRPC{nodeLink: newNodeLink(target, true), heads: heads}
	return p, serveProxy(t, p)
}

// set switches the faults (nil: none).
func (p *laggyRPC) set(f *laggyFaults) { p.faults.Store(f) }

func (p *laggyRPC) String() string {
	return fmt.Sprintf("%d requests: %d in step, %d lagged (%d heads behind, %d answers nulled, %d reads pinned to the old head, "+
		"%d refused as header not found, %d log ranges clamped), %d receipts nulled, %d rate-limit errors, %d HTTP 429, "+
		"%d answers dropped after forwarding; %d send requests (%d failed unsent, %d dropped after forwarding)",
		p.requests.Load(), p.healthy.Load(), p.lagged.Load(), p.lagHeads.Load(), p.lagNulls.Load(), p.lagPinned.Load(),
		p.lagRefused.Load(), p.lagClamped.Load(), p.nullReceipts.Load(), p.rpcErrors.Load(), p.http429.Load(),
		p.dropped.Load(), p.sends.Load(), p.sendsFailed.Load(), p.sendsDropped.Load())
}

// headWatch follows the node's head straight from the node, so that a lagging backend can be
// told apart from a healthy one at the cost of one eth_blockNumber per poll, not per request. It
// also remembers when each block was first seen: the bump audit asks what the chain held when.
type headWatch struct {
	head atomic.Uint64
	mu   sync.Mutex
	seen []time.Time // seen[n]: when block n was first seen at the head
}

const headPoll = 100 * time.Millisecond

func watchHeads(t *testing.T, target string) (*headWatch, error) {
	c, err := rpc.Dial(target)
	if err != nil {
		return nil, err
	}
	w := &headWatch{}
	if err := w.poll(c); err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(headPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = w.poll(c) // a missed poll only makes the next one see two blocks
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; c.Close() })
	return w, nil
}

func (w *headWatch) poll(c *rpc.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var head hexutil.Uint64
	if err := c.CallContext(ctx, &head, "eth_blockNumber"); err != nil {
		return err
	}
	now := time.Now()
	w.mu.Lock()
	for uint64(len(w.seen)) <= uint64(head) {
		w.seen = append(w.seen, now)
	}
	w.mu.Unlock()
	if uint64(head) > w.head.Load() {
		w.head.Store(uint64(head))
	}
	return nil
}

// seenAt is when block n was first seen at the head (the watch's start for earlier blocks);
// ok is false for a block not seen yet.
func (w *headWatch) seenAt(n uint64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n >= uint64(len(w.seen)) {
		return time.Time{}, false
	}
	return w.seen[n], true
}

// rpcMsg is a JSON-RPC request or answer, kept raw where the proxy does not look.
type rpcMsg struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcErr         `json:"error,omitempty"`
}

type rpcErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// errHeaderNotFound is what geth answers for state at a block it does not have (anvil says
// "BlockOutOfRangeError: block height is N but requested was M", code -32602).
var errHeaderNotFound = &rpcErr{Code: -32000, Message: "header not found"}

var jsonNull = json.RawMessage("null")

func (p *laggyRPC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	p.requests.Add(1)
	f := p.faults.Load()
	var msgs []*rpcMsg
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	batch := len(trimmed) > 0 && trimmed[0] == '['
	if batch {
		err = json.Unmarshal(body, &msgs)
	} else {
		var m rpcMsg
		err = json.Unmarshal(body, &m)
		msgs = []*rpcMsg{&m}
	}
	if f == nil || err != nil || len(msgs) == 0 {
		p.healthy.Add(1)
		p.passThrough(w, r, body)
		return
	}
	sends := false
	for _, m := range msgs {
		sends = sends || m.Method == "eth_sendRawTransaction"
	}
	if sends {
		p.sends.Add(1)
	}

	var lag uint64
	dropAfter := false
	switch x := mrand.Float64(); {
	case x < f.Error:
		p.refuse(w, msgs, batch)
		if sends {
			p.sendsFailed.Add(1)
		}
		return
	case x < f.Error+f.Drop:
		dropAfter = true
	case x < f.Error+f.Drop+f.Lag:
		lag = f.LagBlocks
	}
	if lag > 0 {
		p.lagged.Add(1)
	} else {
		p.healthy.Add(1)
	}

	view := p.heads.head.Load() // one head per request: every answer in it agrees
	view -= min(view, lag)
	answers, err := p.answer(r.Context(), msgs, f, lag > 0, view)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if dropAfter {
		p.dropped.Add(1)
		if sends {
			p.sendsDropped.Add(1)
		}
		hangUp(w)
		return
	}
	var out []byte
	if batch {
		out, err = json.Marshal(answers)
	} else {
		out, err = json.Marshal(answers[0])
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// refuse fails the whole request the two ways providers rate-limit: a JSON-RPC error for each
// call, or HTTP 429 with Retry-After. Nothing reaches the node.
func (p *laggyRPC) refuse(w http.ResponseWriter, msgs []*rpcMsg, batch bool) {
	if mrand.IntN(2) == 0 {
		p.http429.Add(1)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "Too Many Requests", http.StatusTooManyRequests)
		return
	}
	p.rpcErrors.Add(1)
	answers := make([]*rpcMsg, len(msgs))
	for i, m := range msgs {
		answers[i] = &rpcMsg{JSONRPC: "2.0", ID: m.ID, Error: &rpcErr{Code: -32005, Message: "rate limited: too many requests"}}
	}
	var out []byte
	if batch {
		out, _ = json.Marshal(answers)
	} else {
		out, _ = json.Marshal(answers[0])
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// passThrough forwards body as it is and returns the node's answer as it is.
func (p *laggyRPC) passThrough(w http.ResponseWriter, r *http.Request, body []byte) {
	out, status, err := p.post(r.Context(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// nodeLink is a fault proxy's own line to the node behind it: the bodies it forwards, and calls
// of its own.
type nodeLink struct {
	target string
	client *http.Client
	// detached: the caller hanging up does not cancel a forwarded request, since a request the
	// node got is one it works on.
	detached bool
}

func newNodeLink(target string, detached bool) nodeLink {
	return nodeLink{target: target, client: &http.Client{Timeout: 30 * time.Second}, detached: detached}
}

// serveProxy serves a fault proxy until the test ends and returns its URL.
func serveProxy(t *testing.T, p http.Handler) string {
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

// post sends one body to the node and returns the node's answer and its HTTP status.
func (l *nodeLink) post(ctx context.Context, body []byte) ([]byte, int, error) {
	if l.detached {
		ctx = context.WithoutCancel(ctx)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.target, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := l.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	return out, res.StatusCode, err
}

// call is one JSON-RPC call of the proxy's own to the node (a block hash's number, say).
func (l *nodeLink) call(ctx context.Context, result any, method string, params ...any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	body, err := json.Marshal(&rpcMsg{JSONRPC: "2.0", ID: json.RawMessage("1"), Method: method, Params: raw})
	if err != nil {
		return err
	}
	out, _, err := l.post(ctx, body)
	if err != nil {
		return err
	}
	var m rpcMsg
	if err := json.Unmarshal(out, &m); err != nil {
		return err
	}
	if m.Error != nil {
		return fmt.Errorf("%s: %s", method, m.Error.Message)
	}
	return json.Unmarshal(m.Result, result)
}

// step is what the proxy does with one call: answer it itself (local), or forward fwd (the
// call's params, maybe rewritten) and pass the node's result through post, if set.
type step struct {
	local *rpcMsg
	fwd   json.RawMessage
	post  func(result json.RawMessage) (json.RawMessage, *rpcErr)
}

// answer handles msgs as one backend whose head is view (lagged) or the node itself: the calls
// that reach the node go in one batch, with ids of the proxy's own.
func (p *laggyRPC) answer(ctx context.Context, msgs []*rpcMsg, f *laggyFaults, lagged bool, view uint64) ([]*rpcMsg, error) {
	steps := make([]step, len(msgs))
	var fwd []*rpcMsg
	for i, m := range msgs {
		st := step{fwd: m.Params}
		if lagged {
			st = p.lagStep(ctx, m, view)
		}
		if m.Method == "eth_getTransactionReceipt" && st.local == nil {
			st.post = p.nullReceipt(f, st.post)
		}
		if (m.Method == "eth_getLogs" || m.Method == "eth_call" || m.Method == "eth_getBlockReceipts") && st.local == nil && f.Revert > 0 {
			st.post = p.unused(f, st.post)
		}
		steps[i] = st
		if st.local == nil {
			fwd = append(fwd, &rpcMsg{JSONRPC: "2.0", ID: json.RawMessage(strconv.Itoa(i)), Method: m.Method, Params: st.fwd})
		}
	}
	got := map[string]*rpcMsg{}
	if len(fwd) > 0 {
		body, err := json.Marshal(fwd)
		if err != nil {
			return nil, err
		}
		out, status, err := p.post(ctx, body)
		if err != nil {
			return nil, err
		}
		var answers []*rpcMsg
		if err := json.Unmarshal(out, &answers); err != nil {
			return nil, fmt.Errorf("the node answered %d %.200s: %w", status, out, err)
		}
		for _, a := range answers {
			got[string(a.ID)] = a
		}
	}
	res := make([]*rpcMsg, len(msgs))
	for i, m := range msgs {
		st := steps[i]
		if st.local != nil {
			st.local.JSONRPC, st.local.ID = "2.0", m.ID
			res[i] = st.local
			continue
		}
		a := got[strconv.Itoa(i)]
		if a == nil {
			a = &rpcMsg{Error: &rpcErr{Code: -32603, Message: "no answer from the node"}}
		}
		a.JSONRPC, a.ID = "2.0", m.ID
		if a.Error == nil && st.post != nil {
			if a.Result == nil {
				a.Result = jsonNull
			}
			a.Result, a.Error = st.post(a.Result)
			if a.Error != nil {
				a.Result = nil
			}
		}
		res[i] = a
	}
	return res, nil
}

// nullReceipt wraps a receipt's post-processing with the null-receipt fault.
func (p *laggyRPC) nullReceipt(f *laggyFaults, then func(json.RawMessage) (json.RawMessage, *rpcErr)) func(json.RawMessage) (json.RawMessage, *rpcErr) {
	return func(result json.RawMessage) (json.RawMessage, *rpcErr) {
		if then != nil {
			var e *rpcErr
			if result, e = then(result); e != nil {
				return nil, e
			}
		}
		if !isNull(result) && mrand.Float64() < f.NullReceipt {
			p.nullReceipts.Add(1)
			return jsonNull, nil
		}
		if !isNull(result) && mrand.Float64() < f.Revert {
			var r map[string]any
			if json.Unmarshal(result, &r) == nil {
				r["status"], r["logs"] = "0x0", []any{}
				if out, err := json.Marshal(r); err == nil {
					p.reverted.Add(1)
					return out, nil
				}
			}
		}
		return result, nil
	}
}

// unused wraps a log or call read's post-processing with the story a receipt rewritten as
// reverted needs to be believed: no log, and a used authorization ("…01") read as unused.
func (p *laggyRPC) unused(f *laggyFaults, then func(json.RawMessage) (json.RawMessage, *rpcErr)) func(json.RawMessage) (json.RawMessage, *rpcErr) {
	return func(result json.RawMessage) (json.RawMessage, *rpcErr) {
		if then != nil {
			var e *rpcErr
			if result, e = then(result); e != nil {
				return nil, e
			}
		}
		if mrand.Float64() >= f.Revert {
			return result, nil
		}
		var list []map[string]any
		if json.Unmarshal(result, &list) == nil && len(list) > 0 {
			if _, receipts := list[0]["status"]; !receipts {
				p.reverted.Add(1)
				return json.RawMessage("[]"), nil // logs: none
			}
			for _, r := range list { // a block's receipts: every one reverted
				r["status"], r["logs"] = "0x0", []any{}
			}
			if out, err := json.Marshal(list); err == nil {
				p.reverted.Add(1)
				return out, nil
			}
		}
		used := `"0x` + strings.Repeat("0", 63) + `1"`
		if string(result) == used {
			p.reverted.Add(1)
			return json.RawMessage(`"0x` + strings.Repeat("0", 64) + `"`), nil
		}
		return result, nil
	}
}

// stateArg is where each state read takes its block (absent: latest).
var stateArg = map[string]int{
	"eth_call": 1, "eth_estimateGas": 1, "eth_createAccessList": 1,
	"eth_getTransactionCount": 1, "eth_getBalance": 1, "eth_getCode": 1, "eth_getStorageAt": 2, "eth_getProof": 2,
}

// lagStep is how a node whose head is view answers m. A send is never lagged: it goes to the
// node, as a provider sends it to a node that broadcasts it.
func (p *laggyRPC) lagStep(ctx context.Context, m *rpcMsg, view uint64) step {
	var params []json.RawMessage
	_ = json.Unmarshal(m.Params, &params) // no params, or not a list: nothing below applies
	local := func(result json.RawMessage, err *rpcErr) step {
		return step{local: &rpcMsg{Result: result, Error: err}}
	}
	pass := step{fwd: m.Params}
	// above drops a post-processed result from a block this backend does not have.
	above := func(field string) func(json.RawMessage) (json.RawMessage, *rpcErr) {
		return func(result json.RawMessage) (json.RawMessage, *rpcErr) {
			if n, ok := numberField(result, field); ok && n > view {
				p.lagNulls.Add(1)
				return jsonNull, nil
			}
			return result, nil
		}
	}
	if i, ok := stateArg[m.Method]; ok {
		for len(params) <= i {
			params = append(params, json.RawMessage(`"latest"`))
		}
		n, tip, ok := p.blockArg(ctx, params[i])
		switch {
		case !ok:
			return pass
		case tip:
			params[i] = hexNumber(view)
			p.lagPinned.Add(1)
		case n > view:
			p.lagRefused.Add(1)
			return local(nil, errHeaderNotFound)
		}
		return step{fwd: mustJSON(params)}
	}
	switch m.Method {
	case "eth_blockNumber":
		p.lagHeads.Add(1)
		return local(hexNumber(view), nil)
	case "eth_getBlockByNumber", "eth_getBlockReceipts":
		if len(params) == 0 {
			return pass
		}
		n, tip, ok := p.blockArg(ctx, params[0])
		switch {
		case !ok:
			return pass
		case tip:
			params[0] = hexNumber(view)
			p.lagPinned.Add(1)
			return step{fwd: mustJSON(params)}
		case n > view:
			p.lagNulls.Add(1)
			return local(jsonNull, nil)
		}
		return pass
	case "eth_getBlockByHash":
		return step{fwd: m.Params, post: above("number")}
	case "eth_getTransactionReceipt", "eth_getTransactionByHash":
		return step{fwd: m.Params, post: above("blockNumber")}
	case "eth_getLogs":
		return p.lagLogs(ctx, m, params, view)
	}
	return pass
}

// lagLogs clamps a log filter's range to view, silently, as a backend that is behind does: the
// logs of the blocks it lacks are simply not in its answer.
func (p *laggyRPC) lagLogs(ctx context.Context, m *rpcMsg, params []json.RawMessage, view uint64) step {
	pass := step{fwd: m.Params}
	if len(params) == 0 {
		return pass
	}
	var filter map[string]json.RawMessage
	if err := json.Unmarshal(params[0], &filter); err != nil {
		return pass
	}
	if h, ok := filter["blockHash"]; ok {
		n, _, ok := p.blockArg(ctx, h)
		if ok && n > view {
			p.lagRefused.Add(1)
			return step{local: &rpcMsg{Error: &rpcErr{Code: -32000, Message: "unknown block"}}}
		}
		return pass
	}
	from, to := uint64(0), view
	if raw, ok := filter["fromBlock"]; ok {
		n, tip, ok := p.blockArg(ctx, raw)
		if !ok {
			return pass
		}
		if tip {
			n = view
		}
		from = n
	} else {
		from = view
	}
	if raw, ok := filter["toBlock"]; ok {
		n, tip, ok := p.blockArg(ctx, raw)
		if !ok {
			return pass
		}
		if !tip && n < view {
			to = n
		}
		if tip || n > view {
			p.lagClamped.Add(1)
		}
	} else {
		p.lagClamped.Add(1)
	}
	if from > to {
		return step{local: &rpcMsg{Result: json.RawMessage("[]")}}
	}
	filter["fromBlock"], filter["toBlock"] = hexNumber(from), hexNumber(to)
	params[0] = mustJSON(filter)
	return step{fwd: mustJSON(params)}
}

// blockArg reads a block parameter: a number (hex, or an EIP-1898 {"blockNumber"}), a hash (EIP-1898
// {"blockHash"}, or a bare hash, resolved through the node), or tip for latest/pending. ok is false
// for what a lagging backend answers like any other (earliest, safe, finalized, a hash the node
// does not know).
func (p *laggyRPC) blockArg(ctx context.Context, raw json.RawMessage) (n uint64, tip, ok bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var obj struct {
			Number *hexutil.Uint64 `json:"blockNumber"`
			Hash   *common.Hash    `json:"blockHash"`
		}
		if json.Unmarshal(raw, &obj) != nil {
			return 0, false, false
		}
		switch {
		case obj.Number != nil:
			return uint64(*obj.Number), false, true
		case obj.Hash != nil:
			s = obj.Hash.Hex()
		default:
			return 0, false, false
		}
	}
	switch s {
	case "latest", "pending", "":
		return 0, true, true
	case "earliest", "safe", "finalized":
		return 0, false, false
	}
	if len(s) == 66 {
		var block *struct {
			Number hexutil.Uint64 `json:"number"`
		}
		if err := p.call(ctx, &block, "eth_getBlockByHash", s, false); err != nil || block == nil {
			return 0, false, false
		}
		return uint64(block.Number), false, true
	}
	v, err := hexutil.DecodeUint64(s)
	return v, false, err == nil
}

// numberField reads a hex number field of a JSON object (false for null, or an object without it).
// A list (eth_getBlockReceipts by hash) answers for its first element.
func numberField(result json.RawMessage, field string) (uint64, bool) {
	if len(result) > 0 && result[0] == '[' {
		var list []json.RawMessage
		if json.Unmarshal(result, &list) != nil || len(list) == 0 {
			return 0, false
		}
		result = list[0]
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(result, &obj) != nil || obj == nil {
		return 0, false
	}
	var n hexutil.Uint64
	if raw, ok := obj[field]; !ok || json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	return uint64(n), true
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

func hexNumber(n uint64) json.RawMessage { return mustJSON(hexutil.EncodeUint64(n)) }

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestFaultProxyRewrites checks the proxy on its own against anvil: a lagging backend answers as
// one node two blocks behind (its head, its latest block, a fresh transaction's receipt and
// nonce, its logs, its refusal of state it does not have), a send still reaches the node, and the
// other faults do what they say: null receipts for mined transactions, rate-limit errors of both
// kinds, and dropped answers whose work the node did.
func TestFaultProxyRewrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, chain := freshStack(ctx, t, "", devchain.Options{BlockTime: time.Second})
	proxy, url := newLaggyRPC(t, chain.RPCURL)
	pc, err := rpc.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	direct := chain.RPC
	head := func() uint64 {
		t.Helper()
		n, err := chain.Client.BlockNumber(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for head() < 3 {
		time.Sleep(200 * time.Millisecond)
	}
	proxy.set(&laggyFaults{Lag: 1, LagBlocks: 2})

	// The head, two blocks behind (give or take the proxy's head poll).
	before := head()
	var lagged hexutil.Uint64
	if err := pc.CallContext(ctx, &lagged, "eth_blockNumber"); err != nil {
		t.Fatal(err)
	}
	if after := head(); uint64(lagged)+2 > after || uint64(lagged)+3 < before {
		t.Fatalf("lagged eth_blockNumber %d; the node's head went from %d to %d meanwhile", lagged, before, after)
	}

	// A fresh transaction, sent through the lagging proxy (sends are not lagged), is mined; until
	// the lagging view reaches its block, that view has no receipt, no mined transaction, the old
	// nonce and no log of it; then it has them all.
	key := newAccount(t)
	if err := chain.SetBalance(ctx, key.Address, big.NewInt(1e18)); err != nil {
		t.Fatal(err)
	}
	tx := signApprove(ctx, t, chain, key, 0)
	if err := ethclient.NewClient(pc).SendTransaction(ctx, tx); err != nil {
		t.Fatalf("a send through the lagging proxy: %v", err)
	}
	approval := crypto.Keccak256Hash([]byte("Approval(address,address,uint256)"))
	filter := map[string]any{"address": chain.USDC.Address, "fromBlock": "0x0", "topics": []any{approval, common.BytesToHash(key.Address.Bytes())}}
	var mined uint64
	sawBehind, sawCaughtUp := false, false
	for !sawCaughtUp {
		if ctx.Err() != nil {
			t.Fatalf("the lagging view never caught up with block %d (saw it behind: %v)", mined, sawBehind)
		}
		if mined == 0 {
			if rc, err := chain.Client.TransactionReceipt(ctx, tx.Hash()); err == nil {
				mined = rc.BlockNumber.Uint64()
			}
		}
		var (
			view     hexutil.Uint64
			rcpt     *types.Receipt
			byHash   map[string]any
			nonce    hexutil.Uint64
			latest   struct{ Number hexutil.Uint64 }
			logs     []types.Log
			pastView map[string]any
		)
		batch := []rpc.BatchElem{
			{Method: "eth_blockNumber", Result: &view},
			{Method: "eth_getTransactionReceipt", Args: []any{tx.Hash()}, Result: &rcpt},
			{Method: "eth_getTransactionByHash", Args: []any{tx.Hash()}, Result: &byHash},
			{Method: "eth_getTransactionCount", Args: []any{key.Address, "latest"}, Result: &nonce},
			{Method: "eth_getBlockByNumber", Args: []any{"latest", false}, Result: &latest},
			{Method: "eth_getLogs", Args: []any{filter}, Result: &logs},
		}
		if err := pc.BatchCallContext(ctx, batch); err != nil {
			t.Fatal(err)
		}
		for _, b := range batch {
			if b.Error != nil {
				t.Fatalf("%s through the lagging proxy: %v", b.Method, b.Error)
			}
		}
		if latest.Number != view {
			t.Fatalf("the lagging backend's latest block is %d, its head %d", latest.Number, view)
		}
		// Past the lagging head nothing exists, unless that head moved on between the batch and
		// this request (a block a second): then the round says nothing and the next one asks again.
		moved := func() bool {
			t.Helper()
			var now hexutil.Uint64
			if err := pc.CallContext(ctx, &now, "eth_blockNumber"); err != nil {
				t.Fatal(err)
			}
			return now > view
		}
		if err := pc.CallContext(ctx, &pastView, "eth_getBlockByNumber", hexutil.EncodeUint64(uint64(view)+1), false); (err != nil || pastView != nil) && !moved() {
			t.Fatalf("block %d, past the lagging head %d: %v %v; want null", view+1, view, pastView, err)
		}
		var bal hexutil.Big
		if err := pc.CallContext(ctx, &bal, "eth_getBalance", key.Address, hexutil.EncodeUint64(uint64(view)+2)); (err == nil || !strings.Contains(err.Error(), "header not found")) && !moved() {
			t.Fatalf("a balance at block %d, past the lagging head %d: %v; want header not found", view+2, view, err)
		}
		switch {
		case mined == 0:
		case uint64(view) < mined:
			sawBehind = true
			if rcpt != nil || byHash != nil || nonce != 0 || len(logs) != 0 {
				t.Fatalf("at lagging head %d, before block %d that mined it: receipt %v, tx %v, nonce %d, %d logs; want none of it", view, mined, rcpt, byHash, nonce, len(logs))
			}
		default:
			if rcpt == nil || rcpt.BlockNumber.Uint64() != mined || byHash == nil || nonce != 1 || len(logs) != 1 {
				t.Fatalf("at lagging head %d, past block %d that mined it: receipt %v, tx %v, nonce %d, %d logs; want all of it", view, mined, rcpt, byHash, nonce, len(logs))
			}
			sawCaughtUp = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !sawBehind {
		t.Fatalf("the lagging view was never behind block %d, which mined the transaction", mined)
	}

	// Null receipts: a mined transaction's receipt is null.
	proxy.set(&laggyFaults{NullReceipt: 1})
	var rcpt *types.Receipt
	if err := pc.CallContext(ctx, &rcpt, "eth_getTransactionReceipt", tx.Hash()); err != nil || rcpt != nil {
		t.Fatalf("a receipt under null receipts: %v %v; want null", rcpt, err)
	}

	// Errors: both kinds of rate limiting, and nothing reaches the node.
	proxy.set(&laggyFaults{Error: 1})
	for range 30 {
		var n hexutil.Uint64
		err := pc.CallContext(ctx, &n, "eth_blockNumber")
		var httpErr rpc.HTTPError
		var rpcErr rpc.Error
		switch {
		case errors.As(err, &httpErr) && httpErr.StatusCode == http.StatusTooManyRequests:
		case errors.As(err, &rpcErr) && rpcErr.ErrorCode() == -32005:
		default:
			t.Fatalf("eth_blockNumber under errors: %d, %v; want HTTP 429 or a -32005 error", n, err)
		}
	}
	if proxy.http429.Load() == 0 || proxy.rpcErrors.Load() == 0 {
		t.Fatalf("30 errors were not of both kinds: %s", proxy)
	}

	// Dropped answers: the caller gets none, and the node still took the transaction.
	proxy.set(&laggyFaults{Drop: 1})
	dropped := signApprove(ctx, t, chain, key, 1)
	if err := ethclient.NewClient(pc).SendTransaction(ctx, dropped); err == nil {
		t.Fatal("a send whose answer was dropped succeeded")
	}
	var seen map[string]any
	if err := direct.CallContext(ctx, &seen, "eth_getTransactionByHash", dropped.Hash()); err != nil || seen == nil {
		t.Fatalf("the node does not have the transaction whose answer was dropped: %v %v", seen, err)
	}
	proxy.set(nil)
	t.Logf("proxy: %s", proxy)
	if proxy.lagHeads.Load() == 0 || proxy.lagNulls.Load() == 0 || proxy.lagPinned.Load() == 0 || proxy.lagRefused.Load() == 0 ||
		proxy.lagClamped.Load() == 0 || proxy.nullReceipts.Load() != 1 || proxy.dropped.Load() != 1 || proxy.sendsDropped.Load() != 1 {
		t.Fatalf("the proxy did not count every fault it made: %s", proxy)
	}
}

// signApprove signs key's approval of one unit of USDC to itself at nonce: a transaction that
// leaves a log.
func signApprove(ctx context.Context, t *testing.T, chain *devchain.Chain, key *devchain.Account, nonce uint64) *types.Transaction {
	t.Helper()
	head, err := chain.Client.HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := chain.USDC.ABI.Pack("approve", key.Address, big.NewInt(1))
	if err != nil {
		t.Fatal(err)
	}
	tip := big.NewInt(1_000_000_000)
	tx, err := types.SignNewTx(key.Key, types.LatestSignerForChainID(new(big.Int).SetUint64(chain.ChainID)), &types.DynamicFeeTx{
		ChainID: new(big.Int).SetUint64(chain.ChainID), Nonce: nonce, GasTipCap: tip,
		GasFeeCap: new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip), Gas: 100_000,
		To: &chain.USDC.Address, Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tx
}
