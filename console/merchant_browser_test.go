package console_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// merchantKey stores a merchant API key in the ledger and returns its text and id.
func merchantKey(t *testing.T, scopes ...facilitator.Scope) (string, string) {
	t.Helper()
	full, id, hash, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.DB.InsertAPIKey(context.Background(), &facilitator.APIKey{ID: id, Hash: hash, Name: "merchant " + id, Scopes: scopes}); err != nil {
		t.Fatal(err)
	}
	return full, id
}

// settleWith settles a fresh payment through the server's /settle with key, as a merchant's
// middleware does, so that the ledger records the key; it returns the transaction hash.
func settleWith(t *testing.T, s *stacktest.Server, key string, p stacktest.Pay) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/settle", bytes.NewReader(p.Body(t)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out facilitator.SettleResponse
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || !out.Success {
		t.Fatalf("settle with the key: %d %+v %v", res.StatusCode, out, err)
	}
	return out.Transaction
}

// In a real Chromium, keys mode: merchant A logs in through the form, sees exactly its own
// settlement (not B's), reads the CSV with its cookie, sees its webhook and deliveries, gets a
// 404 for B's webhook, and logs out.
func TestBrowserMerchant(t *testing.T) {
	db := env.OpenDB(t)
	e := env.NewEngine(t, stacktest.EngineOptions{DB: db})
	authCfg := &api.AuthConfig{Mode: api.AuthKeys, Keys: db, Sessions: db}
	con, err := console.New(console.Config{Status: env.Status(db, 1), HTTPStatus: api.HTTPStatus,
		Merchant: db, Sessions: api.ConsoleSessions(authCfg), Networks: []facilitator.Network{env.Network()}})
	if err != nil {
		t.Fatal(err)
	}
	s := env.NewServer(t, stacktest.ServerOptions{Engine: e, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Console, c.Auth, c.Lists = con, authCfg, db
	}})
	scopes := []facilitator.Scope{facilitator.ScopeSettle, facilitator.ScopeStatus, facilitator.ScopeWebhooks}
	keyA, idA := merchantKey(t, scopes...)
	keyB, idB := merchantKey(t, scopes...)

	// Each merchant's webhook is registered before its payment, so it hears the payment's events.
	ctx := context.Background()
	payA := env.NewPay(t, env.FundedPayer(t, 10_000_000), 1_234_500)
	payB := env.NewPay(t, env.FundedPayer(t, 1_000_000), 777_000)
	whA := facilitator.Webhook{ID: "wh_" + strings.Repeat("a", 24) + idA[:8], URL: "https://a.example/hook", Secret: "s", PayTo: []common.Address{payA.PayTo}, Owner: idA}
	whB := facilitator.Webhook{ID: "wh_" + strings.Repeat("b", 24) + idB[:8], URL: "https://b.example/hook", Secret: "s", PayTo: []common.Address{payB.PayTo}, Owner: idB}
	for _, w := range []*facilitator.Webhook{&whA, &whB} {
		if ok, err := db.InsertWebhook(ctx, w, 100); err != nil || !ok {
			t.Fatalf("webhook: %v %v", ok, err)
		}
	}
	txA := settleWith(t, s, keyA, payA)
	txB := settleWith(t, s, keyB, payB)
	// Events are enqueued once no older transaction can still commit one before them (the
	// outbox's xid cursor): wait until A's mined event is owed to its webhook.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err = db.EnqueueWebhookEvents(ctx, notify.EventStates(), 100); err != nil {
			t.Fatal(err)
		}
		page, err := db.WebhookDeliveries(ctx, facilitator.Viewer{All: true}, whA.ID, facilitator.Page{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(page.Items, func(d facilitator.ListedDelivery) bool { return d.Event.State == facilitator.StateMined }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's mined event was never owed to its webhook: %+v", page.Items)
		}
	}

	b := stacktest.Browser(t)
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(b, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return strings.TrimSpace(v)
	}
	// Without a cookie, the settlements page is the login form; logging in returns to it.
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(s.URL+"/console/settlements")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(b, chromedp.SendKeys("#key", keyA), chromedp.Submit("#key"), chromedp.WaitVisible("#settlements")); err != nil {
		t.Fatalf("login through the form: %v", err)
	}
	url, _ := chromedp.Run(b, chromedp.Evaluate[string](`location.pathname`))
	if url != "/console/settlements" {
		t.Fatalf("after login at %s, want /console/settlements", url)
	}
	table := text("#settlements tbody")
	rows, _ := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("#settlements tbody tr").length`))
	if rows != 1 || !strings.Contains(table, "1.2345 USD Coin") || strings.Contains(table, "0.777") {
		t.Fatalf("A's settlements page has %d rows: %q; want exactly A's 1.2345 USDC", rows, table)
	}
	if html, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.body.innerHTML`)); strings.Contains(strings.ToLower(html), strings.ToLower(txB)) || strings.Contains(html, keyA) {
		t.Fatal("A's page shows B's transaction, or the key")
	}
	shots := stacktest.ArtifactDir(t, "console")
	screenshot(t, b, filepath.Join(shots, "settlements-desktop.png"), true)
	if err := chromedp.Do(b, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload(), chromedp.WaitVisible("#settlements")); err != nil {
		t.Fatal(err)
	}
	screenshot(t, b, filepath.Join(shots, "settlements-phone.png"), true)
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}

	// The CSV, fetched with the browser's cookie: a header and A's row only.
	csvText, err := chromedp.Run(b, chromedp.Evaluate[string](`fetch(document.getElementById("csv").href).then(r => r.text())`,
		chromedp.EvalAsValue, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(csvText)).ReadAll()
	if err != nil || len(recs) != 2 || recs[0][0] != "network" || !strings.EqualFold(recs[1][8], txA) || recs[1][4] != "1234500" {
		t.Fatalf("the CSV: %v %q", err, csvText)
	}

	// A's webhook and its deliveries; B's webhook is a 404 for A.
	if err := chromedp.Do(b, chromedp.Navigate(s.URL+"/console/webhooks"), chromedp.WaitVisible("#webhooks")); err != nil {
		t.Fatal(err)
	}
	if w := text("#webhooks"); !strings.Contains(w, whA.URL) || strings.Contains(w, whB.URL) {
		t.Fatalf("A's webhooks: %q", w)
	}
	if err := chromedp.Do(b, chromedp.Navigate(s.URL+"/console/webhooks/"+whA.ID)); err != nil {
		t.Fatal(err)
	}
	if n, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("#deliveries tbody tr").length`)); err != nil || n == 0 {
		body, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		t.Fatalf("A's webhook page lists no deliveries (%v): %s", err, body)
	}
	if d := text("#deliveries tbody"); !strings.Contains(d, "mined") {
		t.Fatalf("A's deliveries: %q", d)
	}
	status, err := chromedp.Run(b, chromedp.Evaluate[int](`fetch("/console/webhooks/`+whB.ID+`").then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != http.StatusNotFound {
		t.Fatalf("B's webhook page for A: %d %v", status, err)
	}

	// Logout clears the cookie: the next page is the login form again.
	if err := chromedp.Do(b, chromedp.Submit(".logout")); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitPage(t, b, `location.pathname === "/console/login" && !!document.getElementById("key")`, 20*time.Second)
	if err := chromedp.Do(b, chromedp.Navigate(s.URL+"/console/settlements"), chromedp.WaitVisible("#key")); err != nil {
		t.Fatalf("after logout: %v", err)
	}
	res, body := get(t, s.URL+"/console/settlements")
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `name="key"`) {
		t.Fatalf("without a key: %d", res.StatusCode)
	}
}
