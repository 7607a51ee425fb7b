package interop

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// stackOptions shapes one in-process facilitator for a merchant test.
type stackOptions struct {
	// db is the suffix of the test's own fresh database.
	db string
	// settleDeadline is the engine's --settle-timeout (30 s when zero).
	settleDeadline time.Duration
	// around wraps our API inside the request log, so the log holds exactly what the merchant
	// sent and got.
	around func(http.Handler) http.Handler
	// config finishes the API's configuration (API keys, the status routes), given the ledger.
	config func(*api.Config, *postgres.DB)
}

// stack is our whole facilitator (verify, settle, payment ids, the HTTP API) wired as
// cmd/facilitator's Main.Run wires it, over the package's chain and a database
// of its own, behind a log of every request and answer.
type stack struct {
	url      string
	dbURL    string
	db       *postgres.DB
	signer   common.Address
	ids      *paymentid.Service
	networks []facilitator.Network
	log      *callLog
}

func startStack(t *testing.T, ctx context.Context, opts stackOptions) *stack {
	t.Helper()
	dbURL := env.Ledger(t, opts.db)
	logs := &stacktest.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("facilitator log:\n%s", logs.String())
		}
	})
	db, err := postgres.Open(ctx, dbURL, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if opts.settleDeadline == 0 {
		opts.settleDeadline = 30 * time.Second
	}
	// A fresh signer with gas money, so its nonce counts exactly the transactions of this test.
	engine := env.NewEngine(t, stacktest.EngineOptions{DB: db, Deadline: opts.settleDeadline, Logger: log, Config: func(c *settle.Config) {
		c.PollInterval, c.RPCTimeout = 100*time.Millisecond, 5*time.Second
	}})
	calls := &callLog{}
	srv := env.NewServer(t, stacktest.ServerOptions{Engine: engine, PaymentIDs: &paymentid.Config{}, Logger: log,
		Config: func(cfg *api.Config, _ *stacktest.Server) {
			if opts.config != nil {
				opts.config(cfg, db)
			}
		},
		Handler: func(h http.Handler) http.Handler {
			if opts.around != nil {
				h = opts.around(h)
			}
			return calls.wrap(h)
		}})
	return &stack{url: srv.URL, dbURL: dbURL, db: db, signer: stacktest.AddressOf(engine.Signer()), ids: srv.IDs,
		networks: []facilitator.Network{srv.Network}, log: calls}
}

