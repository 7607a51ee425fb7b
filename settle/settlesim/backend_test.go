package settlesim

import (
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

var (
	_ ethrpc.Chain = (*Backend)(nil)
	_ ethrpc.Chain = (*Balancer)(nil)
)

// TestLagView: a node k blocks behind answers as a node whose head is head−k, for every method:
// latest is its head, what is above is absent, explicit reads above are errors.
func TestLagView(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	ctx := context.Background()
	lag := NewBackend(w.chain, "lag", Profile{MinLag: 2, MaxLag: 2}, w.rng)
	clamp := NewBackend(w.chain, "clamp", Profile{MinLag: 2, MaxLag: 2, ClampLogs: true}, w.rng)
	w.chain.Mine()
	w.chain.Mine()
	a := w.auth(1, 3)
	tx := w.sign(0, calldata(a), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	w.mustSend(tx)
	head := w.chain.Mine()

	var n hexutil.Uint64
	if err := lag.CallContext(ctx, &n, "eth_blockNumber"); err != nil || n != 1 {
		t.Fatalf("lagging head %d %v, want 1", n, err)
	}
	if r := receipt(t, lag, tx.Hash()); r != nil {
		t.Fatalf("a receipt above the node's head: %+v", r)
	}
	if r := receipt(t, w.node, tx.Hash()); r == nil {
		t.Fatal("no receipt at the head")
	}
	var h *types.Header
	if err := lag.CallContext(ctx, &h, "eth_getBlockByNumber", hexutil.EncodeUint64(head.Number), false); err != nil || h != nil {
		t.Fatalf("block above the head: %v %v, want null", h, err)
	}
	if err := lag.CallContext(ctx, &h, "eth_getBlockByHash", head.Hash, false); err != nil || h != nil {
		t.Fatalf("block by hash above the head: %v %v, want null", h, err)
	}
	if err := lag.CallContext(ctx, &h, "eth_getBlockByNumber", "latest", false); err != nil || h.Number.Uint64() != 1 {
		t.Fatalf("latest %v %v", h, err)
	}
	var rs []*types.Receipt
	if err := lag.CallContext(ctx, &rs, "eth_getBlockReceipts", hexutil.EncodeUint64(head.Number)); err != nil || rs != nil {
		t.Fatalf("block receipts above the head: %v %v, want null", rs, err)
	}
	var bal hexutil.Big
	wantRPCError(t, lag.CallContext(ctx, &bal, "eth_getBalance", w.addr, hexutil.EncodeUint64(head.Number)), "header not found")
	var state hexutil.Bytes
	call := map[string]any{"to": w.chain.Token(), "input": hexutil.Bytes(eip3009.AuthorizationStateCalldata(a.From, a.Nonce))}
	wantRPCError(t, lag.CallContext(ctx, &state, "eth_call", call, map[string]any{"blockHash": head.Hash}), "header for hash not found")
	if authorizationUsed(t, lag, w.chain.Token(), a.From, a.Nonce, "latest") {
		t.Fatal("the lagging node sees the authorization used")
	}
	var nonce hexutil.Uint64
	if err := lag.CallContext(ctx, &nonce, "eth_getTransactionCount", w.addr, "pending"); err != nil || nonce != 0 {
		t.Fatalf("lagging pending nonce %d %v, want 0 (the node has not seen the block)", nonce, err)
	}
	filter := map[string]any{"fromBlock": "0x0", "toBlock": hexutil.EncodeUint64(head.Number), "address": w.chain.Token()}
	var logs []types.Log
	wantRPCError(t, lag.CallContext(ctx, &logs, "eth_getLogs", filter), "block range extends beyond current head block")
	if err := clamp.CallContext(ctx, &logs, "eth_getLogs", filter); err != nil || logs == nil || len(logs) != 0 {
		t.Fatalf("clamped logs %v %v, want none", logs, err)
	}
	filter["fromBlock"] = hexutil.EncodeUint64(head.Number)
	filter["toBlock"] = "latest"
	wantRPCError(t, lag.CallContext(ctx, &logs, "eth_getLogs", filter), "invalid block range params")

	// The lagging node takes the mined transaction again (its state has the nonce free); the
	// network does not.
	if err := send(lag, tx); err != nil {
		t.Fatalf("lagging node refused: %v", err)
	}
	if len(w.chain.Pool()) != 0 {
		t.Fatal("the lagging node's acceptance reached the pool")
	}
}

// TestLagNeverGoesBack: a node with a random lag catches up, and never answers from an older
// head than it did before.
func TestLagNeverGoesBack(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	b := NewBackend(w.chain, "lag", Profile{MaxLag: 3}, w.rng)
	last := uint64(0)
	for i := range 60 {
		if i%3 == 0 {
			w.chain.Mine()
		}
		var n hexutil.Uint64
		if err := b.CallContext(context.Background(), &n, "eth_blockNumber"); err != nil {
			t.Fatal(err)
		}
		if uint64(n) < last || uint64(n)+3 < w.chain.Head().Number {
			t.Fatalf("read %d: head %d after %d, chain at %d", i, n, last, w.chain.Head().Number)
		}
		last = uint64(n)
	}
}

// TestLaggingNodeOnOldBranch: a node behind a reorganisation answers from the branch it was on:
// the receipt it serves is in a block that is no longer canonical.
func TestLaggingNodeOnOldBranch(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	lag := NewBackend(w.chain, "lag", Profile{MinLag: 1, MaxLag: 1}, w.rng)
	for range 3 {
		w.chain.Mine()
	}
	tx := w.sign(0, calldata(w.auth(1, 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	w.mustSend(tx)
	old := w.chain.Mine()
	branch, err := w.chain.Reorg(1, ReorgReinclude)
	if err != nil {
		t.Fatal(err)
	}
	if len(branch) != 2 || branch[1].Txs[0] != tx.Hash() {
		t.Fatalf("branch %+v", branch)
	}
	if r := receipt(t, lag, tx.Hash()); r == nil || r.BlockHash != old.Hash {
		t.Fatalf("lagging receipt %+v, want the old block's", r)
	}
	if r := receipt(t, w.node, tx.Hash()); r == nil || r.BlockHash != branch[1].Hash {
		t.Fatalf("receipt %+v, want the new branch's", r)
	}
	var nonce hexutil.Uint64
	wantRPCError(t, w.node.CallContext(context.Background(), &nonce, "eth_getTransactionCount", w.addr,
		map[string]any{"blockHash": old.Hash, "requireCanonical": true}), "hash is not currently canonical")
	if err := w.node.CallContext(context.Background(), &nonce, "eth_getTransactionCount", w.addr, map[string]any{"blockHash": old.Hash}); err != nil || nonce != 1 {
		t.Fatalf("nonce at the old block %d %v", nonce, err)
	}
	w.chain.Mine()
	if r := receipt(t, lag, tx.Hash()); r == nil || r.BlockHash != branch[1].Hash {
		t.Fatalf("caught-up receipt %+v", r)
	}
}

// TestBackendFaults: each fault looks to the caller as it does from a real provider through
// go-ethereum's client, and is applied or not as a real one would be.
func TestBackendFaults(t *testing.T) {
	ctx := context.Background()
	fresh := func(t *testing.T, p Profile) (*world, *Backend, *types.Transaction) {
		w := newWorld(t, ChainConfig{})
		return w, NewBackend(w.chain, "faulty", p, w.rng), w.sign(0, calldata(w.auth(1, 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	}
	t.Run("dropped answer", func(t *testing.T) {
		w, b, tx := fresh(t, Profile{Drop: 1, DropDelay: 5 * time.Second})
		err := send(b, tx)
		var re rpc.Error
		if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &re) {
			t.Fatalf("dropped answer: %v, want a timeout", err)
		}
		if p := w.chain.Pool(); len(p) != 1 || p[0] != tx.Hash() {
			t.Fatal("the dropped send did not reach the pool")
		}
		if w.clock.Now() != start.Add(5*time.Second) {
			t.Fatalf("clock %s", w.clock.Now())
		}
	})
	t.Run("failed request", func(t *testing.T) {
		w, b, tx := fresh(t, Profile{Fail: 1})
		err := send(b, tx)
		var re rpc.Error
		if err == nil || errors.As(err, &re) || len(w.chain.Pool()) != 0 {
			t.Fatalf("failed request: %v, pool %v", err, w.chain.Pool())
		}
	})
	t.Run("rate limited", func(t *testing.T) {
		_, b, tx := fresh(t, Profile{RateLimit: 1})
		var he rpc.HTTPError
		if err := send(b, tx); !errors.As(err, &he) || he.StatusCode != 429 {
			t.Fatalf("rate limited: %v", err)
		}
	})
	t.Run("element errors", func(t *testing.T) {
		_, b, _ := fresh(t, Profile{ElemFail: 1})
		elems := make([]rpc.BatchElem, 20)
		for i := range elems {
			elems[i] = rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{common.Hash{byte(i)}}, Result: new(*types.Receipt)}
		}
		if err := b.BatchCallContext(ctx, elems); err != nil {
			t.Fatal(err)
		}
		kinds := map[string]bool{}
		for _, el := range elems {
			if el.Error == nil {
				t.Fatal("an element without its error")
			}
			kinds[el.Error.Error()] = true
		}
		if len(kinds) < 3 {
			t.Fatalf("element errors %v: want several kinds", kinds)
		}
	})
	t.Run("null receipt", func(t *testing.T) {
		w, b, tx := fresh(t, Profile{NullReceipt: 1})
		w.mustSend(tx)
		w.chain.Mine()
		if r := receipt(t, b, tx.Hash()); r != nil {
			t.Fatalf("receipt %+v, want null", r)
		}
	})
	t.Run("no block receipts", func(t *testing.T) {
		_, b, _ := fresh(t, Profile{NoBlockReceipts: true})
		var rs []*types.Receipt
		err := b.CallContext(ctx, &rs, "eth_getBlockReceipts", "0x0")
		wantRPCError(t, err, "the method eth_getBlockReceipts does not exist/is not available")
		if err.(rpc.Error).ErrorCode() != -32601 {
			t.Fatalf("code %d", err.(rpc.Error).ErrorCode())
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		w, b, tx := fresh(t, Profile{})
		done, cancel := context.WithCancel(ctx)
		cancel()
		raw, _ := tx.MarshalBinary()
		if err := b.CallContext(done, nil, "eth_sendRawTransaction", hexutil.Bytes(raw)); !errors.Is(err, context.Canceled) || len(w.chain.Pool()) != 0 {
			t.Fatalf("cancelled send: %v", err)
		}
	})
}

// TestClientShapes: results and errors reach the caller as go-ethereum's client delivers them.
func TestClientShapes(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	ctx := context.Background()
	var id hexutil.Uint64
	if err := w.node.CallContext(ctx, &id, "eth_chainId"); err != nil || id != 1337 {
		t.Fatalf("chain id %d %v", id, err)
	}
	if err := w.node.CallContext(ctx, id, "eth_chainId"); err == nil {
		t.Fatal("a non-pointer result was accepted")
	}
	if err := w.node.CallContext(ctx, nil, "eth_blockNumber"); err != nil {
		t.Fatalf("nil result: %v", err)
	}
	if err := w.node.BatchCallContext(ctx, nil); err == nil {
		t.Fatal("an empty batch was accepted")
	}
	elems := []rpc.BatchElem{
		{Method: "eth_blockNumber"}, // no result: the client's json.Unmarshal(…, nil) error
		{Method: "eth_nope", Result: new(json.RawMessage)},
		{Method: "eth_getBalance", Args: []any{w.addr}, Result: new(hexutil.Big)},
		{Method: "eth_maxPriorityFeePerGas", Result: new(hexutil.Big)},
		{Method: "eth_getTransactionReceipt", Args: []any{common.Hash{1}}, Result: new(*types.Receipt)},
	}
	if err := w.node.BatchCallContext(ctx, elems); err != nil {
		t.Fatal(err)
	}
	if elems[0].Error == nil {
		t.Error("a nil result decoded")
	}
	wantRPCError(t, elems[1].Error, "the method eth_nope does not exist/is not available")
	wantRPCError(t, elems[2].Error, "missing value for required argument 1")
	if elems[3].Error != nil || (*big.Int)(elems[3].Result.(*hexutil.Big)).Cmp(gwei) != 0 {
		t.Errorf("tip %v %v", elems[3].Result, elems[3].Error)
	}
	if elems[4].Error != nil || *elems[4].Result.(**types.Receipt) != nil {
		t.Errorf("unknown receipt %v %v, want nil", elems[4].Result, elems[4].Error)
	}
	var fee hexutil.Big
	if err := w.node.CallContext(ctx, &fee, "eth_getBalance", w.addr, "finalized"); err != nil || fee.ToInt().Sign() == 0 {
		t.Fatalf("balance at finalized %v %v", fee.ToInt(), err)
	}
}

// TestBalancer: requests spread over the backends, the same way for the same seed.
func TestBalancer(t *testing.T) {
	run := func() []uint64 {
		w := newWorld(t, ChainConfig{})
		for range 5 {
			w.chain.Mine()
		}
		lb := NewBalancer(rand.New(rand.NewPCG(9, 9)), NewBackend(w.chain, "a", Profile{}, w.rng), NewBackend(w.chain, "b", Profile{MinLag: 3, MaxLag: 3}, w.rng))
		var out []uint64
		for range 20 {
			var n hexutil.Uint64
			if err := lb.CallContext(context.Background(), &n, "eth_blockNumber"); err != nil {
				t.Fatal(err)
			}
			out = append(out, uint64(n))
		}
		return out
	}
	a, b := run(), run()
	seen := map[uint64]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed, different picks: %v %v", a, b)
		}
		seen[a[i]] = true
	}
	if !seen[5] || !seen[2] {
		t.Fatalf("heads %v: want both backends", a)
	}
}

// TestBalancerSplitBatches: a balancer that spreads a batch's elements answers one batch from
// nodes that disagree.
func TestBalancerSplitBatches(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	for range 5 {
		w.chain.Mine()
	}
	lb := NewBalancer(w.rng, NewBackend(w.chain, "a", Profile{}, w.rng), NewBackend(w.chain, "b", Profile{MinLag: 3, MaxLag: 3}, w.rng))
	lb.SplitBatches(true)
	heads := make([]hexutil.Uint64, 20)
	elems := make([]rpc.BatchElem, len(heads))
	for i := range elems {
		elems[i] = rpc.BatchElem{Method: "eth_blockNumber", Result: &heads[i]}
	}
	if err := lb.BatchCallContext(context.Background(), elems); err != nil {
		t.Fatal(err)
	}
	seen := map[hexutil.Uint64]bool{}
	for i, h := range heads {
		if elems[i].Error != nil {
			t.Fatal(elems[i].Error)
		}
		seen[h] = true
	}
	if !seen[5] || !seen[2] {
		t.Fatalf("heads %v in one batch: want both nodes'", heads)
	}
}
