package console_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/ops"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// serveOps is the API over the real stack with the overview wired as cmd wires it: the answers
// ring hears the API's answers, the overview reads the ledger, the engine's keys and the chain,
// and both the API and the console serve it. The ledger is the test's own, so the counts are its.
func serveOps(t *testing.T) (*stacktest.Server, *stacktest.Engine) {
	t.Helper()
	db, err := postgres.Open(t.Context(), env.Ledger(t, "console_ops"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	e := env.NewEngine(t, stacktest.EngineOptions{DB: db})
	answers := ops.NewAnswers(nil)
	overview := ops.New(ops.Config{Ledger: db, Answers: answers, Engine: e.Engine,
		Chains: map[string]ops.Chain{e.Network.ID: env.Chain.RPC}, CacheFor: 500 * time.Millisecond})
	con, err := console.New(console.Config{Status: env.Status(db, 1), HTTPStatus: api.HTTPStatus, Ops: overview})
	if err != nil {
		t.Fatal(err)
	}
	s := env.NewServer(t, stacktest.ServerOptions{Engine: e, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Console, c.Ops, c.Observer = con, overview, answers
	}})
	return s, e
}

// settleHTTP settles a fresh payment through the API's /settle, so that the answer is counted.
func settleHTTP(t *testing.T, s *stacktest.Server) {
	t.Helper()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 10_000)
	for _, path := range []string{"/verify", "/settle"} {
		res, err := http.Post(s.URL+path, "application/json", bytes.NewReader(p.Body(t)))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, res.StatusCode)
		}
	}
}