// sent is how many transactions the stack's signer has sent (its pending nonce).
func (s *stack) sent(t *testing.T, ctx context.Context) uint64 {
	t.Helper()
	n, err := chain.Client.PendingNonceAt(ctx, s.signer)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ledgerRow is one settlement of the ledger, as the merchant tests check it.
type ledgerRow struct {
	ID          int64
	State       string
	TxHash      common.Hash
	Value       string
	Version     int
	SuccessSent bool // a caller was answered success: true
	Txs         int  // signed transactions of the settlement (fee bumps included)
}

// ledger lists the settlements for payer.
func (s *stack) ledger(t *testing.T, ctx context.Context, payer common.Address) []ledgerRow {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT s.id, s.state, coalesce(s.tx_hash, ''::bytea), s.value::text, s.x402_version,
		s.success_delivered_at IS NOT NULL, (SELECT count(*) FROM settlement_txs x WHERE x.settlement_id = s.id)
		FROM settlements s WHERE s.payer = $1 ORDER BY s.id`, payer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []ledgerRow
	for rows.Next() {
		var r ledgerRow
		var hash []byte
		var txs int64
		if err := rows.Scan(&r.ID, &r.State, &hash, &r.Value, &r.Version, &r.SuccessSent, &txs); err != nil {
			t.Fatal(err)
		}
		r.TxHash, r.Txs = common.BytesToHash(hash), int(txs)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// call is one request the merchant made to our facilitator, and our answer.
type call struct {
	Method, Path string
	Request      string
	Status       int
	Replay       bool // answered with Payment-Identifier-Replay: true
	Response     string
	Took         time.Duration
}

// callLog records every request to the wrapped handler, with both bodies.
type callLog struct {
	mu    sync.Mutex
	calls []call
}

func (l *callLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rw := &answerRecorder{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		h.ServeHTTP(rw, r)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls = append(l.calls, call{Method: r.Method, Path: r.URL.Path, Request: string(body), Status: rw.status,
			Replay: w.Header().Get(facilitator.ReplayHeader) == "true", Response: strings.TrimSpace(rw.body.String()), Took: time.Since(start)})
	})
}

func (l *callLog) list() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...)
}

// to lists the calls to path.
func (l *callLog) to(path string) []call {
	var out []call
	for _, c := range l.list() {
		if c.Path == path {
			out = append(out, c)
		}
	}
	return out
}

func (l *callLog) String() string {
	var b strings.Builder
	for i, c := range l.list() {
		fmt.Fprintf(&b, "%d. %s %s -> %d replay=%v (%s) %s\n", i+1, c.Method, c.Path, c.Status, c.Replay, c.Took.Round(time.Millisecond), c.Response)
	}
	return b.String()
}

// answerRecorder passes an answer through and keeps its status and body.
type answerRecorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *answerRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *answerRecorder) Write(p []byte) (int, error) {
	r.body.Write(p)
	return r.ResponseWriter.Write(p)
}

func (r *answerRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// settleAnswer is the part of a SettleResponse the merchant tests check.
type settleAnswer struct {
	Success     bool   `json:"success"`
	ErrorReason string `json:"errorReason"`
	Transaction string `json:"transaction"`
	Network     string `json:"network"`
	Payer       string `json:"payer"`
}

func parseSettle(t *testing.T, body string) settleAnswer {
	t.Helper()
	var a settleAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("settle answer %q: %v", body, err)
	}
	return a
}

// nodeServer is a node script serving HTTP (a merchant): it prints one "listening <url>" line once
// it serves, and writes diagnostics to stderr.
type nodeServer struct {
	*process
	name   string
	stderr *stacktest.SyncBuffer
	lines  chan string
}

// startNode runs node with script and args (from interop/, so js/...), env added to ours, and
// stops it at cleanup. It does not wait for anything: see listening and exited.
func startNode(t *testing.T, script string, args []string, env ...string) *nodeServer {
	t.Helper()
	cmd := exec.Command("node", append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stderr := &stacktest.SyncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", script, err)
	}
	s := &nodeServer{process: &process{cmd: cmd, done: make(chan struct{})}, name: script, stderr: stderr,
		lines: make(chan string, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case s.lines <- sc.Text():
			default:
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", script, stderr.String())
		}
	})
	return s
}

// listening waits for the script's listening line and returns its URL.
func (s *nodeServer) listening(t *testing.T, ctx context.Context) string {
	t.Helper()
	select {
	case line := <-s.lines:
		url, ok := strings.CutPrefix(line, "listening ")
		if !ok {
			t.Fatalf("%s said %q; stderr:\n%s", s.name, line, s.stderr.String())
		}
		s.url = url
		return url
	case <-s.done:
		t.Fatalf("%s exited (%s) before listening:\n%s", s.name, s.cmd.ProcessState, s.stderr.String())
	case <-ctx.Done():
		t.Fatalf("%s did not start: %v\n%s", s.name, ctx.Err(), s.stderr.String())
	}
	return ""
}

// exited waits up to d for the script to exit and returns its exit code, or -1 if it still runs.
func (s *nodeServer) exited(d time.Duration) int {
	select {
	case <-s.done:
		return s.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		return -1
	}
}

// runNode runs a node script to completion and decodes the one JSON line it prints into out.
func runNode(t *testing.T, ctx context.Context, out any, script string, args []string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v: %s", script, err, stderr.String())
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%s output %q: %v", script, raw, err)
	}
}

// newPayer makes a fresh key holding usdc atomic units of USDC.
func newPayer(t *testing.T, ctx context.Context, usdc int64) (*ecdsa.PrivateKey, common.Address) {
	t.Helper()
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	addr := crypto.PubkeyToAddress(key.PublicKey)
	if err := chain.USDC.Mint(ctx, addr, big.NewInt(usdc)); err != nil {
		t.Fatal(err)
	}
	return key, addr
}

// transfersFrom counts USDC Transfer events from payer to payTo on the whole chain.
func transfersFrom(t *testing.T, ctx context.Context, payer, payTo common.Address) int {
	t.Helper()
	logs, err := chain.Client.FilterLogs(ctx, ethereum.FilterQuery{
		FromBlock: big.NewInt(0),
		Addresses: []common.Address{chain.USDC.Address},
		Topics:    [][]common.Hash{{eip3009.TransferTopic}, {common.BytesToHash(payer.Bytes())}, {common.BytesToHash(payTo.Bytes())}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(logs)
}

// checkPaidOnce checks the chain after one payment of price from payer to payTo: the balances moved
// by exactly price, one Transfer, and the stack's signer sent exactly one transaction, mined with
// status 1 under txHash.
func checkPaidOnce(t *testing.T, ctx context.Context, s *stack, payer, payTo common.Address, payerBefore, payToBefore *big.Int,
	price int64, txHash string) {
	t.Helper()
	if d := new(big.Int).Sub(payerBefore, lostBalance(t, ctx, payer)); d.Cmp(big.NewInt(price)) != 0 {
		t.Errorf("the payer was charged %s, want exactly %d", d, price)
	}
	if d := new(big.Int).Sub(lostBalance(t, ctx, payTo), payToBefore); d.Cmp(big.NewInt(price)) != 0 {
		t.Errorf("the merchant received %s, want exactly %d", d, price)
	}
	if n := transfersFrom(t, ctx, payer, payTo); n != 1 {
		t.Errorf("%d Transfer events from the payer to the merchant, want 1", n)
	}
	if n := s.sent(t, ctx); n != 1 {
		t.Errorf("the facilitator's signer sent %d transactions, want 1", n)
	}
	receipt, err := chain.Client.TransactionReceipt(ctx, common.HexToHash(txHash))
	if err != nil || receipt.Status != 1 {
		t.Errorf("receipt of %s: %v, %v", txHash, receipt, err)
	}
}

// checkLedgerOnce checks that the ledger holds exactly one settlement for payer: succeeded, of
// price, under txHash, one signed transaction, success told to a caller.
func checkLedgerOnce(t *testing.T, ctx context.Context, s *stack, payer common.Address, price int64, version int, txHash string) {
	t.Helper()
	rows := s.ledger(t, ctx, payer)
	if len(rows) != 1 {
		t.Fatalf("the ledger holds %d settlements for the payer, want 1: %+v", len(rows), rows)
	}
	r := rows[0]
	if r.State != "mined" && r.State != "final" {
		t.Errorf("settlement %d is %s, want mined or final", r.ID, r.State)
	}
	if r.TxHash != common.HexToHash(txHash) {
		t.Errorf("settlement tx %s, PAYMENT-RESPONSE tx %s", r.TxHash.Hex(), txHash)
	}
	if r.Value != fmt.Sprint(price) || r.Version != version || r.Txs != 1 || !r.SuccessSent {
		t.Errorf("settlement %+v: want value %d, x402Version %d, 1 transaction, success delivered", r, price, version)
	}
}
