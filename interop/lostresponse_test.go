package interop

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// lostPrice is what the merchant charges for GET /paid, in USDC atomic units.
const lostPrice = 10000

// TestLostResponseRecovered is the payment-identifier extension end to end, with nothing but the
// official packages around our facilitator: a merchant on @x402/express declaring the extension
// (js/merchant.mjs), a client on @x402/fetch attaching an id (js/agent.mjs). The merchant settles
// the first paid request and its response is dropped before it reaches the client; the client
// sends the same request again with the same id and payload, gets the content, and the payer is
// charged exactly once.
func TestLostResponseRecovered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := startLostFacilitator(t, ctx)

	payerKey, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	payer := crypto.PubkeyToAddress(payerKey.PublicKey)
	if err := chain.USDC.Mint(ctx, payer, big.NewInt(1_000_000)); err != nil { // 1 USDC
		t.Fatal(err)
	}
	payTo := lostRandomAddress(t)
	payerBefore, payToBefore := lostBalance(t, ctx, payer), lostBalance(t, ctx, payTo)

	merchant, merchantLog := startLostMerchant(t, ctx, f.url, payTo)
	defer merchant.stop()

	id := "pay_" + lostRandomHex(t, 16)
	started := time.Now()
	res := runLostAgent(t, ctx, merchant.url+"/paid", id, payerKey)
	elapsed := time.Since(started)
	t.Logf("agent (%s): first attempt %q; retry %d %v; PAYMENT-RESPONSE %v", elapsed.Round(time.Millisecond),
		res.FirstError, res.Status, res.Content, res.PaymentResponse)
	t.Logf("merchant:\n%s", merchantLog.String())
	t.Logf("what the official middleware asked our facilitator:\n%s", f.calls.String())

	// The client: the first attempt was lost, the retry got the content and the receipt.
	if res.FirstError == "" {
		t.Errorf("the first attempt did not fail (status %v): the response was not dropped", res.FirstStatus)
	}
	if res.PaymentID != id {
		t.Errorf("the payload carried payment id %q, want %q", res.PaymentID, id)
	}
	txHash := checkPaidAnswer(t, "the retry", res.Status, res.Content, res.PaymentResponse, payer)

	// The chain: charged exactly once, one transaction sent.
	if d := new(big.Int).Sub(payerBefore, lostBalance(t, ctx, payer)); d.Cmp(big.NewInt(lostPrice)) != 0 {
		t.Errorf("the payer was charged %s, want exactly %d", d, lostPrice)
	}
	if d := new(big.Int).Sub(lostBalance(t, ctx, payTo), payToBefore); d.Cmp(big.NewInt(lostPrice)) != 0 {
		t.Errorf("the merchant received %s, want exactly %d", d, lostPrice)
	}
	sent, err := chain.Client.PendingNonceAt(ctx, f.signer)
	if err != nil {
		t.Fatal(err)
	}
	if sent != 1 {
		t.Errorf("the facilitator's signer sent %d transactions, want 1", sent)
	}
	if receipt, err := chain.Client.TransactionReceipt(ctx, common.HexToHash(txHash)); err != nil || receipt.Status != 1 {
		t.Errorf("receipt of %s: %v, %v", txHash, receipt, err)
	}

	// The ledger: one settlement for the payer, and the id resolves to it.
	rows := f.settlementsOf(t, ctx, payer)
	if len(rows) != 1 {
		t.Fatalf("the ledger holds %d settlements for the payer, want 1: %v", len(rows), rows)
	}
	rec, err := f.db.PaymentID(ctx, "", id)
	if err != nil {
		t.Fatalf("payment id %s: %v", id, err)
	}
	st := rec.Settlement
	if st.ID != rows[0] {
		t.Errorf("the id resolves to settlement %d, want %d", st.ID, rows[0])
	}
	if !st.State.Succeeded() || st.ErrorReason != "" {
		t.Errorf("settlement %d is %s (%s), want mined or final", st.ID, st.State, st.ErrorReason)
	}
	if st.TxHash != common.HexToHash(txHash) {
		t.Errorf("settlement tx %s, PAYMENT-RESPONSE tx %s", st.TxHash.Hex(), txHash)
	}
	if rec.Response == nil {
		t.Error("the id has no stored answer")
	}

	// Our facilitator: the first request verified and settled; the retry's verify and settle were
	// answered as replays of it, and nothing else was asked.
	verifies, settles := f.calls.to("/verify"), f.calls.to("/settle")
	if len(verifies) != 2 || len(settles) != 2 {
		t.Fatalf("the merchant called /verify %d times and /settle %d times, want 2 and 2", len(verifies), len(settles))
	}
	for i, want := range []bool{false, true} {
		for _, c := range []call{verifies[i], settles[i]} {
			if c.Status != http.StatusOK || c.Replay != want {
				t.Errorf("%s #%d: %d replay=%v, want 200 replay=%v (%s)", c.Path, i+1, c.Status, c.Replay, want, c.Response)
			}
		}
	}
	if !strings.Contains(settles[0].Response, `"success":true`) || !strings.Contains(settles[1].Response, `"success":true`) {
		t.Errorf("settle answers: %s / %s", settles[0].Response, settles[1].Response)
	}
	if !strings.Contains(verifies[1].Response, `"isValid":true`) {
		t.Errorf("the retry's verify: %s", verifies[1].Response)
	}
	if _, replays := f.ids.Counts(); replays != 2 {
		t.Errorf("the payment-id service counted %d replays, want 2", replays)
	}
}

