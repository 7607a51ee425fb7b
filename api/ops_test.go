package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/ops"
)

type emptyOps struct{}

func (emptyOps) Overview(context.Context) ops.Snapshot { return ops.Snapshot{} }

type okConsole struct{}

func (okConsole) ServeConsole(w http.ResponseWriter, _ *http.Request, _ string) {
	w.WriteHeader(http.StatusOK)
}

func (okConsole) Refused(w http.ResponseWriter, _ *http.Request, err error) {
	w.WriteHeader(api.HTTPStatus(err))
}

// The operations overview and the Operations page need the operator scope: a merchant's key,
// with every other scope, is refused (403) there and still opens the lookup pages.
func TestAuthOperatorRoutes(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	sessions := &memSessions{}
	srv := api.New(api.Config{Verifier: &stubVerifier{}, Ops: emptyOps{}, Console: okConsole{},
		Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: keys, Sessions: sessions}})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	merchant := keys.add(t, facilitator.ScopeVerify, facilitator.ScopeSettle, facilitator.ScopeStatus, facilitator.ScopeWebhooks)
	operator := keys.add(t, facilitator.ScopeOperator)
	for _, path := range []string{"/v1/ops/overview", "/console/ops", "/console/ops/overview.json"} {
		if r := doAuth(t, http.MethodGet, hs.URL+path, merchant, nil); r.Status != http.StatusForbidden {
			t.Errorf("%s with a merchant key: %s, want 403", path, r)
		}
		if r := doAuth(t, http.MethodGet, hs.URL+path, "", nil); r.Status != http.StatusUnauthorized {
			t.Errorf("%s without a key: %s, want 401", path, r)
		}
		if r := doAuth(t, http.MethodGet, hs.URL+path, operator, nil); r.Status != http.StatusOK {
			t.Errorf("%s with an operator key: %s, want 200", path, r)
		}
	}
	if r := doAuth(t, http.MethodGet, hs.URL+"/console", merchant, nil); r.Status != http.StatusOK {
		t.Errorf("/console with a merchant key: %s", r)
	}
	// The console's login cookie opens the Operations page and its data as the header does (the
	// page's script fetches its data with the cookie); elsewhere it counts for nothing.
	cookie := func(path, key string) int {
		t.Helper()
		// A session opened for the key as the login form opens one (an operator-only key lacks
		// the status scope the form asks for).
		k, err := auth.Authenticate(context.Background(), keys, key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		token, _, err := auth.OpenSession(context.Background(), sessions, k, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return getWithSession(t, hs.URL+path, token)
	}
	for _, path := range []string{"/console/ops", "/console/ops/overview.json"} {
		if got := cookie(path, operator); got != http.StatusOK {
			t.Errorf("%s with an operator key's cookie: %d, want 200", path, got)
		}
		if got := cookie(path, merchant); got != http.StatusForbidden {
			t.Errorf("%s with a merchant key's cookie: %d, want 403", path, got)
		}
	}
	if got := cookie("/v1/ops/overview", operator); got != http.StatusUnauthorized {
		t.Errorf("/v1/ops/overview with only the console cookie: %d, want 401", got)
	}
}
