package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestReadyzShared: /readyz runs its checks at most once per second, whoever asks. 500 requests,
// 50 at a time, at one instant of the server's clock, make one run of the node's check; a
// second later the next request makes one more.
func TestReadyzShared(t *testing.T) {
	var calls atomic.Int64
	node := api.ReadyFunc(func(context.Context) error {
		calls.Add(1)
		time.Sleep(time.Millisecond) // long enough for callers to pile up on a run
		return nil
	})
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	srv := api.New(api.Config{Ready: map[string]api.ReadyChecker{"node": node}, Now: clock})
	get := func() int {
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var res api.ReadyResponse
		if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || res.Checks["node"] != "ok" {
			t.Errorf("/readyz: %d %s", w.Code, w.Body)
		}
		return w.Code
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if code := get(); code != http.StatusOK {
					t.Errorf("/readyz: %d", code)
				}
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("500 requests within one second ran the node's check %d times, want 1", n)
	}
	mu.Lock()
	now = now.Add(999 * time.Millisecond)
	mu.Unlock()
	get()
	if n := calls.Load(); n != 1 {
		t.Fatalf("a request 999ms later ran the check again (%d runs)", n)
	}
	mu.Lock()
	now = now.Add(time.Millisecond)
	mu.Unlock()
	get()
	get()
	if n := calls.Load(); n != 2 {
		t.Fatalf("a second later: %d runs, want 2", n)
	}
}

// hungStatus is a status service in front of a node that does not answer: every lookup blocks
// until its context ends, and returns what a client library makes of that.
type hungStatus struct{}

func (hungStatus) Authorization(ctx context.Context, _ facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	<-ctx.Done()
	return facilitator.AuthorizationStatus{}, false, ctx.Err()
}

func (hungStatus) Payment(ctx context.Context, _, _ string) (facilitator.AuthorizationStatus, error) {
	<-ctx.Done()
	return facilitator.AuthorizationStatus{}, facilitator.Unavailable("status_unavailable", "the ledger is unavailable, retry", ctx.Err())
}

func (hungStatus) Settlement(ctx context.Context, _ common.Hash) (facilitator.AuthorizationStatus, error) {
	<-ctx.Done()
	return facilitator.AuthorizationStatus{}, ctx.Err()
}

// TestStatusLookupBounded: with the node not answering, every status lookup answers within
// StatusTimeout with 503 status_timeout and Retry-After, instead of hanging with the node. (The
// test's own deadline, far longer, only keeps a hang from hanging the test.)
func TestStatusLookupBounded(t *testing.T) {
	srv := httptest.NewServer(api.New(api.Config{Verifier: &stubVerifier{}, Status: hungStatus{}, StatusTimeout: 50 * time.Millisecond}).Handler())
	t.Cleanup(srv.Close)
	for _, path := range []string{
		"/v1/authorizations/eip155:8453/0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913/0x70997970C51812dc3A010C7d01b50e0d17dc79C8/0x" + common.Bytes2Hex(make([]byte, 32)),
		"/v1/payments/order-1234567890abcdef",
		"/v1/settlements/0x" + common.Bytes2Hex(make([]byte, 32)),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v (the lookup hung with the node)", path, err)
		}
		var body map[string]string
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		cancel()
		if res.StatusCode != http.StatusServiceUnavailable || body["error"] != facilitator.ReasonStatusTimeout || body["message"] == "" || res.Header.Get("Retry-After") == "" {
			t.Errorf("%s: %d %v (Retry-After %q), want 503 %s with Retry-After", path, res.StatusCode, body, res.Header.Get("Retry-After"), facilitator.ReasonStatusTimeout)
		}
	}
}

// TestAPISecurityHeaders: every answer of the API, errors and refusals included, says nosniff,
// no referrer, and a policy that loads nothing and is never framed.
func TestAPISecurityHeaders(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	srv := httptest.NewServer(api.New(api.Config{Verifier: &stubVerifier{}, Status: &scopeStatus{},
		Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: keys}}).Handler())
	t.Cleanup(srv.Close)
	status := keys.add(t, facilitator.ScopeStatus)
	for _, tc := range []struct {
		method, path, key string
		status            int
	}{
		{http.MethodGet, "/supported", "", 200},
		{http.MethodGet, "/healthz", "", 200},
		{http.MethodGet, "/v1/payments/abcdefghijklmnopq", status, 200},
		{http.MethodGet, "/v1/payments/abc", status, 400},
		{http.MethodGet, "/v1/payments/abcdefghijklmnopq", "", 401},
		{http.MethodPost, "/verify", status, 403},
		{http.MethodGet, "/no/such/route", "", 404},
		{http.MethodGet, "/v1//payments/abcdefghijklmnopq", status, 400},
	} {
		r := doAuth(t, tc.method, srv.URL+tc.path, tc.key, nil)
		if r.Status != tc.status {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, r.Status, tc.status)
		}
		for h, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
			"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'"} {
			if got := r.Header.Get(h); got != want {
				t.Errorf("%s %s (%d): %s %q, want %q", tc.method, tc.path, r.Status, h, got, want)
			}
		}
	}
}
