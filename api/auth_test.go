package api_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// authStack is the real verify + settle stack (payment identifiers included) behind keys mode,
// with keys stored in the package's ledger.
type authStack struct {
	settleStack
}

func newAuthStack(t *testing.T) *authStack {
	t.Helper()
	return newAuthStackWith(t, settleOptions{})
}

// newAuthStackWith is newAuthStack with o's deadline and database.
func newAuthStackWith(t *testing.T, o settleOptions) *authStack {
	t.Helper()
	o.paymentIDs = true
	o.server = func(cfg *api.Config, s *settleStack) {
		cfg.Limits = nil
		cfg.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: s.DB}
	}
	return &authStack{*newSettleStack(t, o)}
}

// newKey stores a fresh key and returns its text and id.
func newKey(t *testing.T, db *postgres.DB, scopes []facilitator.Scope, payTo ...common.Address) (string, string) {
	t.Helper()
	full, id, hash, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := db.InsertAPIKey(context.Background(), &facilitator.APIKey{ID: id, Hash: hash, Name: t.Name(), Scopes: scopes, PayTo: payTo}); err != nil {
		t.Fatal(err)
	}
	return full, id
}

// doAuth is do with key as the bearer ("" for none); it says the body is JSON even when there is
// none.
func doAuth(tb testing.TB, method, u, key string, body []byte) response {
	tb.Helper()
	return doWith(tb, method, u, body, func(h http.Header) {
		h.Set("Content-Type", "application/json")
		if key != "" {
			h.Set("Authorization", "Bearer "+key)
		}
	})
}

func withID(tb testing.TB, p payment, id string) []byte {
	m := p.request(tb)
	set(m, "paymentPayload.extensions", map[string]any{facilitator.PaymentIdentifierKey: map[string]any{"info": map[string]any{"id": id}}})
	return marshal(tb, m)
}

// TestAuthRefusals: no key, a malformed or unknown key, a revoked key, a wrong scope and a payTo
// outside the key's allow-list are refused with x402-shaped bodies, and nothing is broadcast.
func TestAuthRefusals(t *testing.T) {
	s := newAuthStack(t)
	ctx := context.Background()
	all := []facilitator.Scope{facilitator.ScopeVerify, facilitator.ScopeSettle}
	revoked, revokedID := newKey(t, s.DB, all)
	if _, err := s.DB.RevokeAPIKey(ctx, revokedID, time.Now()); err != nil {
		t.Fatal(err)
	}
	verifyOnly, _ := newKey(t, s.DB, []facilitator.Scope{facilitator.ScopeVerify})
	elsewhere, _ := newKey(t, s.DB, all, common.HexToAddress("0x00000000000000000000000000000000000000bb"))
	good, goodID := newKey(t, s.DB, all)
	forged := good[:len(good)-1] + map[bool]string{true: "1", false: "0"}[good[len(good)-1] == '0']

	p := fundedPayment(t)
	body := p.body(t)
	before := s.nonces(t)
	cases := []struct {
		name   string
		key    string
		status int
		reason string
	}{
		{"no key", "", 401, facilitator.ReasonUnauthorized},
		{"malformed key", "not-a-key", 401, facilitator.ReasonUnauthorized},
		{"forged secret", forged, 401, facilitator.ReasonUnauthorized},
		{"unknown key", "x402_000000000000_" + good[len(good)-64:], 401, facilitator.ReasonUnauthorized},
		{"revoked key", revoked, 401, facilitator.ReasonUnauthorized},
		{"wrong scope", verifyOnly, 403, facilitator.ReasonForbiddenScope},
		{"payTo outside the allow-list", elsewhere, 403, facilitator.ReasonPayToNotAllowed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := doAuth(t, http.MethodPost, s.URL+"/settle", tc.key, body)
			if r.Status != tc.status {
				t.Fatalf("want %d, got %s", tc.status, r)
			}
			res, _ := settlement(t, r)
			if res.Success || res.ErrorReason != tc.reason || res.Transaction != "" {
				t.Fatalf("want success:false %s, got %s", tc.reason, r)
			}
			if tc.reason == facilitator.ReasonPayToNotAllowed && res.Network != facilitator.CAIP2(chain.ChainID) {
				t.Fatalf("network %q missing from the refusal", res.Network)
			}
			if tc.status != 403 || tc.reason == facilitator.ReasonPayToNotAllowed {
				vr := doAuth(t, http.MethodPost, s.URL+"/verify", tc.key, body)
				v, _ := verdict(t, vr)
				if vr.Status != tc.status || v.IsValid || v.InvalidReason != tc.reason {
					t.Fatalf("/verify: want %d isValid:false %s, got %s", tc.status, tc.reason, vr)
				}
			}
		})
	}
	if after := s.nonces(t); after != before {
		t.Fatalf("signer nonces %v -> %v: a refused request was broadcast", before, after)
	}
	if _, err := s.DB.SettlementByKey(ctx, facilitator.AuthorizationKey{Network: facilitator.CAIP2(chain.ChainID), Asset: chain.USDC.Address, Payer: p.auth.From, Nonce: p.auth.Nonce}); err == nil {
		t.Fatal("a refused request left a settlement row")
	}

	// The good key, and one whose allow-list holds the payee, settle it.
	r := doAuth(t, http.MethodPost, s.URL+"/settle", good, body)
	if res, _ := settlement(t, r); r.Status != 200 || !res.Success {
		t.Fatalf("good key (%s): want a success, got %s", goodID, r)
	}
	p2 := fundedPayment(t)
	listed, _ := newKey(t, s.DB, all, p2.auth.To)
	r = doAuth(t, http.MethodPost, s.URL+"/settle", listed, p2.body(t))
	if res, _ := settlement(t, r); r.Status != 200 || !res.Success {
		t.Fatalf("allow-listed payTo: want a success, got %s", r)
	}
	// Open routes stay open.
	for _, path := range []string{"/supported", "/healthz", "/openapi.json"} {
		if r := doAuth(t, http.MethodGet, s.URL+path, "", nil); r.Status != 200 {
			t.Fatalf("%s without a key: %s", path, r)
		}
		if r := doAuth(t, http.MethodGet, s.URL+path, good, nil); r.Status != 200 {
			t.Fatalf("%s with a key: %s", path, r)
		}
	}
}

