package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// The demo tells the story the payment-identifier extension exists for, on the local stack and
// in one process: an agent pays a merchant's endpoint, the paid response is lost on the way back,
// the agent resends the very same payment (same authorization, same payment id), gets its answer
// without paying again, and looks the payment up; at the end the ledger is checked against the chain.

// The x402 v2 HTTP headers, as the official packages name them.
const (
	headerPaymentRequired  = "PAYMENT-REQUIRED"
	headerPaymentSignature = "PAYMENT-SIGNATURE"
	headerPaymentResponse  = "PAYMENT-RESPONSE"
)

// demoPrice is what the merchant's GET /weather costs: 0.01 USDC in atomic units.
const demoPrice = 10_000

// runDemo is `facilitator demo`: flags, the log file, then the story.
func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string of an empty database (DATABASE_URL; 'make demo' makes one)")
	logPath := fs.String("log-file", "", "file the facilitator's and anvil's logs go to (default: a new file in the temporary directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("demo: DATABASE_URL is required (an empty database: 'make demo' makes one)")
	}
	var f *os.File
	var err error
	if *logPath == "" {
		f, err = os.CreateTemp("", "x402-demo-*.log")
	} else {
		f, err = os.Create(*logPath)
	}
	if err != nil {
		return fmt.Errorf("demo: log file: %w", err)
	}
	defer f.Close()
	return runDemoStory(ctx, demoOptions{DatabaseURL: *dbURL, Log: f, LogPath: f.Name()}, stdout)
}

// demoOptions configures runDemoStory.
type demoOptions struct {
	DatabaseURL string    // an empty database (it is bound to the demo's fresh chain)
	Log         io.Writer // the facilitator's and anvil's logs; nil discards them
	LogPath     string    // where Log goes, printed for the reader ("" says nothing)
}

// demoStackError is a failure to bring up the local stack (Postgres, anvil, npm packages), as
// opposed to the story going wrong: the test skips on it outside CI.
type demoStackError struct{ err error }

func (e *demoStackError) Error() string { return "starting the local stack: " + e.err.Error() }
func (e *demoStackError) Unwrap() error { return e.err }

// runDemoStory runs the whole demo, printing it to out, and stops everything it started before
// returning. It returns an error when a step fails or the ledger and the chain disagree.
func runDemoStory(ctx context.Context, opts demoOptions, out io.Writer) error {
	d := &demo{out: &demoPrinter{w: out}, opts: opts}
	if d.opts.Log == nil {
		d.opts.Log = io.Discard
	}
	d.out.printf("x402 demo: an agent pays for GET /weather, the paid response is lost on the way back,\n" +
		"and the agent gets it by resending the same payment, without paying twice.\n")
	err := d.story(ctx)
	d.stop()
	switch {
	case err == nil:
		d.out.printf("\nledger and chain agree\n")
		return nil
	case ctx.Err() != nil:
		d.out.printf("\ninterrupted: stopped everything\n")
		return fmt.Errorf("demo interrupted: %w", ctx.Err())
	default:
		var mismatch *demoMismatch
		if errors.As(err, &mismatch) {
			d.out.printf("\n!!! MISMATCH: the ledger and the chain DISAGREE !!!\n")
			for _, m := range mismatch.problems {
				d.out.printf("!!!   %s\n", m)
			}
		} else {
			d.out.printf("\n!!! the demo failed: %v\n", err)
		}
		if opts.LogPath != "" {
			d.out.printf("    (facilitator logs: %s)\n", opts.LogPath)
		}
		return err
	}
}

// demoMismatch lists what the final comparison found wrong.
type demoMismatch struct{ problems []string }

func (e *demoMismatch) Error() string {
	return "ledger and chain disagree: " + strings.Join(e.problems, "; ")
}

