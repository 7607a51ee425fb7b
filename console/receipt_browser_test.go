package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// testExplorer is the block explorer the receipt test's network names (the dev chain has none).
const testExplorer = "https://explorer.example"

// serveReceipts is the API over the real stack in keys mode with public receipts on and the
// console rendering them, as serve mounts them; the network names a block explorer.
func serveReceipts(t *testing.T) *stacktest.Server {
	t.Helper()
	e := env.NewEngine(t, stacktest.EngineOptions{Depth: finalityDepth})
	n := env.Network()
	n.Explorer = testExplorer
	svc := env.Status(env.DB, finalityDepth)
	con, err := console.New(console.Config{Status: svc, HTTPStatus: api.HTTPStatus, Networks: []facilitator.Network{n}})
	if err != nil {
		t.Fatal(err)
	}
	s := env.NewServer(t, stacktest.ServerOptions{Engine: e, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Console, c.Status, c.Receipts, c.ReceiptPage = con, svc, svc, con
		c.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: env.DB}
	}})
	return s
}

func receiptURL(base string, k facilitator.AuthorizationKey) string {
	return base + console.ReceiptPath(k.Network, k.Asset.Hex(), k.Payer.Hex(), hexutil.Encode(k.Nonce[:]))
}

// In a real Chromium with JavaScript off, keys mode, no key: a settled payment's receipt page says
// settled by this facilitator, with the amount, the payer and payee, the transaction linked to the
// network's block explorer, and loads no script and breaks no CSP rule; it reads on a desktop and
// on a phone (screenshots); printed, it drops its links. An unused nonce's page is a 404 saying the
// chain's word. The same URL answers JSON, the public view the status route gives without a key.
func TestBrowserReceipt(t *testing.T) {
	s := serveReceipts(t)
	key, keyID := merchantKey(t, facilitator.ScopeSettle, facilitator.ScopeStatus)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 250_000)
	tx := settleWith(t, s, key, p)
	page := receiptURL(s.URL, p.Key())

	b := stacktest.Browser(t)
	var (
		mu       sync.Mutex
		problems []string
	)
	cctx, stop := context.WithCancel(b)
	defer stop()
	go func() {
		for m, err := range chromedp.Console(cctx) {
			if err != nil {
				return
			}
			// The unused nonce's page is a 404 by design (and the browser's own favicon request
			// another): a failed load is not a fault of the page.
			if m.IsException() || m.Type == chromedp.ConsoleError && !strings.HasPrefix(m.Text, "Failed to load resource") ||
				strings.Contains(m.Text, "Content Security Policy") {
				mu.Lock()
				problems = append(problems, m.Text)
				mu.Unlock()
			}
		}
	}()
	noScript := chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return err
	})
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900), noScript, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(b, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return strings.TrimSpace(v)
	}
	if got := text("#state"); got != "settled by this facilitator" {
		t.Errorf("state reads %q", got)
	}
	if got := text("#amount"); got != "0.25 USD Coin (250000 base units)" {
		t.Errorf("amount reads %q", got)
	}
	if got := text("#payer"); got != p.From().Hex() {
		t.Errorf("payer reads %q, want %s", got, p.From().Hex())
	}
	if got := text("#payee"); got != p.PayTo.Hex() {
		t.Errorf("payee reads %q", got)
	}
	if got := text("#transaction"); !strings.EqualFold(got, tx) {
		t.Errorf("transaction reads %q, want %s", got, tx)
	}
	// The page is read with JavaScript off, so the DOM is asked through the protocol's own reads.
	href, err := chromedp.Run(b, chromedp.AttributeValue("#explorer", "href"))
	if err != nil || !strings.EqualFold(href.Value, testExplorer+"/tx/"+tx) {
		t.Errorf("the explorer link is %q (%v), want %s/tx/%s", href.Value, err, testExplorer, tx)
	}
	if got := text("#delivery"); !strings.Contains(got, "no delivery") {
		t.Errorf("the delivery section reads %q", got)
	}
	// The merchant records what it served, with the key that settled; the page shows it.
	served := []byte(`{"city":"Lisbon","forecast":"sunny"}`)
	digest := sha256.Sum256(served)
	size := int64(len(served))
	if _, _, _, err := env.DB.AttachDelivery(context.Background(), facilitator.DeliveryAttachment{Tx: common.HexToHash(tx), KeyID: keyID,
		Record: facilitator.DeliveryRecord{SHA256: hexutil.Encode(digest[:]), ContentType: "application/json", Size: &size}}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(b, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	if got := text("#delivery"); !strings.Contains(got, hexutil.Encode(digest[:])) {
		t.Errorf("after the merchant's record, the delivery section reads %q", got)
	}
	shots := stacktest.ArtifactDir(t, "console")
	screenshot(t, b, filepath.Join(shots, "receipt-desktop.png"), true)
	if err := chromedp.Do(b, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	screenshot(t, b, filepath.Join(shots, "receipt-phone.png"), true)

	// Headers and markup, read plainly: the console's CSP, no script at all, no inline style, no
	// payment id or key; and the JSON beside it is the public view.
	res, body := get(t, page)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Security-Policy") != console.CSP || res.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Fatalf("receipt page: %d, CSP %q", res.StatusCode, res.Header.Get("Content-Security-Policy"))
	}
	if strings.Contains(body, "<script") || strings.Contains(body, "style=") || strings.Contains(body, key) {
		t.Fatalf("the receipt page has a script, an inline style or the key:\n%s", body)
	}
	if !strings.Contains(body, `<link rel="stylesheet" href="/console/static/console.css">`) {
		t.Fatalf("the receipt page has no stylesheet:\n%s", body)
	}
	if res, css := get(t, s.URL+"/console/static/console.css"); res.StatusCode != http.StatusOK || !strings.Contains(css, "@media print") {
		t.Fatalf("the stylesheet: %d, or no print rules", res.StatusCode)
	}
	res, body = get(t, page+".json")
	var rc facilitator.Receipt
	if res.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &rc) != nil || rc.View != facilitator.ViewPublic || !strings.EqualFold(rc.Transaction, tx) {
		t.Fatalf("receipt JSON: %d %s", res.StatusCode, body)
	}

	// An unused nonce: 404, the chain's word, in words.
	unknown := env.NewPay(t, env.FundedPayer(t, 1), 1)
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(receiptURL(s.URL, unknown.Key()))); err != nil {
		t.Fatal(err)
	}
	if got := text("#state"); got != "unused" {
		t.Errorf("unused nonce: state %q", got)
	}
	if got := text("#unknown"); !strings.Contains(got, "the chain's own answer") {
		t.Errorf("unused nonce: note %q", got)
	}
	if res, _ := get(t, receiptURL(s.URL, unknown.Key())); res.StatusCode != http.StatusNotFound {
		t.Errorf("unused nonce: HTTP %d, want 404", res.StatusCode)
	}
	// A malformed one: an error page under the API's status.
	res, body = get(t, s.URL+"/r/"+p.Key().Network+"/0x12/0x34/0x56")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Not a receipt") || res.Header.Get("Content-Security-Policy") != console.CSP {
		t.Errorf("malformed receipt URL: %d\n%s", res.StatusCode, body)
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("console errors or CSP violations: %v", problems)
	}
	t.Logf("screenshots in %s", shots)
}
