package console_test

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// consoleStack is the API with the console in keys mode on the real stack, its log (API's and
// console's) captured, and the handler itself for requests a plain-HTTP test server cannot make
// (over TLS).
type consoleStack struct {
	*stacktest.Server
	handler http.Handler
	logs    *stacktest.SyncBuffer
	db      *postgres.DB
	// clock is the sessions' and the limiters' clock.
	clock *testClock
	// bodies is every response body the test read, to search for keys.
	bodies []string
}

// testClock is a clock a test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newConsoleStack builds the stack; tune, if given, changes its auth configuration (the login
// limits, the session lifetime).
func newConsoleStack(t *testing.T, tune ...func(*api.AuthConfig)) *consoleStack {
	t.Helper()
	db := env.OpenDB(t)
	logs := &stacktest.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(logs, stacktestWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := env.NewEngine(t, stacktest.EngineOptions{DB: db, Logger: log})
	clock := &testClock{now: time.Now()}
	authCfg := &api.AuthConfig{Mode: api.AuthKeys, Keys: db, Sessions: db, Now: clock.Now}
	for _, f := range tune {
		f(authCfg)
	}
	con, err := console.New(console.Config{Status: env.Status(db, 1), HTTPStatus: api.HTTPStatus, Logger: log,
		Merchant: db, Sessions: api.ConsoleSessions(authCfg), Networks: []facilitator.Network{env.Network()}})
	if err != nil {
		t.Fatal(err)
	}
	cs := &consoleStack{logs: logs, db: db, clock: clock}
	cs.Server = env.NewServer(t, stacktest.ServerOptions{Engine: e, Logger: log, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Console, c.Auth, c.Lists = con, authCfg, db
	}, Handler: func(h http.Handler) http.Handler { cs.handler = h; return h }})
	return cs
}

// stacktestWriter sends the log to the test's output too.
type stacktestWriter struct{ t *testing.T }