// demo holds what the story started, so that stop can end it whatever step failed.
type demo struct {
	out  *demoPrinter
	opts demoOptions

	chain    *devchain.Chain
	fac      *Main
	facURL   string
	merchant *demoMerchant
	shop     *http.Server
	shopURL  string

	stopOnce sync.Once
}

// stop ends the merchant, the facilitator and anvil, in that order. Safe to call more than once.
func (d *demo) stop() {
	d.stopOnce.Do(func() {
		if d.shop != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = d.shop.Shutdown(ctx)
			cancel()
		}
		if d.fac != nil {
			_ = d.fac.Close()
		}
		if d.chain != nil {
			_ = d.chain.Close()
		}
	})
}

func (d *demo) story(ctx context.Context) error {
	o := d.out
	log := newLogger(d.opts.Log, "info", "text")

	// 1. The local stack, as `facilitator dev` runs it, on free ports.
	o.step(1, "Start the local stack (anvil with Circle's USDC, the facilitator, a merchant)")
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	chain, err := devchain.Start(startCtx, devchain.Options{Logger: log})
	if err != nil {
		return &demoStackError{err}
	}
	d.chain = chain
	d.fac = &Main{Config: devStackConfig(chain, "127.0.0.1:0", d.opts.DatabaseURL, "info",
		[]*ecdsa.PrivateKey{chain.Accounts[0].Key}), Logger: log}
	if err := d.fac.Run(startCtx); err != nil {
		if errors.Is(err, postgres.ErrNetworkMismatch) {
			return fmt.Errorf("this database already holds another chain's ledger; the demo needs an empty one ('make demo' makes one): %w", err)
		}
		return &demoStackError{err}
	}
	d.facURL = "http://" + d.fac.Addr

	network := facilitator.CAIP2(chain.ChainID)
	agent, payTo := chain.Accounts[1], chain.Accounts[2].Address
	reqs := facilitator.PaymentRequirements{
		Scheme: "exact", Network: network, Amount: fmt.Sprint(demoPrice), Asset: chain.USDC.Address.Hex(),
		PayTo: payTo.Hex(), MaxTimeoutSeconds: 60,
		Extra: demoJSON(map[string]string{"name": chain.USDC.Name, "version": chain.USDC.Version}),
	}
	d.merchant = &demoMerchant{fac: client.New(d.facURL), reqs: reqs, say: func(format string, args ...any) {
		o.kv("merchant", fmt.Sprintf(format, args...))
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return &demoStackError{err}
	}
	d.shopURL = "http://" + ln.Addr().String()
	d.merchant.resource = facilitator.ResourceInfo{URL: d.shopURL + "/weather", Description: "Today's weather in Lisbon", MimeType: "application/json"}
	mux := http.NewServeMux()
	mux.Handle("GET /weather", d.merchant)
	d.shop = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.shop.Serve(ln) }()

	o.kv("anvil", fmt.Sprintf("%s   chain id %d (%s)", chain.RPCURL, chain.ChainID, network))
	o.kv("USDC", chain.USDC.Address.Hex())
	o.kv("facilitator", fmt.Sprintf("%s   signer %s (dev account #0)", d.facURL, chain.Accounts[0].Address.Hex()))
	o.kv("merchant", fmt.Sprintf("%s/weather   0.01 USDC to %s (dev account #2)", d.shopURL, payTo.Hex()))
	o.kv("agent", fmt.Sprintf("%s (dev account #1)", agent.Address.Hex()))
	if d.opts.LogPath != "" {
		o.kv("logs", d.opts.LogPath+"   (the facilitator's and anvil's)")
	}

	// 2. Balances before.
	o.step(2, "Balances before")
	agentBefore, payToBefore, err := d.balances(ctx, agent.Address, payTo)
	if err != nil {
		return err
	}
	o.kv("agent", demoUSDC(agentBefore, false))
	o.kv("merchant", demoUSDC(payToBefore, false))

	// 3. The agent asks without paying and is told the price.
	httpc := &http.Client{
		// A fresh connection per request: Go's transport would otherwise resend a GET that failed
		// on a reused connection by itself, and the agent would never see the lost response.
		Transport: &http.Transport{DisableKeepAlives: true},
		Timeout:   2 * time.Minute,
	}
	o.step(3, "Agent: GET /weather without paying")
	res, body, err := demoGet(ctx, httpc, d.shopURL+"/weather", "")
	if err != nil {
		return fmt.Errorf("GET /weather: %w", err)
	}
	if res.StatusCode != http.StatusPaymentRequired {
		return fmt.Errorf("GET /weather without payment: want 402, got %d %s", res.StatusCode, body)
	}
	required, err := demoDecodePaymentRequired(res.Header.Get(headerPaymentRequired))
	if err != nil {
		return err
	}
	var accepted *facilitator.PaymentRequirements
	for i, a := range required.Accepts {
		if a.Scheme == "exact" && a.Network == network {
			accepted = &required.Accepts[i]
			break
		}
	}
	if accepted == nil {
		return fmt.Errorf("the merchant accepts nothing the agent can pay (exact on %s)", network)
	}
	amount, ok := new(big.Int).SetString(accepted.Amount, 10)
	if !ok {
		return fmt.Errorf("the merchant's amount %q is not a number", accepted.Amount)
	}
	_, idAdvertised := required.Extensions[facilitator.PaymentIdentifierKey]
	o.kv("← 402", "Payment Required (PAYMENT-REQUIRED header, x402 v2)")
	o.kv("price", fmt.Sprintf("%s (%s atomic) %s on %s to %s", demoUSDC(amount, false), accepted.Amount, accepted.Scheme, accepted.Network, accepted.PayTo))
	o.kv("extensions", fmt.Sprintf("payment-identifier advertised: %v (optional)", idAdvertised))

	// 4. The agent signs one authorization and picks one payment id for this purchase.
	o.step(4, "Agent signs an EIP-3009 TransferWithAuthorization and picks a payment id")
	var nonce [32]byte
	idBytes := make([]byte, 16)
	if _, err := rand.Read(nonce[:]); err != nil {
		return err
	}
	if _, err := rand.Read(idBytes); err != nil {
		return err
	}
	paymentID := "pay_" + hex.EncodeToString(idBytes)
	now := time.Now().Unix()
	auth := devchain.TransferAuthorization{
		From: agent.Address, To: common.HexToAddress(accepted.PayTo), Value: amount,
		ValidAfter: big.NewInt(now - 600), ValidBefore: big.NewInt(now + accepted.MaxTimeoutSeconds), Nonce: nonce,
	}
	header, err := demoPaymentHeader(chain.USDC, agent.Key, auth, *accepted, required.Resource, paymentID)
	if err != nil {
		return err
	}
	o.kv("from → to", fmt.Sprintf("%s → %s", auth.From.Hex(), auth.To.Hex()))
	o.kv("value", demoUSDC(amount, false))
	o.kv("nonce", hexutil.Encode(nonce[:]))
	o.kv("valid until", time.Unix(auth.ValidBefore.Int64(), 0).UTC().Format(time.RFC3339))
	o.kv("payment id", paymentID+"   (extensions[\"payment-identifier\"].info.id)")

	// 5. The paid request: the merchant verifies, serves, settles, and the answer is lost.
	o.step(5, "Agent: GET /weather with PAYMENT-SIGNATURE (the response will be lost)")
	d.merchant.dropNext.Store(true)
	res, body, err = demoGet(ctx, httpc, d.shopURL+"/weather", header)
	if err == nil {
		return fmt.Errorf("the first paid request was answered (%d %s); the merchant was told to drop it", res.StatusCode, body)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	o.kv("← nothing", fmt.Sprintf("first paid attempt failed: %s", demoNetError(err)))
	o.kv("", "the agent cannot tell whether it paid; it must not sign a second authorization")

	// 6. The retry: the very same header.
	o.step(6, "Agent retries with the SAME PAYMENT-SIGNATURE (same authorization, same payment id)")
	res, body, err = demoGet(ctx, httpc, d.shopURL+"/weather", header)
	if err != nil {
		return fmt.Errorf("the retry failed: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("the retry: want 200, got %d %s", res.StatusCode, body)
	}
	receipt, err := demoDecodePaymentResponse(res.Header.Get(headerPaymentResponse))
	if err != nil {
		return err
	}
	o.kv("← 200", strings.TrimSpace(string(body)))
	replay := facilitator.IsReplay(receipt.Extensions)
	o.kv("PAYMENT-RESPONSE", fmt.Sprintf("success=%v  transaction %s  replay=%v", receipt.Success, receipt.Transaction, replay))
	if !receipt.Success || !replay {
		return fmt.Errorf("the retry's PAYMENT-RESPONSE: want success as a replay, got success=%v replay=%v", receipt.Success, replay)
	}
	o.kv("result", "retry succeeded as a replay: the agent has its weather")

	// 7. The agent looks the payment up.
	o.step(7, "Agent looks the payment up in the facilitator's status API")
	fc := client.New(d.facURL)
	key := facilitator.AuthorizationKey{Network: network, Asset: chain.USDC.Address, Payer: agent.Address, Nonce: nonce}
	byNonce, found, err := fc.Authorization(ctx, key)
	if err != nil {
		return fmt.Errorf("status by nonce: %w", err)
	}
	if !found {
		return fmt.Errorf("status by nonce: the facilitator has never seen the authorization (state %s)", byNonce.State)
	}
	o.kv("by nonce", demoDescribeStatus(byNonce))
	byID, err := fc.Payment(ctx, paymentID)
	if err != nil {
		return fmt.Errorf("status by payment id: %w", err)
	}
	o.kv("by payment id", demoDescribeStatus(byID))

	// 8. Balances after, and the ledger against the chain.
	o.step(8, "Balances after, and the ledger against the chain")
	agentAfter, payToAfter, err := d.balances(ctx, agent.Address, payTo)
	if err != nil {
		return err
	}
	agentDelta, payToDelta := new(big.Int).Sub(agentAfter, agentBefore), new(big.Int).Sub(payToAfter, payToBefore)
	o.kv("agent", fmt.Sprintf("%s → %s   (%s)", demoUSDC(agentBefore, false), demoUSDC(agentAfter, false), demoUSDC(agentDelta, true)))
	o.kv("merchant", fmt.Sprintf("%s → %s   (%s)", demoUSDC(payToBefore, false), demoUSDC(payToAfter, false), demoUSDC(payToDelta, true)))
	transfers, err := d.transfers(ctx, agent.Address, payTo)
	if err != nil {
		return err
	}
	sent, err := chain.Client.NonceAt(ctx, chain.Accounts[0].Address, nil)
	if err != nil {
		return fmt.Errorf("reading the signer's nonce: %w", err)
	}
	used, err := chain.USDC.AuthorizationState(ctx, agent.Address, nonce)
	if err != nil {
		return fmt.Errorf("reading authorizationState: %w", err)
	}
	row, err := d.finalRow(ctx, key)
	if err != nil {
		return fmt.Errorf("reading the ledger row: %w", err)
	}
	rcpt, err := chain.Client.TransactionReceipt(ctx, row.TxHash)
	if err != nil {
		return fmt.Errorf("reading the receipt of %s: %w", row.TxHash.Hex(), err)
	}
	o.kv("transfers", fmt.Sprintf("%d USDC Transfer agent → merchant on chain; the facilitator sent %d transaction(s)", transfers, sent))
	o.kv("", "")
	row3 := func(a, b, c string) { o.printf("      %-16s %-34s %s\n", a, b, c) }
	row3("", "ledger (settlements row)", "chain")
	row3("state", string(row.State), fmt.Sprintf("receipt status %d (%s)", rcpt.Status, map[bool]string{true: "success", false: "reverted"}[rcpt.Status == types.ReceiptStatusSuccessful]))
	row3("transaction", demoShort(row.TxHash.Hex()), demoShort(rcpt.TxHash.Hex()))
	row3("block", fmt.Sprint(row.BlockNumber), fmt.Sprint(rcpt.BlockNumber.Uint64()))
	row3("amount", demoUSDC(row.Value, false)+" to "+demoShort(row.PayTo.Hex()), fmt.Sprintf("%d Transfer of %s", transfers, demoUSDC(payToDelta, false)))
	row3("authorization", "used by "+demoShort(row.TxHash.Hex()), fmt.Sprintf("authorizationState(agent, nonce) = %v", used))

	// The verdict: every view of the payment must say one transfer of the price, by our transaction.
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	price := big.NewInt(demoPrice)
	check(agentDelta.Cmp(new(big.Int).Neg(price)) == 0, "the agent was charged %s, not exactly once (%s)", demoUSDC(new(big.Int).Neg(agentDelta), false), demoUSDC(price, false))
	check(payToDelta.Cmp(price) == 0, "the merchant received %s, not exactly %s", demoUSDC(payToDelta, false), demoUSDC(price, false))
	check(transfers == 1, "%d transfers from the agent to the merchant on chain, want 1", transfers)
	check(sent == 1, "the facilitator sent %d transactions, want 1", sent)
	check(used, "authorizationState(agent, nonce) is false on chain")
	check(row.State.Succeeded(), "the ledger row is %s, want mined or final", row.State)
	check(rcpt.Status == types.ReceiptStatusSuccessful, "the receipt's status is %d, want 1", rcpt.Status)
	check(row.TxHash == rcpt.TxHash, "the ledger's transaction %s is not the receipt's %s", row.TxHash.Hex(), rcpt.TxHash.Hex())
	check(row.BlockNumber == rcpt.BlockNumber.Uint64(), "the ledger says block %d, the chain %d", row.BlockNumber, rcpt.BlockNumber.Uint64())
	check(row.Value != nil && row.Value.Cmp(price) == 0 && row.PayTo == payTo, "the ledger row is for %v to %s", row.Value, row.PayTo.Hex())
	check(strings.EqualFold(receipt.Transaction, row.TxHash.Hex()), "the retry's PAYMENT-RESPONSE names %s, the ledger %s", receipt.Transaction, row.TxHash.Hex())
	for _, s := range d.merchant.settlements() {
		check(strings.EqualFold(s, row.TxHash.Hex()), "the merchant was told transaction %s, the ledger says %s", s, row.TxHash.Hex())
	}
	for name, st := range map[string]*facilitator.AuthorizationStatus{"by nonce": byNonce, "by payment id": byID} {
		check(st.State == facilitator.StatusSettled && st.SettledBy == "facilitator", "the status %s is %s (settled by %q), want settled by the facilitator", name, st.State, st.SettledBy)
		check(strings.EqualFold(st.Transaction, row.TxHash.Hex()), "the status %s names %s, the ledger %s", name, st.Transaction, row.TxHash.Hex())
	}
	if len(problems) > 0 {
		return &demoMismatch{problems: problems}
	}
	o.kv("", "")
	o.kv("charged", fmt.Sprintf("once: %s moved in one transfer, for two paid requests", demoUSDC(price, false)))

	// 9. Everything stops by itself.
	o.step(9, "Stop the merchant, the facilitator and anvil")
	d.stop()
	o.kv("stopped", "all three")
	return nil
}

// finalRow reads the authorization's ledger row, giving the receipt watcher a moment to mark it
// final (one confirmation on a local chain) so that the table shows where it ends up.
func (d *demo) finalRow(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		row, err := d.fac.db.SettlementByKey(ctx, key)
		if err != nil || row.State != facilitator.StateMined || time.Now().After(deadline) {
			return row, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (d *demo) balances(ctx context.Context, a, b common.Address) (*big.Int, *big.Int, error) {
	x, err := d.chain.USDC.BalanceOf(ctx, a)
	if err != nil {
		return nil, nil, fmt.Errorf("reading a balance: %w", err)
	}
	y, err := d.chain.USDC.BalanceOf(ctx, b)
	if err != nil {
		return nil, nil, fmt.Errorf("reading a balance: %w", err)
	}
	return x, y, nil
}

// transfers counts the USDC Transfer logs from one address to another since genesis.
func (d *demo) transfers(ctx context.Context, from, to common.Address) (int, error) {
	logs, err := d.chain.Client.FilterLogs(ctx, ethereum.FilterQuery{
		FromBlock: big.NewInt(0),
		Addresses: []common.Address{d.chain.USDC.Address},
		Topics: [][]common.Hash{
			{crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))},
			{common.BytesToHash(from.Bytes())},
			{common.BytesToHash(to.Bytes())},
		},
	})
	if err != nil {
		return 0, fmt.Errorf("reading Transfer logs: %w", err)
	}
	return len(logs), nil
}

// demoPaymentRequired is the x402 v2 PaymentRequired a 402 carries (base64 JSON in PAYMENT-REQUIRED).
type demoPaymentRequired struct {
	X402Version int                               `json:"x402Version"`
	Error       string                            `json:"error,omitempty"`
	Resource    *facilitator.ResourceInfo         `json:"resource,omitempty"`
	Accepts     []facilitator.PaymentRequirements `json:"accepts"`
	Extensions  map[string]json.RawMessage        `json:"extensions,omitempty"`
}

// demoMerchant is a paid endpoint that does what the official x402 middleware does with a payment:
// verify it with the facilitator, produce the content, settle, and answer with PAYMENT-RESPONSE.
type demoMerchant struct {
	fac      *client.Client
	reqs     facilitator.PaymentRequirements
	resource facilitator.ResourceInfo
	say      func(format string, args ...any)
	// dropNext makes the next paid response vanish after settling: the connection is closed
	// without an answer, as a crashed proxy or a cut network would.
	dropNext atomic.Bool

	mu      sync.Mutex
	settled []string // the transactions settle answered with, in order
}

func (m *demoMerchant) settlements() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.settled...)
}

