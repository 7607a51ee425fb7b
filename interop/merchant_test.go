package interop

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// merchantPrice is what every merchant of these tests charges for GET /paid, in USDC atomic units
// (0.01 USDC: under x402-fetch's default cap of 0.10).
const merchantPrice = 10000

// The merchant experience, end to end with nothing but the official packages around our
// facilitator: a merchant on the official middleware, a client on the official fetch wrapper, our
// whole facilitator (verify, settle with its Postgres ledger, payment ids, the HTTP API) in this
// process, anvil running Circle's USDC under chain id 84532 (Base Sepolia, so the v1 packages'
// network name "base-sepolia" works).

// v2Summary is js/agent-v2.mjs's summary line.
type v2Summary struct {
	Status          int            `json:"status"`
	Content         any            `json:"content"`
	PaymentResponse map[string]any `json:"paymentResponse"`
	PaymentPayload  map[string]any `json:"paymentPayload"`
	Requests        int            `json:"requests"`
	BodySHA256      string         `json:"bodySha256"`
}

// startV2Merchant runs js/merchant.mjs (@x402/express 2.27) on eip155:<chainID>, charging
// merchantPrice of our USDC to payTo, without its drop.
func startV2Merchant(t *testing.T, facilitatorURL string, chainID int64, payTo common.Address) *nodeServer {
	t.Helper()
	return startNode(t, "js/merchant.mjs", []string{"--facilitator", facilitatorURL, "--chain-id", fmt.Sprint(chainID),
		"--asset", chain.USDC.Address.Hex(), "--pay-to", payTo.Hex(), "--amount", fmt.Sprint(merchantPrice),
		"--token-name", chain.USDC.Name, "--token-version", chain.USDC.Version, "--port", "0"})
}

// payV2 runs js/agent-v2.mjs (@x402/fetch 2.27) against url, paying with key.
func payV2(t *testing.T, ctx context.Context, url string, key string) v2Summary {
	t.Helper()
	var res v2Summary
	runNode(t, ctx, &res, "js/agent-v2.mjs", []string{"--url", url, "--asset", chain.USDC.Address.Hex(),
		"--network", facilitator.CAIP2(diffChainID)}, "PAYER_KEY="+key)
	return res
}

// checkV2Paid checks what the v2 client got: 200, the content, and a PAYMENT-RESPONSE saying
// success with a transaction hash on our network for payer, for a v2 payload. It returns the hash.
func checkV2Paid(t *testing.T, res v2Summary, payer common.Address) string {
	t.Helper()
	txHash := checkPaidAnswer(t, "the client", res.Status, res.Content, res.PaymentResponse, payer)
	if res.PaymentPayload == nil || res.PaymentPayload["x402Version"] != float64(2) {
		t.Errorf("the client sent %v, want a v2 payload", res.PaymentPayload)
	}
	return txHash
}

// checkPaidAnswer checks what a v2 client (who, in failures) got, its status, content and
// PAYMENT-RESPONSE pr: 200, the content, and success with a transaction hash on our network for
// payer. It returns the hash.
func checkPaidAnswer(t *testing.T, who string, status int, content any, pr map[string]any, payer common.Address) string {
	t.Helper()
	if status != http.StatusOK {
		t.Fatalf("%s got %d %v, want 200", who, status, content)
	}
	if c, _ := content.(map[string]any); c["content"] != "secret" {
		t.Errorf("%s got %v, want the content", who, content)
	}
	if pr == nil {
		t.Fatalf("%s got no PAYMENT-RESPONSE", who)
	}
	txHash, _ := pr["transaction"].(string)
	if pr["success"] != true || len(common.FromHex(txHash)) != 32 || pr["network"] != facilitator.CAIP2(diffChainID) {
		t.Errorf("PAYMENT-RESPONSE %v: want success with a transaction hash on %s", pr, facilitator.CAIP2(diffChainID))
	}
	if fmt.Sprint(pr["payer"]) != payer.Hex() {
		t.Errorf("PAYMENT-RESPONSE payer %v, want %s", pr["payer"], payer.Hex())
	}
	return txHash
}

