package reconcile_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/devchain/devchaintest"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres/postgrestest"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/status"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// The package's tests share one anvil with real USDC and one database of their own, with one
// network id. They do not run in parallel: several move the chain's clock, mine on demand or
// reorganise it, and the index has one cursor per network.
var (
	chain *devchain.Chain
	dbURL string
	db    *postgres.DB
	pool  *pgxpool.Pool // reads the ledger's and the index's tables directly
)

func TestMain(m *testing.M) {
	devchaintest.Main(m, devchain.Options{}, func(c *devchain.Chain) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u, err := postgrestest.Fresh(ctx, "reconcile")
		if err != nil {
			return 0, err
		}
		chain, dbURL = c, u
		if db, err = postgres.Open(ctx, dbURL, nil); err != nil {
			return 0, err
		}
		defer db.Close()
		if _, err := db.Migrate(ctx); err != nil {
			return 0, err
		}
		if pool, err = pgxpool.New(ctx, dbURL); err != nil {
			return 0, err
		}
		defer pool.Close()
		genesis, err := c.Client.HeaderByNumber(ctx, big.NewInt(0))
		if err != nil {
			return 0, err
		}
		if err := db.BindNetwork(ctx, network().ID, c.ChainID, genesis.Hash()); err != nil {
			return 0, err
		}
		return m.Run(), nil
	})
}

func network() facilitator.Network {
	return facilitator.Network{ID: facilitator.CAIP2(chain.ChainID), ChainID: chain.ChainID,
		Tokens: []facilitator.Token{{Address: chain.USDC.Address, Name: chain.USDC.Name, Version: chain.USDC.Version}}}
}

func reader() *verify.RPCReader {
	return &verify.RPCReader{Client: chain.RPC, Timeout: 5 * time.Second}
}

// later is the jobs' clock: an hour ahead, so every open settlement counts as stale (no engine
// is working on them in these tests: their engines were stopped, the process "died").
func later() time.Time { return time.Now().Add(time.Hour) }

// jobs builds the reconcile jobs over the shared chain and database.
func jobs(t testing.TB, depth uint64, now func() time.Time) *reconcile.Jobs {
	t.Helper()
	log, _ := testLogger(t)
	return reconcile.New(reconcile.Config{
		Store:      db,
		Networks:   []reconcile.Network{{Network: network(), Chain: chain.RPC, Reader: reader(), FinalityDepth: depth}},
		StaleAfter: time.Minute,
		Now:        now,
		Logger:     log,
	})
}

// runSettlements runs the Settlements job once and fails the test on an error.
func runSettlements(t testing.TB, j *reconcile.Jobs) reconcile.Changes {
	t.Helper()
	ch, err := j.Settlements(context.Background())
	if err != nil {
		t.Fatalf("Settlements: %v (changes %+v)", err, ch)
	}
	t.Logf("Settlements: %+v", ch)
	return ch
}

// statusService answers status queries over the shared chain and database.
func statusService(depth uint64) *status.Service {
	return status.New(db, []status.Network{{Network: network(), Reader: reader(), Head: chain.RPC, FinalityDepth: depth}}, nil)
}

// --- the settlement engine, as a process that can die ---

// newSigner is a fresh key holding ETH for gas, so tests never share a nonce stream.
func newSigner(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.SetBalance(context.Background(), addressOf(k), new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))); err != nil {
		t.Fatal(err)
	}
	return k
}

func addressOf(k *ecdsa.PrivateKey) common.Address { return crypto.PubkeyToAddress(k.PublicKey) }

type engineOptions struct {
	signer   *ecdsa.PrivateKey // default: a fresh funded key
	deadline time.Duration     // default: 1 s (for pending answers with mining off)
	depth    uint64            // the engine's finality depth; default 1
}

// engine is a settle engine over the shared chain and ledger; stop it to play a process that died
// with its settlements in flight.
type engine struct {
	*settle.Engine
	signer *ecdsa.PrivateKey
}

