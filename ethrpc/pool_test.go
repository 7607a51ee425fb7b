package ethrpc_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// fakeEndpoint answers JSON-RPC through function fields, for the provider faults a real node does
// not produce on demand (429s, -32005 with a back-off, a dead transport).
type fakeEndpoint struct {
	calls atomic.Int64
	call  func(method string, result any) error
	batch func(b []rpc.BatchElem) error
}

func (f *fakeEndpoint) CallContext(_ context.Context, result any, method string, _ ...any) error {
	f.calls.Add(1)
	return f.call(method, result)
}

func (f *fakeEndpoint) BatchCallContext(_ context.Context, b []rpc.BatchElem) error {
	f.calls.Add(1)
	return f.batch(b)
}

type rpcErr struct {
	code int
	msg  string
	data any
}

func (e rpcErr) Error() string  { return e.msg }
func (e rpcErr) ErrorCode() int { return e.code }
func (e rpcErr) ErrorData() any { return e.data }

func answering(head uint64) *fakeEndpoint {
	return &fakeEndpoint{
		call: func(method string, result any) error {
			*result.(*hexutil.Uint64) = hexutil.Uint64(head)
			return nil
		},
		batch: func(b []rpc.BatchElem) error {
			for i := range b {
				if h, ok := b[i].Result.(*hexutil.Uint64); ok {
					*h = hexutil.Uint64(head)
				}
				if h, ok := b[i].Result.(*common.Hash); ok {
					*h = common.HexToHash("0xabc")
				}
			}
			return nil
		},
	}
}

func failing(err error) *fakeEndpoint {
	return &fakeEndpoint{call: func(string, any) error { return err }, batch: func([]rpc.BatchElem) error { return err }}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newPool(t *testing.T, c *clock, chains ...ethrpc.Chain) *ethrpc.Pool {
	t.Helper()
	var eps []ethrpc.Endpoint
	for i, ch := range chains {
		eps = append(eps, ethrpc.Endpoint{Name: "rpc" + string(rune('0'+i)), Chain: ch})
	}
	p, err := ethrpc.NewPool(eps, nil, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readUntilAsked reads the head through p until e has been asked once more (reads start at an
// endpoint drawn at random), each read answered (by another endpoint when e fails), and returns
// the last head read.
func readUntilAsked(t *testing.T, p *ethrpc.Pool, e *fakeEndpoint) hexutil.Uint64 {
	t.Helper()
	before := e.calls.Load()
	for range 64 {
		var head hexutil.Uint64
		if err := p.CallContext(context.Background(), &head, "eth_blockNumber"); err != nil {
			t.Fatalf("read: %v", err)
		}
		if e.calls.Load() > before {
			return head
		}
	}
	t.Fatal("64 reads never reached the endpoint")
	return 0
}

// TestPoolFailsOver: a transport failure, an HTTP 429 and a -32005 send the read to the next
// endpoint, and the failed one is left alone for its back-off (the one a rate limit asks for,
// when it says); a JSON-RPC error is an answer and is not retried elsewhere.
func TestPoolFailsOver(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		err  error
		wait time.Duration // how long the failed endpoint is left alone
	}{
		{"transport down", errors.New(`Post "https://rpc.example/v2/SECRETKEY": dial tcp 127.0.0.1:443: connect: connection refused`), time.Second},
		{"http 429", rpc.HTTPError{StatusCode: 429, Status: "429 Too Many Requests"}, time.Second},
		{"-32005 with a back-off", rpcErr{code: -32005, msg: "limit exceeded", data: map[string]any{"backoff_seconds": 5.0}}, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1_000, 0)}
			bad, good := failing(c.err), answering(42)
			p := newPool(t, clk, bad, good)
			if head := readUntilAsked(t, p, bad); head != 42 {
				t.Fatalf("the read that tried the bad endpoint: head %d; want 42 from the good one", head)
			}
			var head hexutil.Uint64
			h := p.Health()
			if h[0].Healthy || !h[1].Healthy || h[1].Head != 42 {
				t.Fatalf("health after the failure: %+v", h)
			}
			if strings.Contains(h[0].LastError, "SECRETKEY") || h[0].LastError == "" {
				t.Fatalf("the endpoint's last error %q: want it, without the URL's key", h[0].LastError)
			}
			// Left alone until its back-off ends: reads go to the good one only.
			before := bad.calls.Load()
			for range 4 {
				if err := p.CallContext(ctx, &head, "eth_blockNumber"); err != nil {
					t.Fatal(err)
				}
			}
			if bad.calls.Load() != before {
				t.Fatalf("the failed endpoint was asked again during its back-off")
			}
			// Its back-off over, it still reads down (it has not answered since), and the pool tries
			// it again.
			clk.add(c.wait)
			if p.Health()[0].Healthy {
				t.Fatalf("read up after its back-off, before it answered again")
			}
			readUntilAsked(t, p, bad) // fails when it is still left alone
		})
	}
	t.Run("an answer is not retried", func(t *testing.T) {
		reverted := &fakeEndpoint{call: func(string, any) error { return rpcErr{code: 3, msg: "execution reverted"} }}
		other := &fakeEndpoint{call: func(string, any) error { return nil }}
		p := newPool(t, &clock{t: time.Unix(1_000, 0)}, reverted, other)
		var out hexutil.Bytes
		// Reads start at an endpoint drawn at random: read until one has started at the reverting one.
		for range 64 {
			asked := other.calls.Load()
			err := p.CallContext(ctx, &out, "eth_call")
			if reverted.calls.Load() == 0 {
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "execution reverted") || other.calls.Load() != asked {
				t.Fatalf("a revert: %v, other endpoint asked %d more times; want the revert, no retry", err, other.calls.Load()-asked)
			}
			break
		}
		if reverted.calls.Load() == 0 {
			t.Fatal("64 reads never started at the first endpoint")
		}
		if !p.Health()[0].Healthy {
			t.Fatal("an endpoint that answered a revert was marked down")
		}
	})
}

