package demo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestMerchant drives the merchant against a stand-in facilitator: 402 with the requirements and
// the payment-identifier extension when unpaid, 402 for a payment against other requirements,
// the connection cut (after settling) when told to drop, and 200 with PAYMENT-RESPONSE otherwise.
func TestMerchant(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	var recorded []string // the digests the merchant recorded as delivered
	fac := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.URL.Path]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/delivery") {
			var rec struct{ SHA256 string }
			_ = json.NewDecoder(r.Body).Decode(&rec)
			mu.Lock()
			recorded = append(recorded, rec.SHA256)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(facilitator.DeliveryAnswer{Delivery: facilitator.DeliveryRecord{SHA256: rec.SHA256}})
			return
		}
		switch r.URL.Path {
		case "/verify":
			_, _ = w.Write([]byte(`{"isValid":true,"payer":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}`))
		case "/settle":
			_, _ = w.Write([]byte(`{"success":true,"payer":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","transaction":"0xabc","network":"eip155:31337"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer fac.Close()

	reqs := facilitator.PaymentRequirements{Scheme: "exact", Network: "eip155:31337", Amount: "10000",
		Asset: "0x244ae02008762968261615a485542a9c7512c562", PayTo: "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", MaxTimeoutSeconds: 60}
	var said bytes.Buffer
	m := &merchant{fac: client.New(fac.URL), reqs: reqs, resource: facilitator.ResourceInfo{URL: "http://shop/weather"},
		say: func(format string, args ...any) { mu.Lock(); defer mu.Unlock(); said.WriteString(format + "\n") }}
	shop := httptest.NewServer(m)
	defer shop.Close()
	httpc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	ctx := context.Background()

	res, _, err := get(ctx, httpc, shop.URL, "")
	if err != nil || res.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: %v %v", res, err)
	}
	pr, err := decodePaymentRequired(res.Header.Get(headerPaymentRequired))
	if err != nil {
		t.Fatal(err)
	}
	if len(pr.Accepts) != 1 || !sameRequirements(pr.Accepts[0], reqs) || pr.Resource.URL != "http://shop/weather" {
		t.Errorf("the 402 offers %+v for %+v", pr.Accepts, pr.Resource)
	}
	if _, ok := pr.Extensions[facilitator.PaymentIdentifierKey]; !ok {
		t.Error("the 402 does not advertise the payment-identifier extension")
	}

	header := func(accepted facilitator.PaymentRequirements) string {
		return base64.StdEncoding.EncodeToString(mustJSON(facilitator.PaymentPayload{X402Version: 2, Accepted: accepted, Payload: json.RawMessage(`{}`)}))
	}
	other := reqs
	other.Amount = "1"
	res, body, err := get(ctx, httpc, shop.URL, header(other))
	if err != nil || res.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(body), "no matching payment requirements") {
		t.Fatalf("other requirements: %v %s %v", res, body, err)
	}

	m.dropNext.Store(true)
	if res, _, err = get(ctx, httpc, shop.URL, header(reqs)); err == nil {
		t.Fatalf("dropped: answered %d", res.StatusCode)
	}
	if got := netError(err); got != "the connection closed without a response (EOF)" {
		t.Errorf("dropped: the agent saw %q", got)
	}
	res, body, err = get(ctx, httpc, shop.URL, header(reqs))
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("paid: %v %s %v", res, body, err)
	}
	sr, err := decodePaymentResponse(res.Header.Get(headerPaymentResponse))
	if err != nil || !sr.Success || sr.Transaction != "0xabc" {
		t.Errorf("PAYMENT-RESPONSE: %+v %v", sr, err)
	}
	if got := m.settlements(); len(got) != 2 || got[0] != "0xabc" || got[1] != "0xabc" {
		t.Errorf("settlements the merchant was told: %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["/verify"] != 2 || calls["/settle"] != 2 {
		t.Errorf("facilitator calls: %v (the mismatched payment must reach neither)", calls)
	}
	// Recorded once, for the response served (none for the dropped one), as the agent received it.
	sum := sha256.Sum256(body)
	if len(recorded) != 1 || recorded[0] != hexutil.Encode(sum[:]) || calls["/v1/settlements/"+common.HexToHash("0xabc").Hex()+"/delivery"] != 1 {
		t.Errorf("delivery records %v (calls %v), want one of %s", recorded, calls, hexutil.Encode(sum[:]))
	}
	if !strings.Contains(said.String(), "the response is lost") {
		t.Errorf("the merchant did not say it dropped the response:\n%s", said.String())
	}
}

// TestRunStackFailure: a stack that does not come up ends the story at step 1 with the error and
// where the logs are, and the caller can tell it is the stack's.
func TestRunStackFailure(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), Options{LogPath: "/tmp/x.log", Start: func(context.Context) (*Stack, error) {
		return nil, &StackError{Err: errors.New("no anvil")}
	}}, &out)
	var stackErr *StackError
	if !errors.As(err, &stackErr) {
		t.Fatalf("want a StackError, got %v", err)
	}
	text := out.String()
	for _, want := range []string{" 1. Start the local stack", "!!! the demo failed: starting the local stack: no anvil\n", "(facilitator logs: /tmp/x.log)\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, " 2. ") || strings.Contains(text, "agree") {
		t.Errorf("the story went on after the stack failed:\n%s", text)
	}
}