func (m *demoMerchant) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	header := r.Header.Get(headerPaymentSignature)
	if header == "" {
		m.paymentRequired(w, "PAYMENT-SIGNATURE header is required")
		return
	}
	raw, err := base64.StdEncoding.DecodeString(header)
	var pp facilitator.PaymentPayload
	if err == nil {
		err = json.Unmarshal(raw, &pp)
	}
	if err != nil || pp.X402Version != 2 {
		m.paymentRequired(w, "invalid PAYMENT-SIGNATURE header")
		return
	}
	if !demoSameRequirements(pp.Accepted, m.reqs) {
		m.paymentRequired(w, "no matching payment requirements")
		return
	}
	ctx := r.Context()
	body := demoJSON(facilitator.Request{X402Version: json.RawMessage("2"), PaymentPayload: raw, PaymentRequirements: demoJSON(m.reqs)})
	vr, err := m.fac.Verify(ctx, body)
	if err != nil {
		m.say("verify  → error: %v", err)
		http.Error(w, "the facilitator could not verify the payment", http.StatusBadGateway)
		return
	}
	if !vr.IsValid {
		m.say("verify  → invalid: %s", vr.InvalidReason)
		m.paymentRequired(w, vr.InvalidReason)
		return
	}
	m.say("verify  → valid%s", demoReplayNote(vr.Extensions, "this id's payment is already settled"))

	content := demoJSON(map[string]any{"city": "Lisbon", "forecast": "sunny", "temperatureC": 23})

	sr, err := m.fac.Settle(ctx, body)
	if err != nil {
		m.say("settle  → error: %v", err)
		http.Error(w, "the facilitator could not settle the payment", http.StatusBadGateway)
		return
	}
	if !sr.Success {
		m.say("settle  → failed: %s", sr.ErrorReason)
		m.paymentRequired(w, sr.ErrorReason)
		return
	}
	m.mu.Lock()
	m.settled = append(m.settled, sr.Transaction)
	m.mu.Unlock()
	m.say("settle  → success, transaction %s%s", sr.Transaction, demoReplayNote(sr.Extensions, "the stored answer, nothing broadcast"))

	if m.dropNext.CompareAndSwap(true, false) {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				m.say("the response is lost: the connection closes before any answer")
				_ = conn.Close()
				return
			}
		}
		m.say("could not drop the connection; answering normally")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(headerPaymentResponse, base64.StdEncoding.EncodeToString(demoJSON(sr)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(content, '\n'))
	m.say("answers 200 with the weather and a PAYMENT-RESPONSE header")
}