// TestAuthPaymentIDScoped: one payment id under two keys names two payments; under one key it is
// bound to its first request.
func TestAuthPaymentIDScoped(t *testing.T) {
	s := newAuthStack(t)
	all := []facilitator.Scope{facilitator.ScopeVerify, facilitator.ScopeSettle}
	a, _ := newKey(t, s.DB, all)
	b, _ := newKey(t, s.DB, all)
	id := "scoped_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	p1, p2 := fundedPayment(t), fundedPayment(t)

	r := doAuth(t, http.MethodPost, s.URL+"/settle", a, withID(t, p1, id))
	res1, _ := settlement(t, r)
	if r.Status != 200 || !res1.Success {
		t.Fatalf("key A: want a success, got %s", r)
	}
	r = doAuth(t, http.MethodPost, s.URL+"/settle", b, withID(t, p2, id))
	res2, _ := settlement(t, r)
	if r.Status != 200 || !res2.Success || res2.Transaction == res1.Transaction {
		t.Fatalf("key B, same id, another payment: want its own success, got %s", r)
	}
	// Under key A the id is still p1's: another payment under it is a conflict, p1 again a replay.
	p3 := fundedPayment(t)
	if r := doAuth(t, http.MethodPost, s.URL+"/settle", a, withID(t, p3, id)); r.Status != http.StatusConflict {
		t.Fatalf("key A, same id, another payment: want 409, got %s", r)
	}
	r = doAuth(t, http.MethodPost, s.URL+"/settle", a, withID(t, p1, id))
	if res, _ := settlement(t, r); r.Status != 200 || res.Transaction != res1.Transaction || r.Header.Get(facilitator.ReplayHeader) != "true" {
		t.Fatalf("key A replay: want %s replayed, got %s", res1.Transaction, r)
	}
}