func newEngine(t testing.TB, o engineOptions) *engine {
	t.Helper()
	ctx := context.Background()
	if o.signer == nil {
		o.signer = newSigner(t)
	}
	if o.deadline == 0 {
		o.deadline = time.Second
	}
	n := network()
	v, err := verify.New(verify.Config{Networks: []facilitator.Network{n}, Readers: map[string]verify.Reader{n.ID: reader()}})
	if err != nil {
		t.Fatal(err)
	}
	log, _ := testLogger(t)
	e, err := settle.New(settle.Config{
		Networks:     []settle.NetworkConfig{{Network: n, Chain: chain.RPC, Signers: []*ecdsa.PrivateKey{o.signer}, FinalityDepth: max(o.depth, 1)}},
		Store:        db,
		Verifier:     v,
		Deadline:     o.deadline,
		PollInterval: 50 * time.Millisecond,
		Logger:       log.With("component", "engine"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return &engine{Engine: e, signer: o.signer}
}

func (e *engine) settle(t testing.TB, body []byte) settle.Outcome {
	t.Helper()
	p, err := facilitator.DecodeRequest(body)
	if err != nil {
		t.Fatalf("decoding: %v", err)
	}
	out, err := e.Settle(context.Background(), p)
	if err != nil {
		t.Fatalf("settle: %v", err)
	}
	return out
}

// settlePending settles body with mining off and requires the settlement_pending answer; it
// returns the transaction's hash.
func (e *engine) settlePending(t testing.TB, body []byte) common.Hash {
	t.Helper()
	out := e.settle(t, body)
	if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonSettlementPending || out.Response.Transaction == "" {
		t.Fatalf("want settlement_pending with a hash, got %+v", out.Response)
	}
	return common.HexToHash(out.Response.Transaction)
}

// --- payments ---

// pay is a signed payment of value from payer to a fresh payTo.
type pay struct {
	payer       *ecdsa.PrivateKey
	payTo       common.Address
	value       int64
	nonce       [32]byte
	validBefore *big.Int
	id          string // payment-identifier id, "" for none
	sig         []byte
}

func newPay(t testing.TB, payer *ecdsa.PrivateKey, value int64) *pay {
	t.Helper()
	var n [32]byte
	if _, err := rand.Read(n[:]); err != nil {
		t.Fatal(err)
	}
	k, _ := crypto.GenerateKey()
	return &pay{payer: payer, payTo: addressOf(k), value: value, nonce: n, validBefore: big.NewInt(timeBase(t) + 3600)}
}

func (p *pay) from() common.Address { return addressOf(p.payer) }

func (p *pay) key() facilitator.AuthorizationKey {
	return facilitator.AuthorizationKey{Network: network().ID, Asset: chain.USDC.Address, Payer: p.from(), Nonce: p.nonce}
}

func (p *pay) authorization() devchain.TransferAuthorization {
	return devchain.TransferAuthorization{From: p.from(), To: p.payTo, Value: big.NewInt(p.value), ValidAfter: big.NewInt(0),
		ValidBefore: p.validBefore, Nonce: p.nonce}
}

func (p *pay) signature(t testing.TB) []byte {
	t.Helper()
	if p.sig == nil {
		sig, err := chain.USDC.SignTransferAuthorization(p.payer, p.authorization())
		if err != nil {
			t.Fatal(err)
		}
		p.sig = sig
	}
	return p.sig
}

// body is the /settle request for p, as the official client and resource server send it.
func (p *pay) body(t testing.TB) []byte {
	t.Helper()
	a := p.authorization()
	reqs := map[string]any{"scheme": "exact", "network": network().ID, "amount": a.Value.String(),
		"asset": chain.USDC.Address.Hex(), "payTo": p.payTo.Hex(), "maxTimeoutSeconds": 3600,
		"extra": map[string]any{"name": chain.USDC.Name, "version": chain.USDC.Version}}
	payload := map[string]any{
		"x402Version": 2, "accepted": reqs, "resource": map[string]any{"url": "http://merchant.test/paid"},
		"payload": map[string]any{"signature": "0x" + hex.EncodeToString(p.signature(t)), "authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value.String(), "validAfter": "0",
			"validBefore": a.ValidBefore.String(), "nonce": "0x" + hex.EncodeToString(p.nonce[:])}}}
	if p.id != "" {
		payload["extensions"] = map[string]any{facilitator.PaymentIdentifierKey: map[string]any{"info": map[string]any{"id": p.id}}}
	}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentRequirements": reqs, "paymentPayload": payload})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// submitElsewhere submits p's authorization from a dev account, as a third party would, with
// auto-mining on; it returns the transaction's hash.
func (p *pay) submitElsewhere(t testing.TB) common.Hash {
	t.Helper()
	a := p.authorization()
	h, err := chain.USDC.TransferWithAuthorization(context.Background(), chain.Accounts[1], a.From, a.To, a.Value, a.ValidAfter,
		a.ValidBefore, a.Nonce, p.signature(t))
	if err != nil {
		t.Fatalf("third-party transferWithAuthorization: %v", err)
	}
	return h
}

// fundedPayer is a fresh key holding usdc atomic units of USDC (no ETH: payers never pay gas).
func fundedPayer(t testing.TB, usdc int64) *ecdsa.PrivateKey {
	t.Helper()
	k, _ := crypto.GenerateKey()
	if err := chain.USDC.Mint(context.Background(), addressOf(k), big.NewInt(usdc)); err != nil {
		t.Fatal(err)
	}
	return k
}

func randomID(t testing.TB) string {
	t.Helper()
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "pay_" + hex.EncodeToString(b[:])
}

// --- the chain ---

func manualMining(t *testing.T) { devchaintest.ManualMining(t, chain) }

func setAutomine(t testing.TB, on bool) {
	t.Helper()
	if err := chain.RPC.CallContext(context.Background(), nil, "anvil_setAutomine", on); err != nil {
		t.Fatal(err)
	}
}

func mine(t testing.TB) {
	t.Helper()
	if err := chain.Mine(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func dropPool(t testing.TB) {
	t.Helper()
	if err := chain.RPC.CallContext(context.Background(), nil, "anvil_dropAllTransactions"); err != nil {
		t.Fatalf("anvil_dropAllTransactions: %v", err)
	}
	if n, err := devchaintest.PoolSize(context.Background(), chain); err != nil || n != 0 {
		t.Fatalf("pool after dropping all: %d transactions, %v", n, err)
	}
}

type block struct {
	Number hexutil.Uint64 `json:"number"`
	Hash   common.Hash    `json:"hash"`
	Time   hexutil.Uint64 `json:"timestamp"`
}

func blockAt(t testing.TB, tag string) block {
	t.Helper()
	b, ok := blockIf(t, tag)
	if !ok {
		t.Fatalf("eth_getBlockByNumber %s: no such block", tag)
	}
	return b
}

// blockIf is the block at tag, if the chain has one.
func blockIf(t testing.TB, tag string) (block, bool) {
	t.Helper()
	var b *block
	if err := chain.RPC.CallContext(context.Background(), &b, "eth_getBlockByNumber", tag, false); err != nil {
		t.Fatalf("eth_getBlockByNumber %s: %v", tag, err)
	}
	if b == nil {
		return block{}, false
	}
	return *b, true
}

func head(t testing.TB) uint64 { return uint64(blockAt(t, "latest").Number) }

// timeBase is the later of the wall clock and the chain's clock: the verifier checks validBefore
// against the first, the simulation against the second, and some tests move the chain's ahead.
func timeBase(t testing.TB) int64 {
	t.Helper()
	return max(time.Now().Unix(), int64(blockAt(t, "latest").Time))
}

// inPool reports whether the node knows the transaction and has not mined it.
func inPool(t testing.TB, hash common.Hash) bool {
	t.Helper()
	var tx *struct {
		BlockNumber *hexutil.Big `json:"blockNumber"`
	}
	if err := chain.RPC.CallContext(context.Background(), &tx, "eth_getTransactionByHash", hash); err != nil {
		t.Fatalf("eth_getTransactionByHash: %v", err)
	}
	return tx != nil && tx.BlockNumber == nil
}

func receipt(t testing.TB, hash common.Hash) *types.Receipt {
	t.Helper()
	var r *types.Receipt
	if err := chain.RPC.CallContext(context.Background(), &r, "eth_getTransactionReceipt", hash); err != nil {
		t.Fatalf("eth_getTransactionReceipt: %v", err)
	}
	return r
}

func balance(t testing.TB, addr common.Address) int64 {
	t.Helper()
	b, err := chain.USDC.BalanceOf(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return b.Int64()
}

// --- the index ---

// runningIndexer is an indexer for the test's network, running in the background.
type runningIndexer struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
	quiet  func()
}

// startIndexer runs an indexer for the chain's network until the test ends (or stop).
func startIndexer(t testing.TB) *runningIndexer {
	t.Helper()
	log, quiet := testLogger(t)
	ix := indexer.New(indexer.Config{Network: network().ID, Tokens: []common.Address{chain.USDC.Address}, Chain: chain.RPC,
		Store: db, FinalityDepth: 2, PollInterval: 50 * time.Millisecond, Logger: log.With("component", "indexer")})
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningIndexer{cancel: cancel, done: make(chan error, 1), quiet: quiet}
	go func() { r.done <- ix.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("indexer: %v", err)
		}
	})
	return r
}

func (r *runningIndexer) stop() error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(20 * time.Second):
			r.err = errors.New("the indexer did not stop within 20s")
		}
		r.quiet()
	})
	return r.err
}