func (w stacktestWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// send makes one request without following redirects and keeps its body.
func (cs *consoleStack) send(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	cs.bodies = append(cs.bodies, string(b))
	return res, string(b)
}

// loginRequest is the login form's POST, with the headers a browser's own page sends.
func (cs *consoleStack) loginRequest(t *testing.T, key, next string) *http.Request {
	t.Helper()
	form := url.Values{"key": {key}, "next": {next}}
	req, err := http.NewRequest(http.MethodPost, cs.URL+"/console/login", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return req
}

// login logs in through the form with key and returns the session cookie's value.
func (cs *consoleStack) login(t *testing.T, key string) string {
	t.Helper()
	res, _ := cs.send(t, cs.loginRequest(t, key, "/console"))
	ck := sessionCookieOf(res)
	if res.StatusCode != http.StatusSeeOther || ck == nil || ck.Value == "" {
		t.Fatalf("logging in: %d, cookie %+v", res.StatusCode, ck)
	}
	return ck.Value
}

// get fetches a console path with a session cookie.
func (cs *consoleStack) get(t *testing.T, p, token string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, cs.URL+p, nil)
	req.AddCookie(&http.Cookie{Name: facilitator.ConsoleSessionCookie, Value: token})
	return cs.send(t, req)
}

func sessionCookieOf(res *http.Response) *http.Cookie {
	for _, c := range res.Cookies() {
		if c.Name == facilitator.ConsoleSessionCookie {
			return c
		}
	}
	return nil
}

// onConsole reports whether a redirect's Location, as a browser resolves it against base (dot
// segments, escaped ones too), stays on base's host under /console.
func onConsole(base, loc string) bool {
	b, err1 := url.Parse(base)
	l, err2 := url.Parse(loc)
	if err1 != nil || err2 != nil || strings.ContainsAny(loc, "\\\t\r\n") {
		return false
	}
	u := b.ResolveReference(l)
	p, err := url.PathUnescape(u.EscapedPath())
	if err != nil || u.Host != b.Host || u.Scheme != b.Scheme {
		return false
	}
	p = path.Clean(p)
	return p == "/console" || strings.HasPrefix(p, "/console/")
}

// TestConsoleLoginHardening: the login form refuses another site's POST and sets no cookie;
// whatever next it is given it sends the browser only to a console path; the cookie is
// HttpOnly, SameSite=Strict, scoped to /console, and Secure over TLS; the key shows in no
// answer and no log line; and the cookie opens the console's pages only, never the API.
func TestConsoleLoginHardening(t *testing.T) {
	cs := newConsoleStack(t)
	scopes := []facilitator.Scope{facilitator.ScopeStatus}
	key, _ := merchantKey(t, scopes...)
	mistyped := key[:len(key)-4] + "0000"
	if mistyped == key {
		mistyped = key[:len(key)-4] + "1111"
	}

	// Another site's POST, with a good key: refused, no cookie.
	for name, set := range map[string]func(*http.Request){
		"Sec-Fetch-Site cross-site": func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") },
		"Sec-Fetch-Site same-site":  func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "same-site") },
		"a foreign Origin":          func(r *http.Request) { r.Header.Del("Sec-Fetch-Site"); r.Header.Set("Origin", "https://evil.example") },
		"an Origin of another port": func(r *http.Request) { r.Header.Del("Sec-Fetch-Site"); r.Header.Set("Origin", "http://127.0.0.1:1") },
	} {
		req := cs.loginRequest(t, key, "/console/settlements")
		set(req)
		res, _ := cs.send(t, req)
		if res.StatusCode != http.StatusForbidden || len(res.Header.Values("Set-Cookie")) != 0 || res.Header.Get("Location") != "" {
			t.Errorf("%s: %d, Set-Cookie %q, Location %q; want 403 and no cookie", name, res.StatusCode, res.Header.Values("Set-Cookie"), res.Header.Get("Location"))
		}
	}
	// Logging out cross-site is refused too (it would clear the cookie).
	req, _ := http.NewRequest(http.MethodPost, cs.URL+"/console/logout", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if res, _ := cs.send(t, req); res.StatusCode != http.StatusForbidden || len(res.Header.Values("Set-Cookie")) != 0 {
		t.Errorf("cross-site logout: %d %q", res.StatusCode, res.Header.Values("Set-Cookie"))
	}

	// next: off-site or off-console targets fall back to the console; its own paths are kept.
	for _, next := range []string{"//evil.example", "//evil.example/console", "https://evil.example/console", "http:evil.example",
		"/\\evil.example", "\\\\evil.example", "/console/../x", "/console/%2e%2e/x", "/console/.%2E/.%2e/x", "/console/..%2fx",
		"/console/./../x", "javascript:alert(1)", "/consolex", "/x", "", "/console/login", "/console\\..\\x", " //evil.example"} {
		res, _ := cs.send(t, cs.loginRequest(t, key, next))
		loc := res.Header.Get("Location")
		if res.StatusCode != http.StatusSeeOther || !onConsole(cs.URL, loc) {
			t.Errorf("next %q: %d to %q, want a redirect to a /console path", next, res.StatusCode, loc)
		}
	}
	for _, next := range []string{"/console/settlements?state=final", "/console/payers/0x00000000000000000000000000000000000000aa", "/console"} {
		if res, _ := cs.send(t, cs.loginRequest(t, key, next)); res.Header.Get("Location") != next {
			t.Errorf("next %q: redirected to %q, want it kept", next, res.Header.Get("Location"))
		}
	}

	// The cookie's attributes, over plain HTTP and over TLS.
	res, _ := cs.send(t, cs.loginRequest(t, key, "/console"))
	ck := sessionCookieOf(res)
	// The cookie holds a session's token: neither the key nor any part of it.
	if ck == nil || ck.Value == "" || strings.Contains(ck.Value, key[strings.LastIndex(key, "_")+1:]) || strings.Contains(ck.Value, key[:17]) || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/console" || ck.Secure || ck.MaxAge != 0 || ck.Domain != "" {
		t.Fatalf("the login cookie over HTTP: %+v", ck)
	}
	tlsReq := cs.loginRequest(t, key, "/console")
	tlsReq = httptest.NewRequest(http.MethodPost, "https://facilitator.example/console/login", tlsReq.Body)
	tlsReq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	tlsReq.Header.Set("Sec-Fetch-Site", "same-origin")
	tlsReq.TLS = &tls.ConnectionState{}
	w := httptest.NewRecorder()
	cs.handler.ServeHTTP(w, tlsReq)
	cs.bodies = append(cs.bodies, w.Body.String())
	if ck := sessionCookieOf(w.Result()); ck == nil || !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/console" {
		t.Errorf("the login cookie over TLS: %d %+v", w.Code, ck)
	}

	// A mistyped key is refused with the form, and no cookie.
	res, _ = cs.send(t, cs.loginRequest(t, mistyped, "/console"))
	if res.StatusCode != http.StatusUnauthorized || sessionCookieOf(res) != nil {
		t.Errorf("a mistyped key: %d, cookie %+v", res.StatusCode, sessionCookieOf(res))
	}

	// The cookie opens the console's pages, and nothing of the API.
	withCookie := func(method, p string) *http.Request {
		req, _ := http.NewRequest(method, cs.URL+p, nil)
		req.AddCookie(&http.Cookie{Name: facilitator.ConsoleSessionCookie, Value: ck.Value})
		return req
	}
	if res, _ := cs.send(t, withCookie(http.MethodGet, "/console/settlements")); res.StatusCode != http.StatusOK {
		t.Errorf("the console's settlements with the cookie: %d", res.StatusCode)
	}
	for _, p := range []string{"/v1/settlements", "/v1/settlements.csv"} {
		if res, _ := cs.send(t, withCookie(http.MethodGet, p)); res.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with only the console's cookie: %d, want 401", p, res.StatusCode)
		}
	}

	for _, secret := range []string{key, mistyped, key[strings.LastIndex(key, "_")+1:], mistyped[strings.LastIndex(mistyped, "_")+1:]} {
		for i, b := range cs.bodies {
			if strings.Contains(b, secret) {
				t.Errorf("answer %d holds a key: %.200q", i, b)
			}
		}
		if strings.Contains(cs.logs.String(), secret) {
			t.Errorf("the log holds a key")
		}
	}
	if cs.logs.String() == "" {
		t.Error("nothing was logged: the log capture is not the server's")
	}
}

