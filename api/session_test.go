package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// memSessions is an in-memory auth.SessionStore (the Postgres one is tested in console's tests).
type memSessions struct {
	mu       sync.Mutex
	sessions map[[32]byte]facilitator.ConsoleSession
}

func (m *memSessions) InsertConsoleSession(_ context.Context, s *facilitator.ConsoleSession) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions == nil {
		m.sessions = map[[32]byte]facilitator.ConsoleSession{}
	}
	m.sessions[s.Hash] = *s
	return nil
}

func (m *memSessions) ConsoleSession(_ context.Context, hash [32]byte) (*facilitator.ConsoleSession, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[hash]
	if !ok {
		return nil, facilitator.ErrNotFound
	}
	return &s, nil
}

func (m *memSessions) RevokeConsoleSession(_ context.Context, hash [32]byte, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.sessions[hash]; ok && s.RevokedAt == nil {
		s.RevokedAt = &at
		m.sessions[hash] = s
	}
	return nil
}

// getWithSession sends a GET to u with the console's session cookie token and returns the
// answer's status.
func getWithSession(t *testing.T, u, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.AddCookie(&http.Cookie{Name: facilitator.ConsoleSessionCookie, Value: token})
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestConsoleSessionScopes: a session opens what both it and its key may do now: a key that
// loses a scope after the login loses it in the session too, and a scope added to the key after
// the login is not in the session.
func TestConsoleSessionScopes(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	sessions := &memSessions{}
	cfg := &api.AuthConfig{Mode: api.AuthKeys, Keys: keys, Sessions: sessions}
	srv := api.New(api.Config{Verifier: &stubVerifier{}, Ops: emptyOps{}, Console: okConsole{}, Auth: cfg})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	text := keys.add(t, facilitator.ScopeStatus)
	token, _, err := api.ConsoleSessions(cfg).Login(context.Background(), "192.0.2.1", text)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) int {
		t.Helper()
		return getWithSession(t, hs.URL+path, token)
	}
	if got := get("/console"); got != http.StatusOK {
		t.Fatalf("/console with the session: %d", got)
	}
	id, _ := auth.ParseID(text)
	keys.mu.Lock()
	keys.keys[id].Scopes = []facilitator.Scope{facilitator.ScopeStatus, facilitator.ScopeOperator}
	keys.mu.Unlock()
	if got := get("/console/ops"); got != http.StatusForbidden {
		t.Errorf("/console/ops with a session opened before the key had the operator scope: %d, want 403", got)
	}
	keys.mu.Lock()
	keys.keys[id].Scopes = []facilitator.Scope{facilitator.ScopeVerify}
	keys.mu.Unlock()
	if got := get("/console"); got != http.StatusForbidden {
		t.Errorf("/console with a session whose key lost the status scope: %d, want 403", got)
	}
}

// TestRotatedKeyGrace: on the API's clock (AuthConfig.Now), a rotated key's old secret passes the
// guard through the grace and is refused from its end, the new one passes throughout; and a
// console session opened with the old secret ends with the grace, not a session's length later.
func TestRotatedKeyGrace(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	sessions := &memSessions{}
	t0 := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(d time.Duration) { mu.Lock(); now = t0.Add(d); mu.Unlock() }
	cfg := &api.AuthConfig{Mode: api.AuthKeys, Keys: keys, Sessions: sessions, Now: clock, SessionTTL: 12 * time.Hour}
	srv := api.New(api.Config{Verifier: &stubVerifier{}, Ops: emptyOps{}, Console: okConsole{}, Auth: cfg})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	old := keys.add(t, facilitator.ScopeVerify, facilitator.ScopeStatus)
	id, _ := auth.ParseID(old)
	fresh, hash, err := auth.NewSecret(id)
	if err != nil {
		t.Fatal(err)
	}
	until := t0.Add(time.Hour)
	keys.mu.Lock()
	k := keys.keys[id]
	oldHash := k.Hash
	k.Hash, k.RotatedAt, k.PreviousHash, k.PreviousUntil = hash, &t0, &oldHash, &until
	keys.mu.Unlock()

	body := newPayment(t, 1).body(t)
	verify := func(key string) int {
		t.Helper()
		return doAuth(t, http.MethodPost, hs.URL+"/verify", key, body).Status
	}
	set(30 * time.Minute)
	token, expires, err := api.ConsoleSessions(cfg).Login(context.Background(), "192.0.2.1", old)
	if err != nil || !expires.Equal(until) {
		t.Fatalf("login with the old secret in the grace: expires %s, want the grace's end %s (%v)", expires, until, err)
	}
	if a, b, c := verify(old), verify(fresh), getWithSession(t, hs.URL+"/console", token); a != 200 || b != 200 || c != 200 {
		t.Fatalf("inside the grace: old %d, new %d, session %d; want 200s", a, b, c)
	}
	set(time.Hour)
	if a, b, c := verify(old), verify(fresh), getWithSession(t, hs.URL+"/console", token); a != 401 || b != 200 || c != 401 {
		t.Fatalf("at the grace's end: old %d (want 401), new %d (want 200), old's session %d (want 401)", a, b, c)
	}
}