// waitIndexed waits until the index's cursor is at block n or above and on the canonical chain.
func waitIndexed(t testing.TB, n uint64) {
	t.Helper()
	limit := time.Now().Add(10 * time.Second)
	for {
		cur, ok, err := db.Cursor(context.Background(), network().ID)
		if err != nil {
			t.Fatal(err)
		}
		if ok && cur.Number >= n {
			if b, on := blockIf(t, hexutil.EncodeUint64(cur.Number)); on && b.Hash == cur.Hash {
				return
			}
		}
		if time.Now().After(limit) {
			t.Fatalf("the index did not reach block %d within 10s: cursor %d %s", n, cur.Number, cur.Hash)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// use is the index's record of an authorization's use or cancellation (nil: none).
func use(t testing.TB, k facilitator.AuthorizationKey) *indexer.Use {
	t.Helper()
	u, err := db.AuthorizationUse(context.Background(), k.Network, k.Asset, k.Payer, k.Nonce)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// logID identifies an indexed log.
type logID struct {
	Block     uint64
	BlockHash common.Hash
	Tx        common.Hash
	Index     uint
}

// indexedLogs is everything the index holds for the network, sorted.
func indexedLogs(t testing.TB) []logID {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT block_number, block_hash, tx_hash, log_index FROM transfers WHERE network = $1
		UNION ALL
		SELECT block_number, block_hash, tx_hash, log_index FROM authorization_events WHERE network = $1`, network().ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []logID
	for rows.Next() {
		var n int64
		var bh, tx []byte
		var i int32
		if err := rows.Scan(&n, &bh, &tx, &i); err != nil {
			t.Fatal(err)
		}
		out = append(out, logID{uint64(n), common.BytesToHash(bh), common.BytesToHash(tx), uint(i)})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sortLogs(out)
	return out
}

// chainLogs is what eth_getLogs returns for USDC's three indexed events in blocks 0..to.
func chainLogs(t testing.TB, to uint64) []logID {
	t.Helper()
	var logs []types.Log
	filter := map[string]any{"fromBlock": "0x0", "toBlock": hexutil.EncodeUint64(to), "address": []common.Address{chain.USDC.Address},
		"topics": [][]common.Hash{{indexer.TransferTopic, indexer.AuthorizationUsedTopic, indexer.AuthorizationCanceledTopic}}}
	if err := chain.RPC.CallContext(context.Background(), &logs, "eth_getLogs", filter); err != nil {
		t.Fatal(err)
	}
	out := make([]logID, len(logs))
	for i, l := range logs {
		out[i] = logID{l.BlockNumber, l.BlockHash, l.TxHash, l.Index}
	}
	sortLogs(out)
	return out
}

func sortLogs(l []logID) {
	sort.Slice(l, func(i, j int) bool {
		if l[i].Block != l[j].Block {
			return l[i].Block < l[j].Block
		}
		return l[i].Index < l[j].Index
	})
}

// --- the ledger ---

func row(t testing.TB, k facilitator.AuthorizationKey) *facilitator.Settlement {
	t.Helper()
	s, err := db.SettlementByKey(context.Background(), k)
	if err != nil {
		t.Fatalf("SettlementByKey: %v", err)
	}
	return s
}

// event is one row of settlement_events.
type event struct {
	State, Detail string
}

func events(t testing.TB, id int64) []event {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT state, COALESCE(detail, '') FROM settlement_events
		WHERE settlement_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []event
	for rows.Next() {
		var e event
		if err := rows.Scan(&e.State, &e.Detail); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func states(es []event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.State
	}
	return out
}

// --- logs ---

// testLogger sends logs to t.Log until quiet is called (or the test ends): background goroutines
// may log after their test returned.
func testLogger(t testing.TB) (*slog.Logger, func()) {
	w := &tbWriter{t: t}
	t.Cleanup(w.quiet)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})), w.quiet
}

type tbWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *tbWriter) quiet() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(p[:len(p)-1]))
	}
	return len(p), nil
}
