package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/ops"
)

type countingOps struct{ reads atomic.Int64 }

func (o *countingOps) Overview(context.Context) ops.Snapshot {
	o.reads.Add(1)
	return ops.Snapshot{}
}

// hungStatus is a status service in front of a node that does not answer: every lookup blocks
// until its context ends.
type hungStatus struct{}

func (hungStatus) Authorization(ctx context.Context, _ facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	<-ctx.Done()
	return facilitator.AuthorizationStatus{}, false, ctx.Err()
}

func (hungStatus) Payment(ctx context.Context, _, _ string) (facilitator.AuthorizationStatus, error) {
	<-ctx.Done()
	return facilitator.AuthorizationStatus{}, ctx.Err()
}

func (hungStatus) Settlement(ctx context.Context, _ common.Hash) (facilitator.AuthorizationStatus, error) {
	<-ctx.Done()
	return facilitator.AuthorizationStatus{}, ctx.Err()
}

func (hungStatus) Timeline(ctx context.Context, _ facilitator.AuthorizationKey) ([]facilitator.SettlementEvent, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestOpsChecksOperatorScope: the Operations page and its data check the operator scope
// themselves, whatever let the request reach them: a viewer without it (or none at all) is
// refused with 403 and the overview is not read.
func TestOpsChecksOperatorScope(t *testing.T) {
	overview := &countingOps{}
	c, err := console.New(console.Config{Status: hungStatus{}, HTTPStatus: api.HTTPStatus, Ops: overview})
	if err != nil {
		t.Fatal(err)
	}
	merchant := facilitator.ViewerOf(&facilitator.APIKey{ID: "m", Scopes: []facilitator.Scope{facilitator.ScopeVerify, facilitator.ScopeSettle, facilitator.ScopeStatus, facilitator.ScopeWebhooks}})
	operator := facilitator.ViewerOf(&facilitator.APIKey{ID: "o", Scopes: []facilitator.Scope{facilitator.ScopeOperator}})
	serve := func(path string, v *facilitator.Viewer) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if v != nil {
			r = r.WithContext(facilitator.WithViewer(r.Context(), *v))
		}
		w := httptest.NewRecorder()
		c.ServeConsole(w, r, "")
		return w
	}
	for _, path := range []string{"/console/ops", "/console/ops/overview.json"} {
		before := overview.reads.Load()
		for name, v := range map[string]*facilitator.Viewer{"a merchant's viewer": &merchant, "no viewer": nil} {
			if w := serve(path, v); w.Code != http.StatusForbidden {
				t.Errorf("%s with %s: %d, want 403", path, name, w.Code)
			}
		}
		if overview.reads.Load() != before {
			t.Fatalf("%s: the overview was read for a viewer without the operator scope", path)
		}
		if w := serve(path, &operator); w.Code != http.StatusOK {
			t.Errorf("%s with the operator's viewer: %d", path, w.Code)
		}
	}
	if w := serve("/console/ops/overview.json", &merchant); !strings.Contains(w.Body.String(), facilitator.ReasonForbiddenScope) {
		t.Errorf("overview.json refused: %s, want a JSON body with %s", w.Body, facilitator.ReasonForbiddenScope)
	}
}

// TestConsoleLookupBounded: with the node not answering, a lookup page answers within
// QueryTimeout with 503 "Temporarily unavailable" and Retry-After.
func TestConsoleLookupBounded(t *testing.T) {
	c, err := console.New(console.Config{Status: hungStatus{}, HTTPStatus: api.HTTPStatus, QueryTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/console/settlements/0x" + strings.Repeat("ab", 32), "/console/payments/order-1234567890abcdef",
		"/console/authorizations/eip155:8453/0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913/0x70997970C51812dc3A010C7d01b50e0d17dc79C8/0x" + strings.Repeat("ab", 32)} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		w := httptest.NewRecorder()
		c.ServeConsole(w, httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil), "")
		cancel()
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "Temporarily unavailable") {
			t.Errorf("%s: %d (Retry-After %q), want 503 Temporarily unavailable", path, w.Code, w.Header().Get("Retry-After"))
		}
	}
}