// TestOfficialV2MerchantAndClient: @x402/express 2.27 merchant, @x402/fetch 2.27 client, our
// facilitator: the content arrives with a successful PAYMENT-RESPONSE, the money moves once, and
// the ledger holds one settlement.
func TestOfficialV2MerchantAndClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startStack(t, ctx, stackOptions{db: "interop_merchant_v2"})
	key, payer := newPayer(t, ctx, 1_000_000)
	payTo := lostRandomAddress(t)
	payerBefore, payToBefore := lostBalance(t, ctx, payer), lostBalance(t, ctx, payTo)

	m := startV2Merchant(t, s.url, diffChainID, payTo)
	url := m.listening(t, ctx) + "/paid"
	started := time.Now()
	res := payV2(t, ctx, url, keyHex(key.D.Bytes()))
	t.Logf("client (%s): %d %v, PAYMENT-RESPONSE %v", time.Since(started).Round(time.Millisecond), res.Status, res.Content, res.PaymentResponse)
	t.Logf("what the official middleware asked our facilitator:\n%s", s.log.String())

	txHash := checkV2Paid(t, res, payer)
	checkPaidOnce(t, ctx, s, payer, payTo, payerBefore, payToBefore, merchantPrice, txHash)
	checkLedgerOnce(t, ctx, s, payer, merchantPrice, 2, txHash)

	verifies, settles := s.log.to("/verify"), s.log.to("/settle")
	if len(verifies) != 1 || len(settles) != 1 {
		t.Fatalf("the merchant called /verify %d times and /settle %d times, want once each", len(verifies), len(settles))
	}
	if verifies[0].Status != http.StatusOK || !strings.Contains(verifies[0].Response, `"isValid":true`) {
		t.Errorf("verify: %d %s", verifies[0].Status, verifies[0].Response)
	}
	if a := parseSettle(t, settles[0].Response); settles[0].Status != http.StatusOK || !a.Success || a.Transaction != txHash {
		t.Errorf("settle: %d %s, want 200 success with %s", settles[0].Status, settles[0].Response, txHash)
	}
	if len(s.log.to("/supported")) == 0 {
		t.Error("the merchant never asked /supported")
	}
}

// v1Summary is js/agent-v1.mjs's summary line.
type v1Summary struct {
	Status          int            `json:"status"`
	Content         any            `json:"content"`
	PaymentResponse map[string]any `json:"paymentResponse"`
	Payment         map[string]any `json:"payment"`
	Requests        int            `json:"requests"`
}

// TestOfficialV1MerchantAndClient: the same with the v1 packages, x402-express 1.2.0 (on the express
// 4 it depends on) and x402-fetch 1.2.0 with a viem wallet client on chain 84532, network
// "base-sepolia", priced in our USDC with its EIP-712 domain read from the chain.
func TestOfficialV1MerchantAndClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startStack(t, ctx, stackOptions{db: "interop_merchant_v1"})
	key, payer := newPayer(t, ctx, 1_000_000)
	payTo := lostRandomAddress(t)
	payerBefore, payToBefore := lostBalance(t, ctx, payer), lostBalance(t, ctx, payTo)

	m := startNode(t, "js/merchant-v1.mjs", []string{"--facilitator", s.url, "--network", "base-sepolia",
		"--asset", chain.USDC.Address.Hex(), "--pay-to", payTo.Hex(), "--amount", fmt.Sprint(merchantPrice),
		"--token-name", chain.USDC.Name, "--token-version", chain.USDC.Version, "--port", "0"})
	url := m.listening(t, ctx) + "/paid"
	started := time.Now()
	var res v1Summary
	runNode(t, ctx, &res, "js/agent-v1.mjs", []string{"--url", url, "--rpc", chain.RPCURL, "--chain-id", fmt.Sprint(diffChainID)},
		"PAYER_KEY="+keyHex(key.D.Bytes()))
	t.Logf("client (%s): %d %v, X-PAYMENT-RESPONSE %v", time.Since(started).Round(time.Millisecond), res.Status, res.Content, res.PaymentResponse)
	t.Logf("what the v1 middleware asked our facilitator:\n%s", s.log.String())

	if res.Status != http.StatusOK {
		t.Fatalf("the client got %d %v, want 200", res.Status, res.Content)
	}
	if c, _ := res.Content.(map[string]any); c["content"] != "secret" {
		t.Errorf("the client got %v, want the content", res.Content)
	}
	if res.Payment["x402Version"] != float64(1) || res.Payment["network"] != "base-sepolia" || res.Payment["scheme"] != "exact" {
		t.Errorf("the client sent %v, want a v1 exact payload on base-sepolia", res.Payment)
	}
	pr := res.PaymentResponse
	if pr == nil {
		t.Fatal("no X-PAYMENT-RESPONSE")
	}
	txHash, _ := pr["transaction"].(string)
	if pr["success"] != true || len(common.FromHex(txHash)) != 32 || pr["network"] != "base-sepolia" {
		t.Errorf("X-PAYMENT-RESPONSE %v: want success with a transaction hash on base-sepolia", pr)
	}
	if fmt.Sprint(pr["payer"]) != payer.Hex() {
		t.Errorf("X-PAYMENT-RESPONSE payer %v, want %s", pr["payer"], payer.Hex())
	}
	checkPaidOnce(t, ctx, s, payer, payTo, payerBefore, payToBefore, merchantPrice, txHash)
	checkLedgerOnce(t, ctx, s, payer, merchantPrice, 1, txHash)

	verifies, settles := s.log.to("/verify"), s.log.to("/settle")
	if len(verifies) != 1 || len(settles) != 1 {
		t.Fatalf("the merchant called /verify %d times and /settle %d times, want once each", len(verifies), len(settles))
	}
	// What the v1 middleware sent: a v1 body, with the requirements built from our explicit price.
	var req struct {
		X402Version  int `json:"x402Version"`
		Requirements struct {
			Network           string            `json:"network"`
			MaxAmountRequired string            `json:"maxAmountRequired"`
			Asset             string            `json:"asset"`
			Extra             map[string]string `json:"extra"`
		} `json:"paymentRequirements"`
	}
	if err := json.Unmarshal([]byte(settles[0].Request), &req); err != nil {
		t.Fatalf("settle request %s: %v", settles[0].Request, err)
	}
	if req.X402Version != 1 || req.Requirements.Network != "base-sepolia" || req.Requirements.MaxAmountRequired != fmt.Sprint(merchantPrice) ||
		!strings.EqualFold(req.Requirements.Asset, chain.USDC.Address.Hex()) ||
		req.Requirements.Extra["name"] != chain.USDC.Name || req.Requirements.Extra["version"] != chain.USDC.Version {
		t.Errorf("the v1 middleware settled %s", settles[0].Request)
	}
	if verifies[0].Status != http.StatusOK || !strings.Contains(verifies[0].Response, `"isValid":true`) {
		t.Errorf("verify: %d %s", verifies[0].Status, verifies[0].Response)
	}
	if a := parseSettle(t, settles[0].Response); settles[0].Status != http.StatusOK || !a.Success || a.Transaction != txHash {
		t.Errorf("settle: %d %s, want 200 success with %s", settles[0].Status, settles[0].Response, txHash)
	}
}

