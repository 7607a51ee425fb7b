package api_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// receiptStack is the real stack in keys mode with public receipts on (as serve wires them): the
// status service, the payment ids on the full view, the public view's own limit, and requests from
// the loopback proxy keyed on the address it forwards for.
func receiptStack(t *testing.T, public bool, limit auth.Limit) *settleStack {
	t.Helper()
	return newSettleStack(t, settleOptions{paymentIDs: true, server: func(cfg *api.Config, s *settleStack) {
		cfg.Limits = nil
		svc := status.New(s.DB, []status.Network{{Network: s.Network, Head: chain.RPC}}, nil)
		cfg.Status, cfg.PaymentIDs = svc, s.DB
		if public {
			cfg.Receipts, cfg.PublicPerClient = svc, limit
		}
		cfg.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: s.DB}
		cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	}})
}

func authorizationPath(network string, asset, from common.Address, nonce [32]byte) string {
	return "/v1/authorizations/" + network + "/" + asset.Hex() + "/" + from.Hex() + "/" + hexutil.Encode(nonce[:])
}

// TestPublicReceipts: under --auth keys, a payer with no key reads its authorization's state and
// transaction (the public view, by authorization, by transaction and on the receipt route); the
// public view carries no payment id, key id or name, or webhook; a wrong or unused nonce answers
// only the chain's word, exactly as for a nonce nobody ever saw; the merchant's key reads the full
// view with the payment ids it resolved, another merchant's key none of them, an operator's all;
// any credential at all is judged as before (a bad one is 401, never the public view); a payment
// id lookup still needs a key.
func TestPublicReceipts(t *testing.T) {
	s := receiptStack(t, true, auth.Limit{})
	merchant := []facilitator.Scope{facilitator.ScopeSettle, facilitator.ScopeStatus, facilitator.ScopeWebhooks}
	keyA, idA := newKey(t, s.DB, merchant)
	keyB, _ := newKey(t, s.DB, merchant)
	operator, _ := newKey(t, s.DB, []facilitator.Scope{facilitator.ScopeStatus, facilitator.ScopeOperator})
	hook := facilitator.Webhook{ID: "wh_" + hex.EncodeToString(randomBytes(t, 16)), URL: "https://merchant-a.example/secret-hook", Secret: "s", Owner: idA}
	if ok, err := s.DB.InsertWebhook(context.Background(), &hook, 100); err != nil || !ok {
		t.Fatalf("webhook: %v %v", ok, err)
	}

	p := newPayment(t, 1)
	payID := "order-" + hex.EncodeToString(randomBytes(t, 12))
	r := doAuth(t, http.MethodPost, s.URL+"/settle", keyA, withID(t, p, payID))
	res, _ := settlement(t, r)
	if r.Status != http.StatusOK || !res.Success {
		t.Fatalf("settle: %s", r)
	}
	// The client's retry with the same id: a replay, and still one id resolved to the receipt.
	if r := doAuth(t, http.MethodPost, s.URL+"/settle", keyA, withID(t, p, payID)); r.Status != http.StatusOK {
		t.Fatalf("the retry: %s", r)
	}

	path := authorizationPath(s.Network.ID, chain.USDC.Address, p.payer.Address, p.auth.Nonce)
	secrets := []string{payID, idA, keyA, t.Name(), hook.ID, hook.URL}
	public := func(name string, r response, want int) map[string]json.RawMessage {
		t.Helper()
		if r.Status != want {
			t.Fatalf("%s: %s, want %d", name, r, want)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &fields); err != nil {
			t.Fatalf("%s: %v: %s", name, err, r.Body)
		}
		allowed := []string{"view", "state", "network", "asset", "authorizer", "nonce", "transaction", "blockNumber", "confirmations",
			"final", "finality", "settledBy", "to", "value", "validBefore", "reason", "basis", "head", "batch", "delivery"}
		for k := range fields {
			if !slices.Contains(allowed, k) {
				t.Errorf("%s: the public view carries %q: %s", name, k, r.Body)
			}
		}
		for _, secret := range secrets {
			if strings.Contains(strings.ToLower(string(r.Body)), strings.ToLower(secret)) {
				t.Errorf("%s: the public view shows %q: %s", name, secret, r.Body)
			}
		}
		if string(fields["view"]) != `"public"` {
			t.Errorf("%s: view %s, want public", name, fields["view"])
		}
		return fields
	}

	// The payer, with no key at all.
	pub := public("by authorization", doAuth(t, http.MethodGet, s.URL+path, "", nil), http.StatusOK)
	var st facilitator.AuthorizationStatus
	if err := json.Unmarshal(mustJSON(t, pub), &st); err != nil {
		t.Fatal(err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Transaction != res.Transaction ||
		st.BlockNumber == 0 || st.To != p.auth.To.Hex() || st.Value != p.auth.Value.String() {
		t.Fatalf("the payer's public view: %+v, want settled by us with %s", st, res.Transaction)
	}
	public("by transaction", doAuth(t, http.MethodGet, s.URL+"/v1/settlements/"+res.Transaction, "", nil), http.StatusOK)
	receipt := doWith(t, http.MethodGet, s.URL+"/r/"+strings.TrimPrefix(path, "/v1/authorizations/")+".json", nil, func(http.Header) {})
	public("the receipt route", receipt, http.StatusOK)
	var rc facilitator.Receipt
	if err := json.Unmarshal(receipt.Body, &rc); err != nil || rc.Transaction != res.Transaction || rc.State != facilitator.StatusSettled {
		t.Fatalf("the receipt route: %+v %v", rc, err)
	}

	// A wrong nonce for the same payer, and a row of ours whose transaction never left us: each
	// answers what an unused nonce does, the chain's word, 404, and nothing of ours.
	var wrong [32]byte
	copy(wrong[:], randomBytes(t, 32))
	unsent := unsentRow(t, s)
	answers := map[string]facilitator.Receipt{}
	for name, path := range map[string]string{
		"wrong nonce": authorizationPath(s.Network.ID, chain.USDC.Address, p.payer.Address, wrong),
		"unsent row":  authorizationPath(s.Network.ID, unsent.Asset, unsent.Payer, unsent.Nonce),
	} {
		fields := public(name, doAuth(t, http.MethodGet, s.URL+path, "", nil), http.StatusNotFound)
		var a facilitator.Receipt
		if err := json.Unmarshal(mustJSON(t, fields), &a); err != nil {
			t.Fatal(err)
		}
		if a.State != facilitator.StatusUnused || a.Basis != "chain" || a.Transaction != "" || a.To != "" || a.Value != "" || a.ValidBefore != "" {
			t.Errorf("%s: %+v, want only the chain's unused", name, a)
		}
		a.Authorizer, a.Nonce, a.Head = "", "", 0
		answers[name] = a
	}
	if w, u := mustJSON(t, answers["wrong nonce"]), mustJSON(t, answers["unsent row"]); string(w) != string(u) {
		t.Errorf("an unsent row answers %s, an unused nonce %s: the public view tells them apart", u, w)
	}

	// The merchants' full views: A's ids to A, none of them to B, all to the operator.
	for _, c := range []struct {
		name, key string
		want      []string
	}{{"A", keyA, []string{payID}}, {"B", keyB, nil}, {"operator", operator, []string{payID}}} {
		r := doAuth(t, http.MethodGet, s.URL+path, c.key, nil)
		var full facilitator.AuthorizationStatus
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &full) != nil || full.View != "" || full.IndexedHead == 0 && full.Head == 0 {
			t.Fatalf("%s's full view: %s", c.name, r)
		}
		if !slices.Equal(full.PaymentIDs, c.want) {
			t.Errorf("%s's full view lists payment ids %v, want %v", c.name, full.PaymentIDs, c.want)
		}
	}
	r = doAuth(t, http.MethodGet, s.URL+"/v1/payments/"+payID, keyA, nil)
	var byID facilitator.AuthorizationStatus
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &byID) != nil || byID.PaymentID != payID || !slices.Equal(byID.PaymentIDs, []string{payID}) {
		t.Fatalf("from the retry id to its receipt: %s", r)
	}

	// Any credential is judged: a bad key is 401, not the public view; a payment id needs a key.
	for name, set := range map[string]func(http.Header){
		"bad bearer":    func(h http.Header) { h.Set("Authorization", "Bearer x402_nope") },
		"basic":         func(h http.Header) { h.Set("Authorization", "Basic dXNlcjpwYXNz") },
		"bad X-API-Key": func(h http.Header) { h.Set("X-API-Key", "x402_nope") },
	} {
		if r := doWith(t, http.MethodGet, s.URL+path, nil, set); r.Status != http.StatusUnauthorized {
			t.Errorf("%s: %s, want 401", name, r)
		}
	}
	if r := doAuth(t, http.MethodGet, s.URL+"/v1/payments/"+payID, "", nil); r.Status != http.StatusUnauthorized {
		t.Errorf("a payment id without a key: %s, want 401", r)
	}
}