// paymentRequired answers 402 with the x402 v2 PaymentRequired in its header (and, for people
// with curl, in the body).
func (m *demoMerchant) paymentRequired(w http.ResponseWriter, reason string) {
	resource := m.resource
	pr := demoPaymentRequired{
		X402Version: 2, Error: reason, Resource: &resource, Accepts: []facilitator.PaymentRequirements{m.reqs},
		Extensions: map[string]json.RawMessage{facilitator.PaymentIdentifierKey: json.RawMessage(`{"info":{"required":false}}`)},
	}
	b := demoJSON(pr)
	w.Header().Set(headerPaymentRequired, base64.StdEncoding.EncodeToString(b))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusPaymentRequired)
	_, _ = w.Write(append(b, '\n'))
}

// demoSameRequirements is the middleware's match of the client's accepted option against its own.
func demoSameRequirements(a, b facilitator.PaymentRequirements) bool {
	return a.Scheme == b.Scheme && a.Network == b.Network && a.Amount == b.Amount &&
		strings.EqualFold(a.Asset, b.Asset) && strings.EqualFold(a.PayTo, b.PayTo)
}

// demoReplayNote marks what the facilitator answered as a replay under the payment id.
func demoReplayNote(ext map[string]any, what string) string {
	if facilitator.IsReplay(ext) {
		return "   REPLAY: " + what
	}
	return ""
}

