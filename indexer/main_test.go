package indexer_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The package's tests share one anvil with real USDC and one database of their own. The index
// tables are keyed by network, so each test binds a network id of its own (same chain, same
// genesis) and never sees another test's rows, cursor or lease.
var (
	chain   *devchain.Chain
	store   *postgres.DB
	pool    *pgxpool.Pool // for reading the index tables directly
	genesis common.Hash
	dbURL   string
)

func TestMain(m *testing.M) {
	stacktest.Main(m, "indexer", func(e *stacktest.Env) int {
		h, err := e.Chain.Client.HeaderByNumber(context.Background(), big.NewInt(0))
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: the chain's genesis: %v\n", err)
			return 1
		}
		chain, store, pool, genesis, dbURL = e.Chain, e.DB, e.Pool, h.Hash(), e.DBURL
		return m.Run()
	})
}

// bindNetwork binds a network id of the test's own to the shared chain.
func bindNetwork(t testing.TB) string {
	t.Helper()
	name := strings.NewReplacer("/", ":", " ", "_").Replace(t.Name())
	id := fmt.Sprintf("%s#%s", facilitator.CAIP2(chain.ChainID), name)
	if err := store.BindNetwork(context.Background(), id, chain.ChainID, genesis); err != nil {
		t.Fatal(err)
	}
	return id
}

// running is an indexer running in the background for one test.
type running struct {
	ix      *indexer.Indexer
	network string
	run     *stacktest.Indexer
}

// config is the tests' default indexer configuration: USDC, a small finality depth, fast polling.
func config(network string) indexer.Config {
	return indexer.Config{
		Network:      network,
		Tokens:       []common.Address{chain.USDC.Address},
		Chain:        chain.RPC,
		Heads:        ethrpc.NewHeads(0, nil, chain.WSURL),
		Store:        store,
		Finality:     facilitator.Finality{Depth: 2},
		PollInterval: 50 * time.Millisecond,
	}
}

// freshConfig is config on a network of the test's own, from the chain's next block.
func freshConfig(t testing.TB) indexer.Config {
	t.Helper()
	cfg := config(bindNetwork(t))
	cfg.StartBlock = head(t) + 1
	return cfg
}

// start runs an indexer until the test ends (or stop).
func start(t testing.TB, cfg indexer.Config) *running {
	t.Helper()
	log, stopLog := testLogger(t)
	if cfg.Logger == nil {
		cfg.Logger = log
	}
	run := stacktest.RunIndexer(t, cfg, stopLog, func(err error) bool { return errors.Is(err, indexer.ErrDeepReorg) })
	return &running{ix: run.Service(), network: cfg.Network, run: run}
}

// stop stops the indexer and returns what Stop returned.
func (r *running) stop() error { return r.run.Stop() }

// waitCursor waits until the indexer's cursor reaches block n.
func (r *running) waitCursor(t testing.TB, n uint64, within time.Duration) indexer.Health {
	t.Helper()
	return r.waitFor(t, fmt.Sprintf("cursor >= %d", n), within, func(s indexer.Health) bool { return s.Cursor >= n })
}

