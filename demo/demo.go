// Package demo tells the story the payment-identifier extension exists for, on a local stack it
// is handed: an agent pays a merchant's endpoint, the paid response is lost on the way back, the
// agent resends the very same payment (same authorization, same payment id), gets its answer
// without paying again, and reads its own receipt without an API key (the merchant, with its key,
// finds the same receipt from its payment id); at the end the ledger is checked against the
// chain. The merchant, the agent and the printer of what happens live here; how the stack is
// built is the caller's (the binary's `demo` command builds the real one).
package demo

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/ledgercheck"
)

// weatherPrice is what the merchant's GET /weather costs: 0.01 USDC in atomic units.
const weatherPrice = 10_000

// Stack is the running local stack the story is told on.
type Stack struct {
	// Chain is anvil with Circle's USDC. The facilitator signs with dev account #0 alone; the
	// story pays from #1 to #2.
	Chain *devchain.Chain
	// FacilitatorURL is the facilitator's base URL.
	FacilitatorURL string
	// MerchantKey is the merchant's API key when the facilitator serves under --auth keys (verify,
	// settle and status scopes); "" when it serves open. The agent never has one.
	MerchantKey string
	// Ledger is the facilitator's own ledger, read for the final comparison with the chain.
	Ledger Ledger
	// Close stops the facilitator and the chain.
	Close func() error
}

// Ledger is the one read of the facilitator's ledger the demo makes.
type Ledger interface {
	SettlementByKey(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error)
}

// StartFunc brings up a fresh stack, within ctx's bound. On failure it stops whatever it started.
// A failure of the stack itself (Postgres, anvil, npm packages) should be a *StackError, so that
// callers can tell it from a database the demo cannot use.
type StartFunc func(ctx context.Context) (*Stack, error)

// Options configures Run.
type Options struct {
	Start   StartFunc
	LogPath string // where the stack's logs go, printed for the reader ("" says nothing)
}

// StackError is a failure to bring up the local stack (Postgres, anvil, npm packages, a port), as
// opposed to the story going wrong: a test skips on it outside CI.
type StackError struct{ Err error }

func (e *StackError) Error() string { return "starting the local stack: " + e.Err.Error() }
func (e *StackError) Unwrap() error { return e.Err }

// MismatchError lists what the final comparison of the ledger and the chain found wrong.
type MismatchError struct{ Problems []string }

func (e *MismatchError) Error() string {
	return "ledger and chain disagree: " + strings.Join(e.Problems, "; ")
}