// demoShort abbreviates a hash or an address for the comparison table (full values are printed above).
func demoShort(h string) string {
	if len(h) <= 20 {
		return h
	}
	return h[:10] + "…" + h[len(h)-8:]
}

// demoPaymentHeader signs auth and wraps it as the official client would: a v2 PaymentPayload
// echoing the accepted requirements, with the payment id in the payment-identifier extension,
// base64 JSON for the PAYMENT-SIGNATURE header.
func demoPaymentHeader(usdc *devchain.USDC, key *ecdsa.PrivateKey, auth devchain.TransferAuthorization,
	accepted facilitator.PaymentRequirements, resource *facilitator.ResourceInfo, paymentID string) (string, error) {
	sig, err := usdc.SignTransferAuthorization(key, auth)
	if err != nil {
		return "", err
	}
	payload := demoJSON(facilitator.ExactEVMPayload{
		Signature: hexutil.Encode(sig),
		Authorization: &facilitator.ExactEVMAuthorization{
			From: auth.From.Hex(), To: auth.To.Hex(), Value: auth.Value.String(),
			ValidAfter: auth.ValidAfter.String(), ValidBefore: auth.ValidBefore.String(), Nonce: hexutil.Encode(auth.Nonce[:]),
		},
	})
	pp := facilitator.PaymentPayload{
		X402Version: 2, Resource: resource, Accepted: accepted, Payload: payload,
		Extensions: map[string]json.RawMessage{
			facilitator.PaymentIdentifierKey: demoJSON(map[string]any{"info": map[string]any{"required": false, "id": paymentID}}),
		},
	}
	return base64.StdEncoding.EncodeToString(demoJSON(pp)), nil
}

