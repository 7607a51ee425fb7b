package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestReceiptPage: the page of a settled Base payment with a delivery record links its transaction
// and block to Basescan (the preset's explorer) and shows the record (digest, type, size, time);
// a network without an explorer links nothing; an expired payment says so with its reason; the
// values are escaped (a content type is the merchant's text). No chain or database: the page only
// renders what the API looked up.
func TestReceiptPage(t *testing.T) {
	base, err := chains.Lookup("base")
	if err != nil {
		t.Fatal(err)
	}
	n := facilitator.Network{ID: base.CAIP2(), ChainID: base.ChainID, Tokens: []facilitator.Token{base.USDC}, Explorer: base.Explorer}
	con, err := console.New(console.Config{Status: noStatus{}, HTTPStatus: api.HTTPStatus, Networks: []facilitator.Network{n}})
	if err != nil {
		t.Fatal(err)
	}
	size := int64(1234)
	tx := "0x" + strings.Repeat("ab", 32)
	rc := facilitator.Receipt{View: facilitator.ViewPublic, State: facilitator.StatusSettled, SettledBy: "facilitator", Network: n.ID,
		Asset: base.USDC.Address.Hex(), Authorizer: common.HexToAddress("0x70997970C51812dc3A010C7d01b50e0d17dc79C8").Hex(),
		Nonce: "0x" + strings.Repeat("11", 32), Transaction: tx, BlockNumber: 123, Confirmations: 700, Final: true,
		Finality: facilitator.StatusFinality{Rule: "tag:finalized", FinalBlock: 200}, To: common.HexToAddress("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC").Hex(),
		Value: "10000", ValidBefore: "4102444800", Basis: "ledger", Head: 822,
		Delivery: &facilitator.DeliveryRecord{SHA256: "0x" + strings.Repeat("5e", 32), ContentType: `text/html"><script>`, Size: &size,
			RecordedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}
	rec := httptest.NewRecorder()
	con.ServeReceipt(rec, httptest.NewRequest(http.MethodGet, "/r/x", nil), rc, true)
	body := rec.Body.String()
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Security-Policy") != console.CSP {
		t.Fatalf("receipt page: %d, CSP %q", rec.Code, rec.Header().Get("Content-Security-Policy"))
	}
	for _, want := range []string{
		`href="https://basescan.org/tx/` + tx + `"`, `href="https://basescan.org/block/123"`, "View the transaction on basescan.org",
		"0.01 USD Coin", "settled by this facilitator", "2100-01-01 00:00:00 UTC", "final up to block 200",
		"0x" + strings.Repeat("5e", 32), "1234 bytes", "2026-01-02 03:04:05.000 UTC", "text/html&#34;&gt;&lt;script&gt;",
		`href="/r/eip155:8453/` + rc.Asset + `/` + rc.Authorizer + `/` + rc.Nonce + `.json"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script") {
		t.Errorf("the page has a script (or an unescaped value):\n%s", body)
	}

	// No explorer on the network: the transaction is text; an expired payment says why.
	n.Explorer = ""
	con, _ = console.New(console.Config{Status: noStatus{}, HTTPStatus: api.HTTPStatus, Networks: []facilitator.Network{n}})
	rc.State, rc.SettledBy, rc.Reason, rc.BlockNumber, rc.Final, rc.Delivery = facilitator.StatusExpired, "", facilitator.ReasonValidBefore, 0, false, nil
	rec = httptest.NewRecorder()
	con.ServeReceipt(rec, httptest.NewRequest(http.MethodGet, "/r/x", nil), rc, true)
	body = rec.Body.String()
	if strings.Contains(body, "basescan") || strings.Contains(body, `id="explorer"`) || !strings.Contains(body, facilitator.ReasonValidBefore) ||
		!strings.Contains(body, "not on chain") || !strings.Contains(body, "recorded no delivery") {
		t.Errorf("an expired payment on a network without an explorer:\n%s", body)
	}
}

// noStatus is a status service the receipt page never asks: the API looks receipts up.
type noStatus struct{}

func (noStatus) Authorization(context.Context, facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	return facilitator.AuthorizationStatus{}, false, facilitator.ErrNotFound
}

func (noStatus) Payment(context.Context, string, string) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
}

func (noStatus) Settlement(context.Context, common.Hash) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
}

func (noStatus) Timeline(context.Context, facilitator.AuthorizationKey) ([]facilitator.SettlementEvent, error) {
	return nil, nil
}