// Run runs the whole demo, printing it to out, and stops everything it started before
// returning. It returns an error when a step fails or the ledger and the chain disagree.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	d := &run{out: &printer{w: out}, opts: opts}
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
		var mismatch *MismatchError
		if errors.As(err, &mismatch) {
			d.out.printf("\n!!! MISMATCH: the ledger and the chain DISAGREE !!!\n")
			for _, m := range mismatch.Problems {
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

// run holds what the story started, so that stop can end it whatever step failed.
type run struct {
	out  *printer
	opts Options

	stack    *Stack
	merchant *merchant
	shop     *http.Server
	shopURL  string

	stopOnce sync.Once
}

// stop ends the merchant, then the stack (the facilitator and anvil). Safe to call more than once.
func (d *run) stop() {
	d.stopOnce.Do(func() {
		if d.shop != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = d.shop.Shutdown(ctx)
			cancel()
		}
		if d.stack != nil {
			_ = d.stack.Close()
		}
	})
}

func (d *run) story(ctx context.Context) error {
	o := d.out

	// 1. The local stack, as `facilitator-dev dev` runs it, on free ports.
	o.step(1, "Start the local stack (anvil with Circle's USDC, the facilitator, a merchant)")
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stack, err := d.opts.Start(startCtx)
	if err != nil {
		return err
	}
	d.stack = stack
	chain := stack.Chain

	network := facilitator.CAIP2(chain.ChainID)
	agent, payTo := chain.Accounts[1], chain.Accounts[2].Address
	reqs := facilitator.PaymentRequirements{
		Scheme: "exact", Network: network, Amount: fmt.Sprint(weatherPrice), Asset: chain.USDC.Address.Hex(),
		PayTo: payTo.Hex(), MaxTimeoutSeconds: 60,
		Extra: mustJSON(map[string]string{"name": chain.USDC.Name, "version": chain.USDC.Version}),
	}
	d.merchant = &merchant{fac: merchantClient(stack), reqs: reqs, say: func(format string, args ...any) {
		o.kv("merchant", fmt.Sprintf(format, args...))
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return &StackError{err}
	}
	d.shopURL = "http://" + ln.Addr().String()
	d.merchant.resource = facilitator.ResourceInfo{URL: d.shopURL + "/weather", Description: "Today's weather in Lisbon", MimeType: "application/json"}
	mux := http.NewServeMux()
	mux.Handle("GET /weather", d.merchant)
	d.shop = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.shop.Serve(ln) }()

	o.kv("anvil", fmt.Sprintf("%s   chain id %d (%s)", chain.RPCURL, chain.ChainID, network))
	o.kv("USDC", chain.USDC.Address.Hex())
	o.kv("facilitator", fmt.Sprintf("%s   signer %s (dev account #0)", stack.FacilitatorURL, chain.Accounts[0].Address.Hex()))
	if stack.MerchantKey != "" {
		o.kv("", "--auth keys: the merchant holds an API key, the agent none")
	}
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
	o.kv("agent", usdc(agentBefore, false))
	o.kv("merchant", usdc(payToBefore, false))

	// 3. The agent asks without paying and is told the price.
	httpc := &http.Client{
		// A fresh connection per request: Go's transport would otherwise resend a GET that failed
		// on a reused connection by itself, and the agent would never see the lost response.
		Transport: &http.Transport{DisableKeepAlives: true},
		Timeout:   2 * time.Minute,
	}
	o.step(3, "Agent: GET /weather without paying")
	res, body, err := get(ctx, httpc, d.shopURL+"/weather", "")
	if err != nil {
		return fmt.Errorf("GET /weather: %w", err)
	}
	if res.StatusCode != http.StatusPaymentRequired {
		return fmt.Errorf("GET /weather without payment: want 402, got %d %s", res.StatusCode, body)
	}
	required, err := decodePaymentRequired(res.Header.Get(headerPaymentRequired))
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
	o.kv("price", fmt.Sprintf("%s (%s atomic) %s on %s to %s", usdc(amount, false), accepted.Amount, accepted.Scheme, accepted.Network, accepted.PayTo))
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
	header, err := paymentHeader(chain.USDC, agent.Key, auth, *accepted, required.Resource, paymentID)
	if err != nil {
		return err
	}
	o.kv("from → to", fmt.Sprintf("%s → %s", auth.From.Hex(), auth.To.Hex()))
	o.kv("value", usdc(amount, false))
	o.kv("nonce", hexutil.Encode(nonce[:]))
	o.kv("valid until", time.Unix(auth.ValidBefore.Int64(), 0).UTC().Format(time.RFC3339))
	o.kv("payment id", paymentID+"   (extensions[\"payment-identifier\"].info.id)")

	// 5. The paid request: the merchant verifies, serves, settles, and the answer is lost.
	o.step(5, "Agent: GET /weather with PAYMENT-SIGNATURE (the response will be lost)")
	d.merchant.dropNext.Store(true)
	res, body, err = get(ctx, httpc, d.shopURL+"/weather", header)
	if err == nil {
		return fmt.Errorf("the first paid request was answered (%d %s); the merchant was told to drop it", res.StatusCode, body)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	o.kv("← nothing", fmt.Sprintf("first paid attempt failed: %s", netError(err)))
	o.kv("", "the agent cannot tell whether it paid; it must not sign a second authorization")

	// 6. The retry: the very same header.
	o.step(6, "Agent retries with the SAME PAYMENT-SIGNATURE (same authorization, same payment id)")
	res, body, err = get(ctx, httpc, d.shopURL+"/weather", header)
	if err != nil {
		return fmt.Errorf("the retry failed: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("the retry: want 200, got %d %s", res.StatusCode, body)
	}
	receipt, err := decodePaymentResponse(res.Header.Get(headerPaymentResponse))
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

	// 7. The agent reads its own receipt: no API key, only its authorization's key, which it
	// signed; the merchant finds the same receipt from the payment id, with its key.
	o.step(7, "Agent looks the payment up in the facilitator's status API, with no API key")
	fc := client.New(stack.FacilitatorURL)
	key := facilitator.AuthorizationKey{Network: network, Asset: chain.USDC.Address, Payer: agent.Address, Nonce: nonce}
	byNonce, found, err := fc.Authorization(ctx, key)
	if err != nil {
		return fmt.Errorf("status by nonce: %w", err)
	}
	if !found {
		return fmt.Errorf("status by nonce: the facilitator has never seen the authorization (state %s)", byNonce.State)
	}
	view := "full view: the facilitator serves open"
	if byNonce.View == facilitator.ViewPublic {
		view = "public view: no payment id, no key, no webhook"
	}
	o.kv("by nonce", describeStatus(byNonce))
	o.kv("", view)
	o.kv("receipt", stack.FacilitatorURL+"/r/"+url.PathEscape(network)+"/"+key.Asset.Hex()+"/"+key.Payer.Hex()+"/"+hexutil.Encode(nonce[:])+"   (a page to keep; .json for JSON)")
	byID, err := merchantClient(stack).Payment(ctx, paymentID)
	if err != nil {
		return fmt.Errorf("status by payment id: %w", err)
	}
	o.kv("by payment id", describeStatus(byID)+"   (the merchant, with its key)")
	// What the merchant recorded it served, against what the agent received: the agent can prove
	// which answer it paid for.
	received := sha256.Sum256(body)
	if d := byNonce.Delivery; d == nil || d.SHA256 != hexutil.Encode(received[:]) {
		return fmt.Errorf("the merchant's delivery record %+v is not the SHA-256 of the %d bytes the agent received (%s)", d, len(body), hexutil.Encode(received[:]))
	}
	o.kv("delivered", fmt.Sprintf("sha256 %s, recorded by the merchant = the hash of the %d bytes received", short(byNonce.Delivery.SHA256), len(body)))

	// 8. Balances after, and the ledger against the chain.
	o.step(8, "Balances after, and the ledger against the chain")
	agentAfter, payToAfter, err := d.balances(ctx, agent.Address, payTo)
	if err != nil {
		return err
	}
	agentDelta, payToDelta := new(big.Int).Sub(agentAfter, agentBefore), new(big.Int).Sub(payToAfter, payToBefore)
	o.kv("agent", fmt.Sprintf("%s → %s   (%s)", usdc(agentBefore, false), usdc(agentAfter, false), usdc(agentDelta, true)))
	o.kv("merchant", fmt.Sprintf("%s → %s   (%s)", usdc(payToBefore, false), usdc(payToAfter, false), usdc(payToDelta, true)))
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
	row3("transaction", short(row.TxHash.Hex()), short(rcpt.TxHash.Hex()))
	row3("block", fmt.Sprint(row.BlockNumber), fmt.Sprint(rcpt.BlockNumber.Uint64()))
	row3("amount", usdc(row.Value, false)+" to "+short(row.PayTo.Hex()), fmt.Sprintf("%d Transfer of %s", transfers, usdc(payToDelta, false)))
	row3("authorization", "used by "+short(row.TxHash.Hex()), fmt.Sprintf("authorizationState(agent, nonce) = %v", used))

	// The verdict: every view of the payment must say one transfer of the price, by our transaction.
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	price := big.NewInt(weatherPrice)
	check(agentDelta.Cmp(new(big.Int).Neg(price)) == 0, "the agent was charged %s, not exactly once (%s)", usdc(new(big.Int).Neg(agentDelta), false), usdc(price, false))
	check(payToDelta.Cmp(price) == 0, "the merchant received %s, not exactly %s", usdc(payToDelta, false), usdc(price, false))
	check(transfers == 1, "%d transfers from the agent to the merchant on chain, want 1", transfers)
	check(sent == 1, "the facilitator sent %d transactions, want 1", sent)
	// The row against its receipt and authorizationState: the rule the operations overview applies too.
	if verdict, why := ledgercheck.Check(*row, ledgercheck.Evidence{Receipt: rcpt, Used: used, UsedKnown: true}); verdict != ledgercheck.Agrees {
		problems = append(problems, why...)
	}
	check(row.Value != nil && row.Value.Cmp(price) == 0 && row.PayTo == payTo, "the ledger row is for %v to %s", row.Value, row.PayTo.Hex())
	check(strings.EqualFold(receipt.Transaction, row.TxHash.Hex()), "the retry's PAYMENT-RESPONSE names %s, the ledger %s", receipt.Transaction, row.TxHash.Hex())
	for _, s := range d.merchant.settlements() {
		check(strings.EqualFold(s, row.TxHash.Hex()), "the merchant was told transaction %s, the ledger says %s", s, row.TxHash.Hex())
	}
	if stack.MerchantKey != "" {
		check(byNonce.View == facilitator.ViewPublic && byNonce.PaymentID == "" && len(byNonce.PaymentIDs) == 0,
			"the agent's key-less lookup is not the public view, or shows payment ids: view %q, ids %q %v", byNonce.View, byNonce.PaymentID, byNonce.PaymentIDs)
		check(len(byID.PaymentIDs) == 1 && byID.PaymentIDs[0] == paymentID, "the merchant's view lists payment ids %v, want %s", byID.PaymentIDs, paymentID)
	}
	for name, st := range map[string]*facilitator.AuthorizationStatus{"by nonce": byNonce, "by payment id": byID} {
		check(st.State == facilitator.StatusSettled && st.SettledBy == "facilitator", "the status %s is %s (settled by %q), want settled by the facilitator", name, st.State, st.SettledBy)
		check(strings.EqualFold(st.Transaction, row.TxHash.Hex()), "the status %s names %s, the ledger %s", name, st.Transaction, row.TxHash.Hex())
	}
	if len(problems) > 0 {
		return &MismatchError{Problems: problems}
	}
	o.kv("", "")
	o.kv("charged", fmt.Sprintf("once: %s moved in one transfer, for two paid requests", usdc(price, false)))

	// 9. Everything stops by itself.
	o.step(9, "Stop the merchant, the facilitator and anvil")
	d.stop()
	o.kv("stopped", "all three")
	return nil
}

// finalRow reads the authorization's ledger row, giving the receipt watcher a moment to mark it
// final (one confirmation on a local chain) so that the table shows where it ends up.
func (d *run) finalRow(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		row, err := d.stack.Ledger.SettlementByKey(ctx, key)
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

func (d *run) balances(ctx context.Context, a, b common.Address) (*big.Int, *big.Int, error) {
	x, err := d.stack.Chain.USDC.BalanceOf(ctx, a)
	if err != nil {
		return nil, nil, fmt.Errorf("reading a balance: %w", err)
	}
	y, err := d.stack.Chain.USDC.BalanceOf(ctx, b)
	if err != nil {
		return nil, nil, fmt.Errorf("reading a balance: %w", err)
	}
	return x, y, nil
}

// transfers counts the USDC Transfer logs from one address to another since genesis.
func (d *run) transfers(ctx context.Context, from, to common.Address) (int, error) {
	chain := d.stack.Chain
	logs, err := chain.Client.FilterLogs(ctx, ethereum.FilterQuery{
		FromBlock: big.NewInt(0),
		Addresses: []common.Address{chain.USDC.Address},
		Topics: [][]common.Hash{
			{eip3009.TransferTopic},
			{common.BytesToHash(from.Bytes())},
			{common.BytesToHash(to.Bytes())},
		},
	})
	if err != nil {
		return 0, fmt.Errorf("reading Transfer logs: %w", err)
	}
	return len(logs), nil
}

// merchantClient is the merchant's client of the facilitator: with its key when it has one.
func merchantClient(stack *Stack) *client.Client {
	if stack.MerchantKey == "" {
		return client.New(stack.FacilitatorURL)
	}
	return client.New(stack.FacilitatorURL, client.WithHeader("Authorization", "Bearer "+stack.MerchantKey))
}