func demoDecodePaymentRequired(h string) (*demoPaymentRequired, error) {
	raw, err := base64.StdEncoding.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("the 402's %s header is not base64: %w", headerPaymentRequired, err)
	}
	var pr demoPaymentRequired
	if err := json.Unmarshal(raw, &pr); err != nil {
		return nil, fmt.Errorf("the 402's %s header: %w", headerPaymentRequired, err)
	}
	if pr.X402Version != 2 || len(pr.Accepts) == 0 {
		return nil, fmt.Errorf("the 402's %s header is not an x402 v2 PaymentRequired: %s", headerPaymentRequired, raw)
	}
	return &pr, nil
}

func demoDecodePaymentResponse(h string) (*facilitator.SettleResponse, error) {
	if h == "" {
		return nil, fmt.Errorf("the 200 has no %s header", headerPaymentResponse)
	}
	raw, err := base64.StdEncoding.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("the %s header is not base64: %w", headerPaymentResponse, err)
	}
	var sr facilitator.SettleResponse
	if err := json.Unmarshal(raw, &sr); err != nil {
		return nil, fmt.Errorf("the %s header: %w", headerPaymentResponse, err)
	}
	return &sr, nil
}

// demoGet sends GET url, with a PAYMENT-SIGNATURE header when one is given, and reads the answer.
func demoGet(ctx context.Context, c *http.Client, url, payment string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	if payment != "" {
		req.Header.Set(headerPaymentSignature, payment)
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res, body, err
}

// demoNetError says what the agent saw when the connection closed, without the URL around it.
func demoNetError(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed without a response (EOF)"
	default:
		return err.Error()
	}
}