// lostFacilitator is the merchant tests' stack with a record of which answers were replays.
type lostFacilitator struct {
	*stack
	calls *callLog
}

func startLostFacilitator(t *testing.T, ctx context.Context) *lostFacilitator {
	t.Helper()
	calls := &callLog{}
	s := startStack(t, ctx, stackOptions{db: "interop_lost", settleDeadline: 30 * time.Second, around: calls.wrap})
	return &lostFacilitator{stack: s, calls: calls}
}

// settlementsOf lists the ledger's settlement ids for payer.
func (f *lostFacilitator) settlementsOf(t *testing.T, ctx context.Context, payer common.Address) []int64 {
	t.Helper()
	conn, err := pgx.Connect(ctx, f.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id FROM settlements WHERE payer = $1 ORDER BY id`, payer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// startLostMerchant runs js/merchant.mjs with the drop on, and waits for its listening line.
func startLostMerchant(t *testing.T, ctx context.Context, facilitatorURL string, payTo common.Address) (*nodeServer, *stacktest.SyncBuffer) {
	t.Helper()
	m := startNode(t, "js/merchant.mjs", []string{"--facilitator", facilitatorURL, "--chain-id", fmt.Sprint(diffChainID),
		"--asset", chain.USDC.Address.Hex(), "--pay-to", payTo.Hex(), "--amount", fmt.Sprint(lostPrice),
		"--token-name", chain.USDC.Name, "--token-version", chain.USDC.Version, "--port", "0"}, "DROP_FIRST_PAID=1")
	m.listening(t, ctx)
	return m, m.stderr
}

// lostAgentResult is js/agent.mjs's summary line.
type lostAgentResult struct {
	FirstError       string         `json:"firstError"`
	FirstStatus      *int           `json:"firstStatus"`
	Status           int            `json:"status"`
	Content          any            `json:"content"`
	PaymentResponse  map[string]any `json:"paymentResponse"`
	PaymentID        string         `json:"paymentId"`
	PaymentSignature string         `json:"paymentSignature"`
}

func runLostAgent(t *testing.T, ctx context.Context, url, id string, key *ecdsa.PrivateKey) lostAgentResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "js/agent.mjs", "--url", url, "--id", id,
		"--asset", chain.USDC.Address.Hex(), "--network", facilitator.CAIP2(diffChainID))
	cmd.Env = append(os.Environ(), "PAYER_KEY="+keyHex(key.D.Bytes()))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("agent.mjs: %v: %s", err, stderr.String())
	}
	var res lostAgentResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("agent.mjs output %q: %v", out, err)
	}
	return res
}

func lostBalance(t *testing.T, ctx context.Context, a common.Address) *big.Int {
	t.Helper()
	b, err := chain.USDC.BalanceOf(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func lostRandomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func lostRandomAddress(t *testing.T) common.Address {
	return common.HexToAddress("0x" + lostRandomHex(t, 20))
}
