package console_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// finalityDepth is deep enough that a settled payment's confirmations count up for a while
// before it is final.
const finalityDepth = 50

// serve is the facilitator's HTTP API over the real stack (anvil's USDC, Postgres, the settlement
// engine) with the console mounted as the binary mounts it.
func serve(t *testing.T, svc console.Status) (*stacktest.Server, *stacktest.Engine) {
	t.Helper()
	e := env.NewEngine(t, stacktest.EngineOptions{Depth: finalityDepth})
	con, err := console.New(console.Config{Status: svc, HTTPStatus: api.HTTPStatus, Poll: 100 * time.Millisecond,
		Networks: []facilitator.Network{env.Network()}, PaymentIDs: env.DB})
	if err != nil {
		t.Fatal(err)
	}
	s := env.NewServer(t, stacktest.ServerOptions{Engine: e, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Console = con
	}})
	return s, e
}

func authorizationURL(base string, k facilitator.AuthorizationKey) string {
	return base + "/console/authorizations/" + k.Network + "/" + k.Asset.Hex() + "/" + k.Payer.Hex() + "/" + hexutil.Encode(k.Nonce[:])
}

// In a real Chromium: a settled payment's page says settled with its transaction, and its
// confirmations count up as blocks are mined, without a reload; an unknown nonce says so.
func TestBrowserLookup(t *testing.T) {
	svc := env.Status(env.DB, finalityDepth)
	s, e := serve(t, svc)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 250_000)
	out := e.MustSettle(t, p.Body(t))
	tx := out.Response.Transaction
	page := authorizationURL(s.URL, p.Key())

	b := stacktest.Browser(t)
	var state, txText, confText, amount string
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	run := func(a chromedp.Action[string], into *string) {
		t.Helper()
		v, err := chromedp.Run(b, a)
		if err != nil {
			t.Fatal(err)
		}
		*into = strings.TrimSpace(v)
	}
	run(chromedp.Text("#state"), &state)
	run(chromedp.Text("#transaction"), &txText)
	run(chromedp.Text("#confirmations"), &confText)
	run(chromedp.Text("#amount"), &amount)
	// 250,000 base units of a 6-decimals token.
	if amount != "0.25 USD Coin (250000 base units)" {
		t.Errorf("the amount reads %q", amount)
	}
	if !strings.HasPrefix(state, "settled") || !strings.EqualFold(txText, tx) {
		t.Fatalf("page shows state %q, transaction %q; want settled with %s", state, txText, tx)
	}
	before, err := strconv.Atoi(confText)
	if err != nil || before < 1 {
		t.Fatalf("confirmations %q, want a number of at least 1", confText)
	}
	// The live stream is open once the page says so; a marker on the window proves the page is
	// not reloaded while the numbers change.
	if _, err := chromedp.Run(b, chromedp.Poll[bool](`document.getElementById("live").classList.contains("on")`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		dbg, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.getElementById("answer").dataset.events + " " + typeof EventSource + " " + document.scripts.length`))
		t.Fatalf("the live stream never opened (%s): %v", dbg, err)
	}
	if _, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.stillThisPage = true`)); err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	env.Mine(t)
	env.Mine(t)
	want := strconv.Itoa(before + 3)
	if _, err := chromedp.Run(b, chromedp.Poll[bool](`document.getElementById("confirmations").textContent === "`+want+`"`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		run(chromedp.Text("#confirmations"), &confText)
		t.Fatalf("confirmations show %q after 3 blocks, want %s: %v", confText, want, err)
	}
	if same, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.stillThisPage === true`)); err != nil || !same {
		t.Fatalf("the page reloaded to show new confirmations (%v)", err)
	}
	var final string
	run(chromedp.Text("#final"), &final)
	if final != "not final yet" {
		t.Fatalf("final shows %q at %s confirmations of %d", final, want, finalityDepth)
	}
	shots := stacktest.ArtifactDir(t, "console")
	screenshot(t, b, filepath.Join(shots, "lookup-desktop.png"), true)

	// Deep enough, the same page says final, still without a reload.
	for range finalityDepth {
		env.Mine(t)
	}
	if _, err := chromedp.Run(b, chromedp.Poll[bool](`document.getElementById("final").textContent === "final" && window.stillThisPage === true`,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		run(chromedp.Text("#final"), &final)
		t.Fatalf("final shows %q after %d more blocks: %v", final, finalityDepth, err)
	}
	inline, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("script:not([src]), [style]").length`))
	if err != nil || inline != 0 {
		t.Fatalf("%d inline scripts or styles (%v)", inline, err)
	}
	var timeline string
	run(chromedp.Text(".timeline"), &timeline)
	for _, s := range []string{"signed", "broadcast", "mined"} {
		if !strings.Contains(timeline, s) {
			t.Fatalf("timeline %q lacks %s", timeline, s)
		}
	}
	if err := chromedp.Do(b, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	screenshot(t, b, filepath.Join(shots, "lookup-phone.png"), true)

	// An authorization nobody has used: the not-found state, in words.
	unknown := env.NewPay(t, env.FundedPayer(t, 1), 1)
	var msg string
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(authorizationURL(s.URL, unknown.Key()))); err != nil {
		t.Fatal(err)
	}
	run(chromedp.Text("#state"), &state)
	run(chromedp.Text(".note"), &msg)
	if state != "unused" || !strings.Contains(msg, "Never seen by this facilitator") {
		t.Fatalf("unknown nonce shows %q / %q", state, msg)
	}
	screenshot(t, b, filepath.Join(shots, "lookup-unknown.png"), false)
	t.Logf("screenshots in %s", shots)
}