// TestPublicReceiptsOffAndLimited: with --public-receipts=false a status lookup without a key is
// 401 as before and there is no receipt route; with them on, the public lookups (by authorization
// and the receipt route alike) are limited per client address, the address a trusted proxy
// forwarded for, each its own bucket.
func TestPublicReceiptsOffAndLimited(t *testing.T) {
	off := receiptStack(t, false, auth.Limit{})
	p := newPayment(t, 1)
	path := authorizationPath(off.Network.ID, chain.USDC.Address, p.payer.Address, p.auth.Nonce)
	if r := doAuth(t, http.MethodGet, off.URL+path, "", nil); r.Status != http.StatusUnauthorized {
		t.Fatalf("public receipts off: %s, want 401", r)
	}
	if r := doAuth(t, http.MethodGet, off.URL+"/r/"+strings.TrimPrefix(path, "/v1/authorizations/")+".json", "", nil); r.Status != http.StatusNotFound {
		t.Fatalf("public receipts off, the receipt route: %s, want 404", r)
	}

	on := receiptStack(t, true, auth.Limit{Rate: 0.001, Burst: 2})
	from := func(client string) func(http.Header) {
		return func(h http.Header) { h.Set("X-Forwarded-For", client) }
	}
	receiptPath := "/r/" + strings.TrimPrefix(path, "/v1/authorizations/") + ".json"
	for i, c := range []struct {
		path, client string
		want         int
	}{
		{path, "198.51.100.1", http.StatusNotFound}, // unused: the chain's word
		{receiptPath, "198.51.100.1", http.StatusNotFound},
		{path, "198.51.100.1", http.StatusTooManyRequests},
		{receiptPath, "198.51.100.1", http.StatusTooManyRequests},
		{path, "198.51.100.2", http.StatusNotFound},
	} {
		r := doWith(t, http.MethodGet, on.URL+c.path, nil, from(c.client))
		if r.Status != c.want {
			t.Fatalf("request %d from %s: %s, want %d", i, c.client, r, c.want)
		}
		if r.Status == http.StatusTooManyRequests && r.Header.Get("Retry-After") == "" {
			t.Errorf("request %d: 429 without Retry-After", i)
		}
	}
}

// unsentRow writes a settlement row as the engine does before a broadcast, for a fresh
// authorization, and sends nothing: a payment someone asked us to settle that never left us.
func unsentRow(t *testing.T, s *settleStack) facilitator.AuthorizationKey {
	t.Helper()
	p := newPayment(t, 1)
	key := facilitator.AuthorizationKey{Network: s.Network.ID, Asset: chain.USDC.Address, Payer: p.payer.Address, Nonce: p.auth.Nonce}
	var fp facilitator.Fingerprint
	copy(fp[:], randomBytes(t, 32))
	n := &facilitator.NewSettlement{Key: key, Fingerprint: fp, PayTo: p.auth.To, Value: p.auth.Value, ValidAfter: big.NewInt(0),
		ValidBefore: p.auth.ValidBefore, X402Version: 2, Request: []byte("{}"), Signer: common.BytesToAddress(randomBytes(t, 20)),
		Tx: facilitator.TxRecord{Hash: common.BytesToHash(randomBytes(t, 32)), Raw: []byte{0x01}, TipCap: big.NewInt(1), FeeCap: big.NewInt(2)}}
	if _, err := s.DB.InsertSettlement(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	return key
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