// waitFor polls the indexer's status until cond holds, failing with the last status after within.
func (r *running) waitFor(t testing.TB, what string, within time.Duration, cond func(indexer.Health) bool) indexer.Health {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := r.ix.Health()
		if cond(s) {
			return s
		}
		select {
		case <-r.ix.Done():
			t.Fatalf("waiting for %s: the indexer stopped (%v); status %+v", what, r.ix.Err(), s)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not after %s; status %+v", what, within, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// head is the chain's latest block number.
func head(t testing.TB) uint64 {
	t.Helper()
	var n hexutil.Uint64
	if err := chain.RPC.CallContext(context.Background(), &n, "eth_blockNumber"); err != nil {
		t.Fatal(err)
	}
	return uint64(n)
}

// mine mines n empty blocks.
func mine(t testing.TB, n int) {
	t.Helper()
	if err := chain.RPC.CallContext(context.Background(), nil, "anvil_mine", hexutil.EncodeUint64(uint64(n))); err != nil {
		t.Fatalf("anvil_mine %d: %v", n, err)
	}
}

// gasAccount is a fresh key holding ETH, so tests never share a nonce stream.
func gasAccount(t testing.TB) *devchain.Account {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	a := &devchain.Account{Key: k, Address: crypto.PubkeyToAddress(k.PublicKey)}
	eth := new(big.Int).Mul(big.NewInt(1_000_000), big.NewInt(1e18))
	if err := chain.SetBalance(context.Background(), a.Address, eth); err != nil {
		t.Fatal(err)
	}
	return a
}

func randomAddress(t testing.TB) common.Address {
	t.Helper()
	var a common.Address
	if _, err := rand.Read(a[:]); err != nil {
		t.Fatal(err)
	}
	return a
}

// settled is a transferWithAuthorization mined on chain.
type settled struct {
	tx     common.Hash
	block  uint64
	payer  common.Address
	to     common.Address
	nonce  [32]byte
	amount *big.Int
}

// payOnce settles one EIP-3009 transfer from a dev account (which holds USDC) to a fresh address,
// submitted by sender, and waits for its receipt.
func payOnce(t testing.TB, payer *devchain.Account, sender *devchain.Account, amount int64) settled {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := devchain.TransferAuthorization{From: payer.Address, To: randomAddress(t), Value: big.NewInt(amount),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 3600), Nonce: stacktest.Random32(t)}
	sig, err := chain.USDC.SignTransferAuthorization(payer.Key, a)
	if err != nil {
		t.Fatal(err)
	}
	hash, err := chain.USDC.TransferWithAuthorization(ctx, sender, a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig)
	if err != nil {
		t.Fatal(err)
	}
	rcpt, err := chain.Client.TransactionReceipt(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	return settled{tx: hash, block: rcpt.BlockNumber.Uint64(), payer: a.From, to: a.To, nonce: a.Nonce, amount: a.Value}
}

// ---- raw transactions, signed here and sent in JSON-RPC batches ----

// txSender signs EIP-1559 transactions from a fresh funded key, counting nonces itself.
type txSender struct {
	key   *ecdsa.PrivateKey
	addr  common.Address
	nonce uint64
}

func newTxSenders(t testing.TB, n int) []*txSender {
	t.Helper()
	out := make([]*txSender, n)
	for i := range out {
		a := gasAccount(t)
		out[i] = &txSender{key: a.Key, addr: a.Address}
	}
	return out
}

// sign signs a call (to != nil) or a deployment (to == nil) with a fixed gas limit and a fee cap far
// above anvil's base fee.
func (s *txSender) sign(t testing.TB, to *common.Address, data []byte, gas uint64) *types.Transaction {
	t.Helper()
	id := new(big.Int).SetUint64(chain.ChainID)
	tx, err := types.SignNewTx(s.key, types.LatestSignerForChainID(id), &types.DynamicFeeTx{
		ChainID: id, Nonce: s.nonce, GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(100e9), Gas: gas, To: to, Data: data,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.nonce++
	return tx
}

// sendAll sends txs in JSON-RPC batches of at most batch, waiting for each batch to be mined (and
// checking every receipt succeeded) before sending the next, so anvil never holds more than one
// batch unconfirmed. It returns the receipts in order.
func sendAll(t testing.TB, txs []*types.Transaction, batch int) []*types.Receipt {
	t.Helper()
	ctx := context.Background()
	var out []*types.Receipt
	for len(txs) > 0 {
		n := min(batch, len(txs))
		part := txs[:n]
		txs = txs[n:]
		elems := make([]rpc.BatchElem, n)
		for i, tx := range part {
			raw, err := tx.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			elems[i] = rpc.BatchElem{Method: "eth_sendRawTransaction", Args: []any{hexutil.Encode(raw)}, Result: new(common.Hash)}
		}
		if err := chain.RPC.BatchCallContext(ctx, elems); err != nil {
			t.Fatalf("sending a batch: %v", err)
		}
		for i, e := range elems {
			if e.Error != nil {
				t.Fatalf("eth_sendRawTransaction %s: %v", part[i].Hash(), e.Error)
			}
		}
		out = append(out, waitMined(t, part)...)
	}
	return out
}

// waitMined waits for the receipts of txs. In auto-mine, transactions that did not fit the last
// block wait for the next arrival, so a block is mined when some are missing and the chain has not
// moved for a while (mining while anvil is still working only adds empty blocks).
func waitMined(t testing.TB, txs []*types.Transaction) []*types.Receipt {
	t.Helper()
	ctx := context.Background()
	rcpts := make([]*types.Receipt, len(txs))
	deadline := time.Now().Add(60 * time.Second)
	lastHead, movedAt := head(t), time.Now()
	for {
		var elems []rpc.BatchElem
		var idx []int
		for i, r := range rcpts {
			if r == nil {
				elems = append(elems, rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{txs[i].Hash()}, Result: &rcpts[i]})
				idx = append(idx, i)
			}
		}
		if len(elems) == 0 {
			break
		}
		if err := chain.RPC.BatchCallContext(ctx, elems); err != nil {
			t.Fatalf("reading receipts: %v", err)
		}
		missing := 0
		for j, e := range elems {
			if e.Error != nil {
				t.Fatalf("receipt of %s: %v", txs[idx[j]].Hash(), e.Error)
			}
			if rcpts[idx[j]] == nil {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d transactions not mined after 60s", missing, len(txs))
		}
		if h := head(t); h != lastHead {
			lastHead, movedAt = h, time.Now()
		} else if time.Since(movedAt) > 250*time.Millisecond {
			if err := chain.Mine(ctx); err != nil {
				t.Fatal(err)
			}
			movedAt = time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, r := range rcpts {
		if r.Status != types.ReceiptStatusSuccessful {
			t.Fatalf("transaction %s reverted (block %d, gas used %d)", txs[i].Hash(), r.BlockNumber, r.GasUsed)
		}
	}
	return rcpts
}

// ---- logs ----

// testLogger sends the indexer's logs to t.Log until stop is called (after the indexer stopped:
// logging into a finished test panics). INDEXER_TEST_LOG=debug shows debug logs too.
func testLogger(t testing.TB) (*slog.Logger, func()) {
	level := slog.LevelInfo
	if os.Getenv("INDEXER_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return stacktest.QuietableLoggerAt(t, level)
}