// TestPoolBroadcastsToEvery: a send goes to every healthy endpoint, and succeeds when any of them
// took it (here the first is down), with the hash it answered.
func TestPoolBroadcastsToEvery(t *testing.T) {
	down, a, b := failing(errors.New("connection refused")), answering(1), answering(1)
	p := newPool(t, &clock{t: time.Unix(1_000, 0)}, down, a, b)
	var h common.Hash
	elems := []rpc.BatchElem{{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes{1}}, Result: &h}}
	if err := p.BatchCallContext(context.Background(), elems); err != nil || elems[0].Error != nil {
		t.Fatalf("send: %v / %v", err, elems[0].Error)
	}
	if h != common.HexToHash("0xabc") || a.calls.Load() != 1 || b.calls.Load() != 1 {
		t.Fatalf("hash %s; endpoints asked %d and %d times; want the answer from both", h, a.calls.Load(), b.calls.Load())
	}
	// Mixing reads into a send batch is refused: their answers could come from any endpoint.
	mixed := []rpc.BatchElem{{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes{1}}, Result: &h}, {Method: "eth_blockNumber", Result: new(hexutil.Uint64)}}
	if err := p.BatchCallContext(context.Background(), mixed); err == nil {
		t.Fatal("a batch mixing a send and a read was accepted")
	}
}