// screenshot saves the page as a PNG; readme: also the README's copy, when refreshing them.
func screenshot(t *testing.T, b context.Context, path string, readme bool) {
	t.Helper()
	png, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	// Quality 100 is PNG (below, JPEG). UPDATE_SCREENSHOTS=1 refreshes the README's copies.
	if readme && os.Getenv("UPDATE_SCREENSHOTS") == "1" {
		if err := os.WriteFile(filepath.Join("..", "docs", "screenshots", filepath.Base(path)), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// get is a plain HTTP GET of a console URL: its status, headers and body.
func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// Without a browser: the CSP on every page, no inline script, the search box's redirects, and the
// error pages (bad input 400, a network not served 400, an unknown payment 404, Postgres down 503).
func TestPages(t *testing.T) {
	svc := env.Status(env.DB, finalityDepth)
	s, e := serve(t, svc)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 1_000)
	p.ID = stacktest.RandomID(t)
	tx := e.MustSettle(t, p.Body(t)).Response.Transaction
	page := authorizationURL(s.URL, p.Key())

	res, body := get(t, page)
	if res.StatusCode != 200 || res.Header.Get("Content-Security-Policy") != console.CSP {
		t.Fatalf("answer page: %d, CSP %q", res.StatusCode, res.Header.Get("Content-Security-Policy"))
	}
	// Open mode sees every key's payment ids: the one this payment was settled under.
	if !strings.Contains(body, `id="payment-ids">`+p.ID+`</dd>`) {
		t.Fatalf("the answer page does not list the payment id %s:\n%s", p.ID, body)
	}
	if strings.Count(body, "<script") != 1 || !strings.Contains(body, `<script src="/console/static/console.js"></script>`) {
		t.Fatalf("the page's scripts are not exactly the one external file:\n%s", body)
	}
	for _, asset := range []string{"/console/static/console.js", "/console/static/console.css"} {
		if res, _ := get(t, s.URL+asset); res.StatusCode != 200 {
			t.Fatalf("%s: %d", asset, res.StatusCode)
		}
	}

	// The search box sends each form to its stable URL; the tx and payment pages answer the same
	// authorization.
	k := p.Key()
	for q, want := range map[string]string{
		k.Network + " " + k.Asset.Hex() + " " + k.Payer.Hex() + " " + hexutil.Encode(k.Nonce[:]): page,
		tx:   s.URL + "/console/settlements/" + tx,
		p.ID: s.URL + "/console/payments/" + p.ID,
	} {
		res, body := get(t, s.URL+"/console?q="+strings.ReplaceAll(q, " ", "+"))
		if res.StatusCode != 200 || !strings.EqualFold(res.Request.URL.String(), strings.Replace(want, ":", "%3A", 2)) && !strings.EqualFold(res.Request.URL.String(), want) {
			t.Fatalf("search %q: %d at %s, want %s", q, res.StatusCode, res.Request.URL, want)
		}
		if !strings.Contains(body, tx) {
			t.Fatalf("search %q: the answer lacks the transaction", q)
		}
	}

	other := k
	other.Network = "eip155:1"
	for url, want := range map[string]int{
		s.URL + "/console?q=hello":                                   http.StatusBadRequest,
		authorizationURL(s.URL, other):                               http.StatusBadRequest,
		s.URL + "/console/authorizations/eip155:1/0x12/0x34/0x56":    http.StatusBadRequest,
		s.URL + "/console/payments/" + stacktest.RandomID(t):         http.StatusNotFound,
		s.URL + "/console/settlements/0x" + strings.Repeat("ab", 32): http.StatusNotFound,
		s.URL + "/console/nothing-here":                              http.StatusNotFound,
	} {
		res, body := get(t, url)
		if res.StatusCode != want || res.Header.Get("Content-Security-Policy") != console.CSP || !strings.Contains(body, `name="q"`) {
			t.Errorf("%s: %d, want %d with the search box and the CSP", url, res.StatusCode, want)
		}
	}

	// Postgres down: a ledger whose pool is closed answers 503, and says nothing of why.
	down := env.OpenDB(t)
	down.Close()
	ds, _ := serve(t, status.New(down, []status.Network{{Network: env.Network(), Head: env.Chain.RPC}}, nil))
	res, body = get(t, authorizationURL(ds.URL, k))
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "Temporarily unavailable") || strings.Contains(body, "postgres://") {
		t.Fatalf("Postgres down: %d\n%s", res.StatusCode, body)
	}
}