// retryMiner holds the chain still until a /settle has been answered settlement_pending, then mines
// one block when the next /settle arrives, before passing it on: the official resource server's
// single retry then finds the transaction mined.
type retryMiner struct {
	pending atomic.Bool // a /settle answer carried settlement_pending (seen before it was sent)
	mu      sync.Mutex
	mined   int
	err     error
}

func (m *retryMiner) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/settle" {
			h.ServeHTTP(w, r)
			return
		}
		if m.pending.Load() {
			m.mu.Lock()
			if m.mined == 0 {
				ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
				m.err = chain.Mine(ctx)
				cancel()
				m.mined++
			}
			m.mu.Unlock()
		}
		h.ServeHTTP(&pendingSpotter{ResponseWriter: w, seen: &m.pending}, r)
	})
}

// pendingSpotter raises seen as soon as the answer being written says settlement_pending, before
// the bytes go out, so the retry can never overtake it.
type pendingSpotter struct {
	http.ResponseWriter
	seen *atomic.Bool
	body bytes.Buffer
}

func (p *pendingSpotter) Write(b []byte) (int, error) {
	p.body.Write(b)
	if bytes.Contains(p.body.Bytes(), []byte(`"settlement_pending"`)) {
		p.seen.Store(true)
	}
	return p.ResponseWriter.Write(b)
}