// TestAuthSuccessBelongsToKey: two merchant keys send the same payload (anyone can rebuild it
// from the public calldata). Only the key that created the settlement is told success: the other
// key, racing the creator's retry after settlement_pending, gets already_settled with the same
// hash, and the creator's retry still gets the success.
func TestAuthSuccessBelongsToKey(t *testing.T) {
	// Skip before touching the chain, and mint while anvil still mines.
	ledger(t)
	p := fundedPayment(t)
	body := p.body(t)
	stacktest.ManualMining(t, chain)
	s := newAuthStackWith(t, settleOptions{deadline: time.Second}) // registered after: stops first
	all := []facilitator.Scope{facilitator.ScopeVerify, facilitator.ScopeSettle}
	a, _ := newKey(t, s.DB, all)
	b, _ := newKey(t, s.DB, all)

	r := doAuth(t, http.MethodPost, s.URL+"/settle", a, body)
	first, _ := settlement(t, r)
	if r.Status != http.StatusOK || first.ErrorReason != facilitator.ReasonSettlementPending || !txHashRE.MatchString(first.Transaction) {
		t.Fatalf("key A: want settlement_pending with a hash, got %s", r)
	}
	if err := chain.Mine(context.Background()); err != nil {
		t.Fatal(err)
	}
	r = doAuth(t, http.MethodPost, s.URL+"/settle", b, body)
	if res, _ := settlement(t, r); r.Status != http.StatusOK || res.Success || res.ErrorReason != facilitator.ReasonAlreadySettled ||
		res.Transaction != first.Transaction {
		t.Fatalf("key B, same payload: want already_settled with %s, got %s", first.Transaction, r)
	}
	r = doAuth(t, http.MethodPost, s.URL+"/settle", a, body)
	if res, _ := settlement(t, r); r.Status != http.StatusOK || !res.Success || res.Transaction != first.Transaction {
		t.Fatalf("key A's retry: want its success with %s, got %s", first.Transaction, r)
	}
	r = doAuth(t, http.MethodPost, s.URL+"/settle", b, body)
	if res, _ := settlement(t, r); res.Success || res.ErrorReason != facilitator.ReasonAlreadySettled {
		t.Fatalf("key B after the success: want already_settled, got %s", r)
	}
	if got := usdcOf(t, p.auth.To); got != p.auth.Value.Int64() {
		t.Fatalf("payee holds %d, want %s once", got, p.auth.Value)
	}
}

// stubVerifier answers every /verify valid and counts the calls.
type stubVerifier struct{ calls atomic.Int64 }

func (v *stubVerifier) Verify(_ context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error) {
	v.calls.Add(1)
	return facilitator.VerifyResponse{IsValid: true, Payer: p.Payer}, nil
}

// memKeys is an in-memory auth.Store.
type memKeys struct {
	mu   sync.Mutex
	keys map[string]*facilitator.APIKey
}

func (m *memKeys) APIKey(_ context.Context, id string) (*facilitator.APIKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.keys[id]; ok {
		return k, nil
	}
	return nil, facilitator.ErrNotFound
}

func (m *memKeys) add(t *testing.T, scopes ...facilitator.Scope) string {
	full, id, hash, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keys[id] = &facilitator.APIKey{ID: id, Hash: hash, Scopes: scopes}
	return full
}

// TestAuthRateLimit: past its burst, a key gets 429 with Retry-After and a VerifyResponse body, and
// the verifier is not called; all keys from one address share the address's limit.
func TestAuthRateLimit(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	v := &stubVerifier{}
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	srv := api.New(api.Config{Verifier: v, Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: keys,
		PerKey: auth.Limit{Rate: 0.5, Burst: 2}, PerClient: auth.Limit{Rate: 1, Burst: 5}, Now: clock}})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	body := newPayment(t, 1).body(t)
	k1 := keys.add(t, facilitator.ScopeVerify)
	for i := 0; i < 2; i++ {
		if r := doAuth(t, http.MethodPost, hs.URL+"/verify", k1, body); r.Status != 200 {
			t.Fatalf("request %d: %s", i, r)
		}
	}
	r := doAuth(t, http.MethodPost, hs.URL+"/verify", k1, body)
	res, _ := verdict(t, r)
	if r.Status != http.StatusTooManyRequests || res.IsValid || res.InvalidReason != facilitator.ReasonRateLimited || r.Header.Get("Retry-After") != "2" {
		t.Fatalf("third request with the key: want 429 rate_limited with Retry-After 2, got %s (Retry-After %q)", r, r.Header.Get("Retry-After"))
	}
	if v.calls.Load() != 2 {
		t.Fatalf("the verifier ran %d times, want 2", v.calls.Load())
	}
	// Another key from the same address has its own bucket, until the address's runs out (5).
	k2 := keys.add(t, facilitator.ScopeVerify)
	for i := 0; i < 2; i++ {
		if r := doAuth(t, http.MethodPost, hs.URL+"/verify", k2, body); r.Status != 200 {
			t.Fatalf("key 2 request %d: %s", i, r)
		}
	}
	r = doAuth(t, http.MethodPost, hs.URL+"/verify", keys.add(t, facilitator.ScopeVerify), body)
	if r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("sixth request from the address: want 429 with Retry-After 1, got %s", r)
	}
	// Time refills the buckets.
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	if r := doAuth(t, http.MethodPost, hs.URL+"/verify", k1, body); r.Status != 200 {
		t.Fatalf("after the refill: %s", r)
	}
}