// TestPoolPicksOutOfStep: a caller that makes the same number of calls between its quorum picks
// (a watcher whose rounds read a head, a batch of receipts and then a quorum beside the endpoint
// that answered) is handed each other endpoint in turn over its rounds, not the same one every
// round: with a liar among three, a pick that always held the liar would hold a settlement pending
// for ever. (Picks that started where the last left off handed it the same endpoint each round.)
func TestPoolPicksOutOfStep(t *testing.T) {
	ctx := context.Background()
	for calls := range 5 {
		// Each endpoint answers its own index as the head, which names it.
		p := newPool(t, &clock{t: time.Unix(1_000, 0)}, answering(0), answering(1), answering(2))
		named := map[string]int{}
		for range 64 {
			var head hexutil.Uint64
			for range calls {
				if err := p.CallContext(ctx, &head, "eth_blockNumber"); err != nil {
					t.Fatal(err)
				}
			}
			eps, ok := p.Several(1, "rpc0")
			if !ok || len(eps) != 1 {
				t.Fatalf("no endpoint beside rpc0: %v", eps)
			}
			if err := eps[0].CallContext(ctx, &head, "eth_blockNumber"); err != nil {
				t.Fatal(err)
			}
			named[fmt.Sprintf("rpc%d", head)]++
		}
		if named["rpc1"] == 0 || named["rpc2"] == 0 || named["rpc0"] != 0 {
			t.Errorf("with %d calls between picks, 64 picks beside rpc0 named %v; want rpc1 and rpc2 both", calls, named)
		}
	}
}

// TestPoolPair: two different healthy endpoints, or none when fewer are healthy.
func TestPoolPair(t *testing.T) {
	clk := &clock{t: time.Unix(1_000, 0)}
	a, b := answering(7), failing(errors.New("connection refused"))
	p := newPool(t, clk, a, b)
	readUntilAsked(t, p, b) // marks b down
	if _, _, ok := p.Pair(); ok {
		t.Fatal("a pair with one healthy endpoint")
	}
	p = newPool(t, clk, answering(7), answering(9))
	x, y, ok := p.Pair()
	if !ok {
		t.Fatal("no pair of two healthy endpoints")
	}
	var hx, hy hexutil.Uint64
	if err := x.CallContext(context.Background(), &hx, "eth_blockNumber"); err != nil {
		t.Fatal(err)
	}
	if err := y.CallContext(context.Background(), &hy, "eth_blockNumber"); err != nil {
		t.Fatal(err)
	}
	if hx == hy {
		t.Fatalf("the pair is one endpoint twice (both answered %d)", hx)
	}
}

// TestPoolQuorum: the quorum defaults to two with several endpoints and one with one, is held to
// the endpoints there are, and Several names that many different healthy endpoints or none.
func TestPoolQuorum(t *testing.T) {
	clk := &clock{t: time.Unix(1_000, 0)}
	if q := newPool(t, clk, answering(1)).Quorum(); q != 1 {
		t.Fatalf("one endpoint: quorum %d, want 1", q)
	}
	p := newPool(t, clk, answering(7), answering(8), answering(9))
	if q := p.Quorum(); q != 2 {
		t.Fatalf("three endpoints: quorum %d, want 2", q)
	}
	for _, q := range []int{0, 4} {
		if err := p.SetQuorum(q); err == nil {
			t.Fatalf("quorum %d of three endpoints accepted", q)
		}
	}
	if err := p.SetQuorum(3); err != nil || p.Quorum() != 3 {
		t.Fatalf("quorum 3 of three: %v, %d", err, p.Quorum())
	}
	chains, ok := p.Several(3)
	if !ok || len(chains) != 3 {
		t.Fatalf("Several(3) of three healthy: %d, %v", len(chains), ok)
	}
	seen := map[hexutil.Uint64]bool{}
	for _, c := range chains {
		var h hexutil.Uint64
		if err := c.CallContext(context.Background(), &h, "eth_blockNumber"); err != nil {
			t.Fatal(err)
		}
		seen[h] = true
	}
	if len(seen) != 3 {
		t.Fatalf("Several(3) named %d different endpoints", len(seen))
	}
	refusing := failing(errors.New("connection refused"))
	down := newPool(t, clk, answering(7), refusing)
	readUntilAsked(t, down, refusing)
	if _, ok := down.Several(2); ok {
		t.Fatal("Several(2) with one healthy endpoint")
	}
}