func (p *pendingSpotter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// TestOfficialPendingRetry: the official resource server's settlement_pending retry (@x402/core
// settleWithPendingRetry, used by @x402/express 2.27) against our pending answer. Our settle
// deadline is 1 s and the chain mines nothing by itself, so the first /settle answers
// settlement_pending with the hash; the merchant sends the identical request once more, a block is
// mined as it arrives, and the retry answers success with the same hash. The client gets the
// content; one transfer.
func TestOfficialPendingRetry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key, payer := newPayer(t, ctx, 1_000_000) // minted while the chain still mines by itself
	payTo := lostRandomAddress(t)
	payerBefore, payToBefore := lostBalance(t, ctx, payer), lostBalance(t, ctx, payTo)

	stacktest.ManualMining(t, chain) // before the stack, so the stack stops first at cleanup
	miner := &retryMiner{}
	s := startStack(t, ctx, stackOptions{db: "interop_pending_retry", settleDeadline: time.Second, around: miner.wrap})

	m := startV2Merchant(t, s.url, diffChainID, payTo)
	url := m.listening(t, ctx) + "/paid"
	started := time.Now()
	res := payV2(t, ctx, url, keyHex(key.D.Bytes()))
	t.Logf("client (%s): %d %v, PAYMENT-RESPONSE %v", time.Since(started).Round(time.Millisecond), res.Status, res.Content, res.PaymentResponse)
	// A call is logged when its handler returns, which can be just after the merchant has the
	// answer and the client its content: the log is read once it holds the retry (a CI run read it
	// a moment too early), or after a bound.
	settles := s.log.to("/settle")
	for deadline := time.Now().Add(5 * time.Second); len(settles) < 2 && time.Now().Before(deadline); settles = s.log.to("/settle") {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("what the official middleware asked our facilitator:\n%s", s.log.String())
	if len(settles) != 2 {
		t.Fatalf("the merchant called /settle %d times, want 2 (the first pending, one retry)", len(settles))
	}
	if settles[0].Request != settles[1].Request {
		t.Errorf("the retry's body differs from the first:\n%s\n%s", settles[0].Request, settles[1].Request)
	}
	first, second := parseSettle(t, settles[0].Response), parseSettle(t, settles[1].Response)
	if settles[0].Status != http.StatusOK || first.Success || first.ErrorReason != "settlement_pending" ||
		len(common.FromHex(first.Transaction)) != 32 {
		t.Fatalf("first settle: %d %s, want 200 settlement_pending with the hash", settles[0].Status, settles[0].Response)
	}
	if settles[1].Status != http.StatusOK || !second.Success || second.Transaction != first.Transaction {
		t.Errorf("the retry: %d %s, want 200 success with %s", settles[1].Status, settles[1].Response, first.Transaction)
	}
	miner.mu.Lock()
	mined, mineErr := miner.mined, miner.err
	miner.mu.Unlock()
	if mined != 1 || mineErr != nil {
		t.Errorf("mined %d blocks before the retry (%v), want 1", mined, mineErr)
	}
	if n := len(s.log.to("/verify")); n != 1 {
		t.Errorf("the merchant called /verify %d times, want 1", n)
	}

	txHash := checkV2Paid(t, res, payer)
	if txHash != first.Transaction {
		t.Errorf("PAYMENT-RESPONSE tx %s, pending answer tx %s", txHash, first.Transaction)
	}
	checkPaidOnce(t, ctx, s, payer, payTo, payerBefore, payToBefore, merchantPrice, txHash)
	checkLedgerOnce(t, ctx, s, payer, merchantPrice, 2, txHash)
}

// TestOfficialSupportedCheck: our /supported satisfies the official resource server's start-up
// check (initialize(): GET /supported, then every route's (2, scheme, network) must be listed, or
// @x402/express exits with missing_facilitator) for every network we serve; and a merchant whose
// route uses a network we do not serve fails to start, so the check is real.
func TestOfficialSupportedCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startStack(t, ctx, stackOptions{db: "interop_supported"})
	payTo := lostRandomAddress(t)

	for _, n := range s.networks {
		t.Run(n.ID, func(t *testing.T) {
			before := len(s.log.to("/supported"))
			m := startV2Merchant(t, s.url, int64(n.ChainID), payTo)
			base := m.listening(t, ctx)
			// The middleware waits for its initialize() before answering a paid route, so a 402 with
			// our requirements means the check passed.
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/paid", nil)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("GET /paid: %v", err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("GET /paid without payment: %d, want 402", res.StatusCode)
			}
			raw, err := base64.StdEncoding.DecodeString(res.Header.Get("PAYMENT-REQUIRED"))
			if err != nil {
				t.Fatalf("PAYMENT-REQUIRED: %v", err)
			}
			var pr struct {
				Accepts []struct {
					Network string `json:"network"`
				} `json:"accepts"`
			}
			if err := json.Unmarshal(raw, &pr); err != nil || len(pr.Accepts) != 1 || pr.Accepts[0].Network != n.ID {
				t.Fatalf("PAYMENT-REQUIRED %s (%v), want one option on %s", raw, err, n.ID)
			}
			if code := m.exited(500 * time.Millisecond); code != -1 {
				t.Fatalf("the merchant exited (%d) after answering:\n%s", code, m.stderr.String())
			}
			if len(s.log.to("/supported")) <= before {
				t.Error("the merchant never asked our /supported")
			}
		})
	}

	t.Run("negative control: eip155:1", func(t *testing.T) {
		before := len(s.log.to("/supported"))
		m := startV2Merchant(t, s.url, 1, payTo)
		code := m.exited(20 * time.Second)
		if code == -1 {
			t.Fatalf("a merchant on eip155:1 is still running: the start-up check passed for a network we do not serve\n%s", m.stderr.String())
		}
		if code != 1 || !strings.Contains(m.stderr.String(), "missing_facilitator") ||
			!strings.Contains(m.stderr.String(), `on network "eip155:1"`) {
			t.Errorf("the merchant exited %d; want 1 with missing_facilitator for eip155:1:\n%s", code, m.stderr.String())
		}
		if len(s.log.to("/supported")) <= before {
			t.Error("the merchant never asked our /supported: it failed for another reason")
		}
	})
}