// TestAuthOpenMode: open mode lets requests through without a key, and ids stay in the global scope.
func TestAuthOpenMode(t *testing.T) {
	v := &stubVerifier{}
	srv := api.New(api.Config{Verifier: v, Auth: &api.AuthConfig{Mode: api.AuthOpen}})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	if r := doAuth(t, http.MethodPost, hs.URL+"/verify", "", newPayment(t, 1).body(t)); r.Status != 200 {
		t.Fatalf("open mode without a key: %s", r)
	}
	if v.calls.Load() != 1 {
		t.Fatalf("verifier calls %d, want 1", v.calls.Load())
	}
}

// TestAuthOtherRoutes: status and webhook routes need their scopes and answer {"error","message"}.
func TestAuthOtherRoutes(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	srv := api.New(api.Config{Verifier: &stubVerifier{}, Status: &scopeStatus{}, Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: keys}})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	u := hs.URL + "/v1/payments/abcdefghijklmnopq"
	for _, tc := range []struct {
		key    string
		status int
		reason string
	}{{"", 401, facilitator.ReasonUnauthorized}, {keys.add(t, facilitator.ScopeVerify), 403, facilitator.ReasonForbiddenScope}} {
		r := doAuth(t, http.MethodGet, u, tc.key, nil)
		var body map[string]string
		if err := json.Unmarshal(r.Body, &body); err != nil || r.Status != tc.status || body["error"] != tc.reason {
			t.Fatalf("want %d %s, got %s", tc.status, tc.reason, r)
		}
	}
	full := keys.add(t, facilitator.ScopeStatus)
	if r := doAuth(t, http.MethodGet, u, full, nil); r.Status != 200 {
		t.Fatalf("status key refused: %s", r)
	}
	id, _ := auth.ParseID(full)
	var got facilitator.AuthorizationStatus
	if r := doAuth(t, http.MethodGet, u, full, nil); json.Unmarshal(r.Body, &got) != nil || got.PaymentID != id+"/abcdefghijklmnopq" {
		t.Fatalf("payment status looked up in scope %q, want the key's (%s)", got.PaymentID, r)
	}
}

// scopeStatus answers payment lookups with "scope/id" as the payment id.
type scopeStatus struct{}

func (scopeStatus) Authorization(context.Context, facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	return facilitator.AuthorizationStatus{}, false, nil
}

func (scopeStatus) Payment(_ context.Context, scope, id string) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{State: facilitator.StatusPending, PaymentID: scope + "/" + id}, nil
}

func (scopeStatus) Settlement(context.Context, common.Hash) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
}

// hookReceiver is a merchant's webhook endpoint: it answers 200 and hands over each message.
type hookReceiver struct {
	URL  string
	msgs chan notify.Message
}