func demoDescribeStatus(st *facilitator.AuthorizationStatus) string {
	s := st.State
	if st.SettledBy != "" {
		s += " by the " + st.SettledBy
	}
	if st.Transaction != "" {
		s += ", transaction " + st.Transaction
	}
	if st.BlockNumber != 0 {
		s += fmt.Sprintf(", block %d", st.BlockNumber)
	}
	if st.Final {
		s += ", final"
	}
	if st.PaymentID != "" {
		s += ", payment id " + st.PaymentID
	}
	return s + " (basis: " + st.Basis + ")"
}

// demoUSDC writes atomic units (6 decimals) as "1,000,000.00 USDC"; signed adds a + to positives.
func demoUSDC(atomic *big.Int, signed bool) string {
	sign := ""
	switch {
	case atomic.Sign() < 0:
		sign = "-"
	case signed && atomic.Sign() > 0:
		sign = "+"
	}
	whole, frac := new(big.Int).QuoRem(new(big.Int).Abs(atomic), big.NewInt(1_000_000), new(big.Int))
	w := whole.String()
	for i := len(w) - 3; i > 0; i -= 3 {
		w = w[:i] + "," + w[i:]
	}
	f := strings.TrimRight(fmt.Sprintf("%06d", frac.Int64()), "0")
	for len(f) < 2 {
		f += "0"
	}
	return sign + w + "." + f + " USDC"
}

func demoJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain types are marshalled
	}
	return b
}

// demoPrinter writes the story; the merchant prints from its handler's goroutine.
type demoPrinter struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *demoPrinter) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (p *demoPrinter) step(n int, title string) { p.printf("\n%2d. %s\n", n, title) }

func (p *demoPrinter) kv(label, value string) {
	if label == "" && value == "" {
		p.printf("\n")
		return
	}
	p.printf("      %-16s %s\n", label, value)
}