// TestConsolePayerScoped: a payer who paid merchants A and B shows, on A's payer page, only
// A's settlement, and on B's only B's.
func TestConsolePayerScoped(t *testing.T) {
	cs := newConsoleStack(t)
	scopes := []facilitator.Scope{facilitator.ScopeSettle, facilitator.ScopeStatus}
	keyA, _ := merchantKey(t, scopes...)
	keyB, _ := merchantKey(t, scopes...)
	payer := env.FundedPayer(t, 10_000_000)
	txA := settleWith(t, cs.Server, keyA, env.NewPay(t, payer, 1_234_500))
	txB := settleWith(t, cs.Server, keyB, env.NewPay(t, payer, 777_000))
	page := "/console/payers/" + stacktest.AddressOf(payer).Hex()
	for _, c := range []struct{ key, mine, theirs string }{{keyA, txA, txB}, {keyB, txB, txA}} {
		res, body := cs.get(t, page, cs.login(t, c.key))
		body = strings.ToLower(body)
		if res.StatusCode != http.StatusOK || !strings.Contains(body, strings.ToLower(c.mine)) || strings.Contains(body, strings.ToLower(c.theirs)) {
			t.Errorf("payer page: %d, own transaction shown %v, the other merchant's shown %v", res.StatusCode,
				strings.Contains(body, strings.ToLower(c.mine)), strings.Contains(body, strings.ToLower(c.theirs)))
		}
		if strings.Contains(body, strings.ToLower(c.key)) {
			t.Error("the payer page holds the key")
		}
	}
}