// In a real Chromium: the Operations page draws its three charts with data, shows the signer
// with its next nonce and the ledger check agreeing for the settled payments, and updates charts
// and tables without a reload when one more is settled; no CSP violation, no script error.
func TestBrowserOps(t *testing.T) {
	s, e := serveOps(t)
	for range 3 {
		settleHTTP(t, s)
	}
	b := stacktest.Browser(t)
	var mu sync.Mutex
	var problems []string
	cctx, stop := context.WithCancel(b)
	defer stop()
	go func() {
		for m, err := range chromedp.Console(cctx) {
			if err != nil {
				return
			}
			if strings.HasSuffix(m.URL, "/favicon.ico") {
				continue // the browser's own guess, not the page's
			}
			if m.IsException() || m.Type == chromedp.ConsoleError || strings.Contains(m.Text, "Content Security Policy") {
				mu.Lock()
				problems = append(problems, m.String())
				mu.Unlock()
			}
		}
	}()
	if err := chromedp.Do(b, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(s.URL+"/console/ops")); err != nil {
		t.Fatal(err)
	}
	poll := func(what, js string) {
		t.Helper()
		if _, err := chromedp.Run(b, chromedp.Poll[bool](js, chromedp.WithPollingInterval(100*time.Millisecond),
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			dump, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.getElementById("ops").innerText.slice(0, 3000)`))
			t.Fatalf("%s: %v\n%s", what, err, dump)
		}
	}
	for _, id := range []string{"chart-settlements", "chart-answers", "chart-latency"} {
		poll(id+" drawn with data", `(function(){ var el = document.getElementById("`+id+`");
			return Number(el.dataset.points) > 0 && el.querySelector("canvas") !== null; })()`)
	}
	signer := stacktest.AddressOf(e.Signer()).Hex()
	nonceOf := `(document.querySelector('#signers tr[data-address="` + signer + `"] .next-nonce') || {}).textContent`
	poll("the signer's next nonce", nonceOf+` === "3"`)
	poll("the ledger check", `(document.getElementById("check-summary") || {}).textContent.indexOf("3 agree, 0 disagree") === 0`)
	if n, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("#ledger-check tr.verdict-agrees").length`)); err != nil || n != 3 {
		t.Fatalf("%d rows agree (%v), want 3", n, err)
	}
	shots := stacktest.ArtifactDir(t, "console")
	screenshot(t, b, filepath.Join(shots, "ops-desktop.png"), true)

	// One more settlement: the page follows without a reload.
	if _, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.stillThisPage = true`)); err != nil {
		t.Fatal(err)
	}
	before, err := chromedp.Run(b, chromedp.Evaluate[int](`Number(document.getElementById("chart-settlements").dataset.points)`))
	if err != nil {
		t.Fatal(err)
	}
	settleHTTP(t, s)
	poll("the next nonce after one more", nonceOf+` === "4"`)
	poll("the ledger check after one more", `document.getElementById("check-summary").textContent.indexOf("4 agree") === 0`)
	// The chart counts settlements per minute: one more is one more point unless it fell in the
	// minute already drawn; either way the series changed, so compare the drawn sum.
	poll("the settlements chart after one more", `(function(){ var p = document.getElementById("chart-settlements").dataset.points;
		var t = document.querySelector("#s-settlements tbody tr:last-child .num").textContent.trim();
		return t === "4" && Number(p) >= `+strconv.Itoa(before)+`; })()`)
	if same, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.stillThisPage === true`)); err != nil || !same {
		t.Fatalf("the page reloaded to update (%v)", err)
	}
	inline, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("script:not([src])").length`))
	if err != nil || inline != 0 {
		t.Fatalf("%d inline scripts (%v)", inline, err)
	}
	if err := chromedp.Do(b, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	poll("the charts on a phone", `Number(document.getElementById("chart-latency").dataset.points) > 0`)
	screenshot(t, b, filepath.Join(shots, "ops-phone.png"), true)
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("the console reported:\n%s", strings.Join(problems, "\n"))
	}
	t.Logf("screenshots in %s", shots)
}

// Without a browser: the operator scope guards the page and the JSON like the API's overview (a
// merchant key gets 403), and the JSON is the API's snapshot.
func TestOpsScopeAndJSON(t *testing.T) {
	s, _ := serveOps(t)
	settleHTTP(t, s)
	res, body := get(t, s.URL+"/console/ops/overview.json")
	if res.StatusCode != 200 || res.Header.Get("Content-Security-Policy") != console.CSP || !strings.Contains(body, `"ledgerCheck"`) {
		t.Fatalf("overview.json: %d %s", res.StatusCode, body)
	}
	res, body = get(t, s.URL+"/console/ops")
	if res.StatusCode != 200 || !strings.Contains(body, `<script src="/console/static/vendor/uplot/uPlot.iife.min.js"></script>`) {
		t.Fatalf("/console/ops: %d", res.StatusCode)
	}
}

// The vendored uPlot is byte for byte the pinned npm package's dist (package.json pins 1.6.32):
// a missing node_modules fails under CI=true and skips elsewhere.
func TestVendoredUPlot(t *testing.T) {
	dist := filepath.Join("..", "node_modules", "uplot")
	if _, err := os.Stat(dist); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node_modules/uplot is missing (npm ci): %v", err)
		}
		t.Skipf("node_modules/uplot is missing (npm ci): %v", err)
	}
	pkg, err := os.ReadFile(filepath.Join(dist, "package.json"))
	if err != nil || !strings.Contains(string(pkg), `"version": "1.6.32"`) {
		t.Fatalf("node_modules/uplot is not 1.6.32 (%v)", err)
	}
	for vendored, upstream := range map[string]string{
		"uPlot.iife.min.js": filepath.Join(dist, "dist", "uPlot.iife.min.js"),
		"uPlot.min.css":     filepath.Join(dist, "dist", "uPlot.min.css"),
		"LICENSE":           filepath.Join(dist, "LICENSE"),
	} {
		a, err := os.ReadFile(filepath.Join("static", "vendor", "uplot", vendored))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(upstream)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("static/vendor/uplot/%s differs from %s: copy it again", vendored, upstream)
		}
	}
}