func newHookReceiver(t *testing.T) *hookReceiver {
	t.Helper()
	r := &hookReceiver{msgs: make(chan notify.Message, 100)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var m notify.Message
		if err := json.NewDecoder(req.Body).Decode(&m); err == nil {
			select {
			case r.msgs <- m:
			default:
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL + "/hooks"
	return r
}

// await returns the first message of type typ for the settlement of tx, failing after 30s.
func (r *hookReceiver) await(t *testing.T, typ, tx string) notify.Message {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m := <-r.msgs:
			if m.Type == typ && m.Data.Transaction == tx {
				return m
			}
		case <-timeout:
			t.Fatalf("no %s for %s within 30s", typ, tx)
		}
	}
}

// TestAuthWebhooksOwned: in keys mode a webhook belongs to the key that registered it. Another
// key neither lists nor deletes it (404, like an unknown id), nor registers one for a payee
// outside its allow-list or without a payTo filter (403 pay_to_not_allowed); the owner still
// receives its settlements' events, with its own payment id, and the other key's webhook none.
func TestAuthWebhooksOwned(t *testing.T) {
	s := newSettleStack(t, settleOptions{database: "apihooks", paymentIDs: true, server: func(cfg *api.Config, s *settleStack) {
		stat := status.New(s.DB, []status.Network{{Network: s.Network, Head: s.Client}}, nil)
		d := notify.New(notify.Config{Store: s.DB, Status: stat, PollInterval: 50 * time.Millisecond,
			MaxWebhooks: 2, AllowPrivateTargets: true, Logger: s.Logger})
		if err := d.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Stop)
		cfg.Limits, cfg.Status, cfg.Notify = nil, stat, d
		cfg.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: s.DB}
	}})
	ctx := context.Background()
	p := fundedPayment(t)
	shopA, shopB := p.auth.To, common.BytesToAddress(randomBytes(t, 20))
	hooks := []facilitator.Scope{facilitator.ScopeWebhooks}
	keyA, _ := newKey(t, s.DB, []facilitator.Scope{facilitator.ScopeSettle, facilitator.ScopeWebhooks}, shopA)
	keyB, _ := newKey(t, s.DB, hooks, shopB)
	keyC, _ := newKey(t, s.DB, hooks) // no allow-list
	recA, recB := newHookReceiver(t), newHookReceiver(t)
	u := s.URL + "/v1/webhooks"
	register := func(key, url string, payTo ...common.Address) response {
		t.Helper()
		list := []string{}
		for _, a := range payTo {
			list = append(list, a.Hex())
		}
		return doAuth(t, http.MethodPost, u, key, marshal(t, map[string]any{"url": url, "payTo": list}))
	}
	listed := func(key string) []string {
		t.Helper()
		r := doAuth(t, http.MethodGet, u, key, nil)
		var body struct {
			Webhooks []webhookAnswer `json:"webhooks"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &body) != nil || body.Webhooks == nil {
			t.Fatalf("list: want 200 {webhooks: [...]}, got %s", r)
		}
		var out []string
		for _, w := range body.Webhooks {
			out = append(out, w.ID)
		}
		return out
	}

	r := register(keyA, recA.URL, shopA)
	var whA webhookAnswer
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &whA) != nil {
		t.Fatalf("key A registers for its payee: want 201, got %s", r)
	}
	// A webhook from open mode (no owner) is no key's.
	open := facilitator.Webhook{ID: "wh_" + hex.EncodeToString(randomBytes(t, 16)), URL: "https://merchant.example/open",
		Secret: "s", PayTo: []common.Address{common.BytesToAddress(randomBytes(t, 20))}}
	if ok, err := s.DB.InsertWebhook(ctx, &open, 100); err != nil || !ok {
		t.Fatalf("inserting an ownerless webhook: %v %v", ok, err)
	}
	t.Cleanup(func() { _ = s.DB.DisableWebhook(ctx, "", open.ID) })

	if got := listed(keyA); len(got) != 1 || got[0] != whA.ID {
		t.Fatalf("key A lists %v, want only its %s", got, whA.ID)
	}
	if got := listed(keyB); len(got) != 0 {
		t.Fatalf("key B lists %v, want none of key A's or open mode's", got)
	}
	for _, id := range []string{whA.ID, open.ID} {
		errorBody(t, doAuth(t, http.MethodDelete, u+"/"+id, keyB, nil), http.StatusNotFound, "not_found")
	}
	errorBody(t, doAuth(t, http.MethodDelete, u+"/"+open.ID, keyA, nil), http.StatusNotFound, "not_found")
	if got := listed(keyA); len(got) != 1 || got[0] != whA.ID {
		t.Fatalf("after key B's deletes, key A lists %v, want %s", got, whA.ID)
	}

	// Registering for a payee outside the allow-list, for one inside and one outside, or for every
	// settlement, is refused, and nothing is stored.
	for name, tc := range map[string]struct {
		key   string
		payTo []common.Address
	}{
		"B for A's payee":       {keyB, []common.Address{shopA}},
		"B for both payees":     {keyB, []common.Address{shopB, shopA}},
		"B for every payee":     {keyB, nil},
		"C (any payTo) for all": {keyC, nil},
	} {
		errorBody(t, register(tc.key, recB.URL, tc.payTo...), http.StatusForbidden, facilitator.ReasonPayToNotAllowed)
		if got := listed(tc.key); len(got) != 0 {
			t.Fatalf("%s: refused, yet %v listed", name, got)
		}
	}
	r = register(keyB, recB.URL, shopB)
	var whB webhookAnswer
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &whB) != nil {
		t.Fatalf("key B registers for its own payee: want 201, got %s", r)
	}
	// The limit (2 here) is per key: key A filling its own does not stop key B.
	if r := register(keyA, recA.URL+"/2", shopA); r.Status != http.StatusCreated {
		t.Fatalf("key A's second webhook: %s", r)
	}
	errorBody(t, register(keyA, recA.URL+"/3", shopA), http.StatusConflict, notify.ReasonWebhookLimitReached)
	if r := register(keyB, recB.URL+"/2", shopB); r.Status != http.StatusCreated {
		t.Fatalf("key B's second webhook, key A's limit reached: %s", r)
	}

	// A key without an allow-list may name any payee, but naming key A's payee does not make key
	// A's settlements its own: key C hears nothing of them.
	recC := newHookReceiver(t)
	r = register(keyC, recC.URL, shopA)
	var whC webhookAnswer
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &whC) != nil {
		t.Fatalf("key C registers for a named payee: want 201, got %s", r)
	}

	// Key A's settlement reaches key A's webhook, with its payment id, and not key B's.
	pid := "owned_" + hex.EncodeToString(randomBytes(t, 8))
	r = doAuth(t, http.MethodPost, s.URL+"/settle", keyA, withID(t, p, pid))
	res, _ := settlement(t, r)
	if r.Status != http.StatusOK || !res.Success {
		t.Fatalf("key A settles: %s", r)
	}
	if m := recA.await(t, "settlement.final", res.Transaction); m.Data.PaymentID != pid {
		t.Fatalf("key A's webhook got payment id %q, want %q", m.Data.PaymentID, pid)
	}
	select {
	case m := <-recB.msgs:
		t.Fatalf("key B's webhook heard key A's settlement: %+v", m)
	default:
	}
	// Key C's webhook has been carried past key A's events (its cursor moved over them in the
	// same statement that queued key A's deliveries) without a delivery being queued for it.
	pool, err := pgxpool.New(ctx, env.Ledger(t, "apihooks"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var passed bool
	var queued int
	if err := pool.QueryRow(ctx, `SELECT w.cursor_event_id >= (SELECT max(e.id) FROM settlement_events e
			JOIN settlements st ON st.id = e.settlement_id WHERE st.tx_hash = decode($2, 'hex')),
			(SELECT count(*) FROM webhook_deliveries d WHERE d.webhook_id = w.id)
		FROM webhooks w WHERE w.id = $1`, whC.ID, strings.TrimPrefix(res.Transaction, "0x")).Scan(&passed, &queued); err != nil {
		t.Fatal(err)
	}
	if !passed || queued != 0 {
		t.Fatalf("key C's webhook: cursor past key A's events %v, deliveries queued %d; want true and 0", passed, queued)
	}
	select {
	case m := <-recC.msgs:
		t.Fatalf("key C's webhook heard key A's settlement: %+v", m)
	default:
	}

	// The payment's event stream is found under the key that sent the id, as /v1/payments is;
	// another key asking for the same id finds nothing.
	streamStatus := func(key string) (int, string) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		res := sendKeyed(sctx, t, s.URL+"/v1/events/payments/"+pid, key)
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return res.StatusCode, ""
		}
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "data:") {
				return res.StatusCode, line
			}
		}
		return res.StatusCode, ""
	}
	if code, first := streamStatus(keyA); code != http.StatusOK || !strings.Contains(first, res.Transaction) {
		t.Fatalf("key A's payment stream: %d, first event %q; want 200 and the settlement's events", code, first)
	}
	if code, _ := streamStatus(keyB); code != http.StatusNotFound {
		t.Fatalf("key B asking for key A's payment stream: %d, want 404", code)
	}

	// The owner deletes its webhook; then it is gone for it too.
	if r := doAuth(t, http.MethodDelete, u+"/"+whA.ID, keyA, nil); r.Status != http.StatusNoContent {
		t.Fatalf("key A deletes its webhook: want 204, got %s", r)
	}
	if got := listed(keyA); slices.Contains(got, whA.ID) || len(got) != 1 {
		t.Fatalf("after the delete, key A lists %v", got)
	}
	if r := doAuth(t, http.MethodDelete, u+"/"+whB.ID, keyB, nil); r.Status != http.StatusNoContent {
		t.Fatalf("key B deletes its webhook: want 204, got %s", r)
	}
}

// downKeys is a key store that cannot answer.
type downKeys struct{}

func (downKeys) APIKey(context.Context, string) (*facilitator.APIKey, error) {
	return nil, errors.New("connection refused")
}

// TestAuthChallengeAndKeyStoreDown pins the headers and bodies of the refusals no other test
// reads whole: a 401 challenges (invalid_token when a key was sent), and a key store that cannot
// answer is a 503 with Retry-After, in the route's shape, that never says why.
func TestAuthChallengeAndKeyStoreDown(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	serve := func(store auth.Store) string {
		srv := api.New(api.Config{Verifier: &stubVerifier{}, Status: &scopeStatus{}, Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: store}})
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(hs.Close)
		return hs.URL
	}
	up, down := serve(keys), serve(downKeys{})
	p := newPayment(t, 1)
	payer := p.auth.From.Hex()
	status := "/v1/payments/abcdefghijklmnopq"
	for _, tc := range []struct {
		name, url, path, key string
		body                 []byte
		status               int
		challenge, retry     string
		want                 string
	}{
		{"no key", up, status, "", nil, 401, `Bearer realm="x402-facilitator"`, "",
			`{"error":"unauthorized","message":"an API key is required (Authorization: Bearer \u003ckey\u003e)"}`},
		{"invalid key", up, status, "not-a-key", nil, 401, `Bearer realm="x402-facilitator", error="invalid_token"`, "",
			`{"error":"unauthorized","message":"the API key is invalid or revoked"}`},
		{"invalid key on /verify", up, "/verify", "not-a-key", p.body(t), 401, `Bearer realm="x402-facilitator", error="invalid_token"`, "",
			`{"isValid":false,"invalidReason":"unauthorized","invalidMessage":"the API key is invalid or revoked","payer":"` + payer + `"}`},
		{"store down", down, status, keys.add(t, facilitator.ScopeStatus), nil, 503, "", "1",
			`{"error":"unavailable","message":"checking the API key failed; retry later"}`},
		{"store down on /verify", down, "/verify", keys.add(t, facilitator.ScopeVerify), p.body(t), 503, "", "1",
			`{"isValid":false,"invalidReason":"unexpected_verify_error","invalidMessage":"checking the API key failed; retry later","payer":"` + payer + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := http.MethodGet
			if tc.body != nil {
				method = http.MethodPost
			}
			r := doAuth(t, method, tc.url+tc.path, tc.key, tc.body)
			if r.Status != tc.status || strings.TrimSpace(string(r.Body)) != tc.want {
				t.Fatalf("want %d %s, got %s", tc.status, tc.want, r)
			}
			if got := r.Header.Get("WWW-Authenticate"); got != tc.challenge {
				t.Fatalf("WWW-Authenticate %q, want %q", got, tc.challenge)
			}
			if got := r.Header.Get("Retry-After"); got != tc.retry {
				t.Fatalf("Retry-After %q, want %q", got, tc.retry)
			}
		})
	}
}
