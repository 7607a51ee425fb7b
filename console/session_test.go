package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// loginPage reports whether an answer is the login form refusing a page: 401 and the form, not
// the page asked for.
func loginPage(res *http.Response, body string) bool {
	return res.StatusCode == http.StatusUnauthorized && strings.Contains(body, `action="/console/login"`) &&
		!strings.Contains(body, "<h1>Settlements")
}

// TestConsoleSessionLogout: the login opens a session the ledger knows only by its token's hash,
// bound to the key; after logout the same cookie, replayed, is the login form, not the page.
func TestConsoleSessionLogout(t *testing.T) {
	cs := newConsoleStack(t)
	key, id := merchantKey(t, facilitator.ScopeStatus)
	token := cs.login(t, key)
	if strings.Contains(token, key[len("x402_"):len("x402_")+12]) || strings.Contains(key, token) {
		t.Fatalf("the session token shares text with the key")
	}
	s, err := cs.db.ConsoleSession(context.Background(), auth.SessionHash(token))
	if err != nil || s.KeyID != id || s.RevokedAt != nil || !s.ExpiresAt.Equal(s.CreatedAt.Add(api.DefaultSessionTTL)) {
		t.Fatalf("the stored session: %+v %v", s, err)
	}
	if res, body := cs.get(t, "/console/settlements", token); res.StatusCode != http.StatusOK || loginPage(res, body) {
		t.Fatalf("the settlements page with the session: %d", res.StatusCode)
	}

	req, _ := http.NewRequest(http.MethodPost, cs.URL+"/console/logout", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(&http.Cookie{Name: facilitator.ConsoleSessionCookie, Value: token})
	res, _ := cs.send(t, req)
	if ck := sessionCookieOf(res); res.StatusCode != http.StatusSeeOther || ck == nil || ck.MaxAge >= 0 {
		t.Fatalf("logout: %d, cookie %+v; want a redirect clearing the cookie", res.StatusCode, ck)
	}
	// A copy of the cookie taken before the logout opens nothing after it.
	for _, p := range []string{"/console/settlements", "/console", "/console/settlements.csv"} {
		if res, body := cs.get(t, p, token); !loginPage(res, body) {
			t.Errorf("%s with the logged-out session's cookie: %d, want the login form (401)", p, res.StatusCode)
		}
	}
	if s, err := cs.db.ConsoleSession(context.Background(), auth.SessionHash(token)); err != nil || s.RevokedAt == nil {
		t.Errorf("the stored session after logout: %+v %v; want it revoked", s, err)
	}
}

// TestConsoleSessionKeyRevoked: revoking a key ends its sessions at once.
func TestConsoleSessionKeyRevoked(t *testing.T) {
	cs := newConsoleStack(t)
	key, id := merchantKey(t, facilitator.ScopeStatus)
	token := cs.login(t, key)
	other := cs.login(t, key)
	if other == token {
		t.Fatal("two logins got the same token")
	}
	if res, _ := cs.get(t, "/console/settlements", token); res.StatusCode != http.StatusOK {
		t.Fatalf("before revocation: %d", res.StatusCode)
	}
	if _, err := cs.db.RevokeAPIKey(context.Background(), id, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{token, other} {
		if res, body := cs.get(t, "/console/settlements", tok); !loginPage(res, body) {
			t.Errorf("a session of a revoked key: %d, want the login form (401)", res.StatusCode)
		}
	}
	if res, _ := cs.send(t, cs.loginRequest(t, key, "/console")); res.StatusCode != http.StatusUnauthorized || sessionCookieOf(res) != nil {
		t.Errorf("logging in with the revoked key: %d", res.StatusCode)
	}
}

// TestConsoleSessionExpires: a session ends at its lifetime, and the retention job's prune then
// deletes it.
func TestConsoleSessionExpires(t *testing.T) {
	ttl := 30 * time.Minute
	cs := newConsoleStack(t, func(c *api.AuthConfig) { c.SessionTTL = ttl })
	key, _ := merchantKey(t, facilitator.ScopeStatus)
	token := cs.login(t, key)
	cs.clock.Add(ttl - time.Second)
	if res, _ := cs.get(t, "/console/settlements", token); res.StatusCode != http.StatusOK {
		t.Fatalf("a second before expiry: %d", res.StatusCode)
	}
	cs.clock.Add(time.Second)
	if res, body := cs.get(t, "/console/settlements", token); !loginPage(res, body) {
		t.Fatalf("at expiry: %d, want the login form (401)", res.StatusCode)
	}
	ctx := context.Background()
	if _, err := cs.db.PruneConsoleSessions(ctx, cs.clock.Now(), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.db.ConsoleSession(ctx, auth.SessionHash(token)); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("the expired session after the prune: %v, want it deleted", err)
	}
	// A session still live is kept.
	live := cs.login(t, key)
	if _, err := cs.db.PruneConsoleSessions(ctx, cs.clock.Now(), 100); err != nil {
		t.Fatal(err)
	}
	if res, _ := cs.get(t, "/console/settlements", live); res.StatusCode != http.StatusOK {
		t.Errorf("a live session after the prune: %d", res.StatusCode)
	}
}

// TestConsoleLoginRateLimit: past a few attempts, the login form answers 429 with Retry-After,
// per client address whatever the key, and per key id whatever the address; no session is opened.
func TestConsoleLoginRateLimit(t *testing.T) {
	limit := auth.Limit{Rate: 1.0 / 60, Burst: 3}
	cs := newConsoleStack(t, func(c *api.AuthConfig) { c.LoginPerClient, c.LoginPerKey = limit, limit })
	key, _ := merchantKey(t, facilitator.ScopeStatus)
	wrong := func(k string) string {
		return k[:len(k)-4] + map[bool]string{true: "1111", false: "0000"}[strings.HasSuffix(k, "0000")]
	}
	login := func(addr, k string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/console/login", strings.NewReader("next=%2Fconsole&key="+k))
		req.RemoteAddr = addr + ":40000"
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		w := httptest.NewRecorder()
		cs.handler.ServeHTTP(w, req)
		return w
	}
	refused := func(w *httptest.ResponseRecorder) bool {
		return w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") != "" && sessionCookieOf(w.Result()) == nil &&
			strings.Contains(w.Body.String(), `action="/console/login"`)
	}

	// Per client address: three guesses with other keys, then even the right key waits.
	for i := 0; i < 3; i++ {
		other, _ := merchantKey(t, facilitator.ScopeStatus)
		if w := login("192.0.2.10", wrong(other)); w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d", i, w.Code)
		}
	}
	if w := login("192.0.2.10", key); !refused(w) {
		t.Fatalf("the fourth attempt from one address: %d, Retry-After %q; want 429 with Retry-After and the form", w.Code, w.Header().Get("Retry-After"))
	} else if w.Header().Get("Retry-After") != "60" {
		t.Errorf("Retry-After %q, want 60 (one attempt a minute, none left)", w.Header().Get("Retry-After"))
	}

	// Per key id: three guesses at the key's secret from three addresses, then the key waits
	// from a fourth address too.
	for i, addr := range []string{"192.0.2.21", "192.0.2.22", "192.0.2.23"} {
		if w := login(addr, wrong(key)); w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d at the key: %d", i, w.Code)
		}
	}
	if w := login("192.0.2.24", key); !refused(w) {
		t.Fatalf("the key's fourth attempt, from a new address: %d; want 429", w.Code)
	}
	// A minute later the key may try again.
	cs.clock.Add(time.Minute)
	if w := login("192.0.2.25", key); w.Code != http.StatusSeeOther || sessionCookieOf(w.Result()) == nil {
		t.Errorf("a minute later: %d; want the login to pass", w.Code)
	}
}