// TestPoolOnAnvil: a pool of a dead endpoint and the real node reads, and sends a transaction
// that the chain mines, through the live one.
func TestPoolOnAnvil(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, err := rpc.DialContext(ctx, "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	p, err := ethrpc.NewPool([]ethrpc.Endpoint{{Name: "rpc0", Chain: dead}, {Name: "rpc1", Chain: chain.RPC, Rate: 100, Burst: 10}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var head hexutil.Uint64
	if err := p.CallContext(ctx, &head, "eth_blockNumber"); err != nil {
		t.Fatalf("a read with one endpoint dead: %v", err)
	}
	key := chain.Accounts[9]
	var nonce hexutil.Uint64
	if err := p.CallContext(ctx, &nonce, "eth_getTransactionCount", key.Address, "latest"); err != nil {
		t.Fatal(err)
	}
	tx, err := ethrpc.NewSigner(chain.ChainID, key.Key).Sign(uint64(nonce), &key.Address, nil, 21_000, big.NewInt(1e9), big.NewInt(100e9))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := tx.MarshalBinary()
	var h common.Hash
	elems := []rpc.BatchElem{{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes(raw)}, Result: &h}}
	if err := p.BatchCallContext(ctx, elems); err != nil || elems[0].Error != nil || h != tx.Hash() {
		t.Fatalf("send: %v / %v, hash %s want %s", err, elems[0].Error, h, tx.Hash())
	}
	for {
		var r *types.Receipt
		if err := p.CallContext(ctx, &r, "eth_getTransactionReceipt", h); err != nil {
			t.Fatal(err)
		}
		if r != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if h := p.Health(); h[0].Healthy || !h[1].Healthy || h[1].Head == 0 {
		t.Fatalf("health: %+v", h)
	}
}

// TestPoolStartsDown: an endpoint known down when the pool is made (serve's start-up checks found
// it silent) starts left alone: reads go to the others without waiting on it first, and it reads
// down in Health. One that answers as unfit (ErrUnfit: another chain) is a failure, not an
// answer: the read goes on to the next endpoint and the unfit one is left alone.
func TestPoolStartsDown(t *testing.T) {
	silent := &fakeEndpoint{call: func(string, any) error { return errors.New("unreachable: must not be asked") }}
	good := answering(7)
	pool, err := ethrpc.NewPool([]ethrpc.Endpoint{
		{Name: "rpc0", Chain: silent, Down: errors.New("no answer within --rpc-timeout")},
		{Name: "rpc1", Chain: good},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 { // whichever endpoint the pool draws first
		var head hexutil.Uint64
		if err := pool.CallContext(context.Background(), &head, "eth_blockNumber"); err != nil || head != 7 {
			t.Fatalf("read with rpc0 down from the start: %v, %d", err, head)
		}
	}
	if n := silent.calls.Load(); n != 0 {
		t.Fatalf("the endpoint down from the start was asked %d times during its back-off", n)
	}
	if h := pool.Health(); h[0].Healthy || !strings.Contains(h[0].LastError, "--rpc-timeout") || !h[1].Healthy {
		t.Fatalf("health: %+v", h)
	}

	unfit := &fakeEndpoint{call: func(string, any) error { return fmt.Errorf("%w: serves chain 1", ethrpc.ErrUnfit) }}
	pool, err = ethrpc.NewPool([]ethrpc.Endpoint{{Name: "rpc0", Chain: unfit}, {Name: "rpc1", Chain: answering(9)}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		var head hexutil.Uint64
		if err := pool.CallContext(context.Background(), &head, "eth_blockNumber"); err != nil || head != 9 {
			t.Fatalf("read beside an unfit endpoint: %v, %d", err, head)
		}
	}
	if n := unfit.calls.Load(); n != 1 {
		t.Fatalf("the unfit endpoint was asked %d times; want once, then left alone", n)
	}
	if h := pool.Health(); h[0].Healthy {
		t.Fatalf("the unfit endpoint reads healthy: %+v", h)
	}
}
