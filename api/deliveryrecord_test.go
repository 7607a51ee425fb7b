package api_test

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// TestDeliveryRecord: in keys mode, the key that settled a payment records, once, the SHA-256 of
// what it served for it, and the authorization's and the transaction's status answers carry it;
// the same record again is accepted (200), a different one is 409 delivery_conflict, another
// merchant's key is 403 not_settling_key and a key without the settle scope 403 forbidden_scope;
// an unknown transaction is 404, a malformed body 400 invalid_delivery, no key 401.
func TestDeliveryRecord(t *testing.T) {
	s := newSettleStack(t, settleOptions{database: "apideliveryrecord", server: func(cfg *api.Config, s *settleStack) {
		cfg.Limits = nil
		svc := status.New(s.DB, []status.Network{{Network: s.Network, Head: s.Client}}, nil)
		cfg.Status, cfg.Receipts = svc, svc
		cfg.Deliveries = s.DB
		cfg.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: s.DB}
	}})
	settleScopes := []facilitator.Scope{facilitator.ScopeSettle, facilitator.ScopeStatus}
	keyA, _ := newKey(t, s.DB, settleScopes)
	keyB, _ := newKey(t, s.DB, settleScopes)
	reader, _ := newKey(t, s.DB, []facilitator.Scope{facilitator.ScopeStatus})

	p := fundedPayment(t)
	r := doAuth(t, http.MethodPost, s.URL+"/settle", keyA, p.body(t))
	res, _ := settlement(t, r)
	if r.Status != http.StatusOK || !res.Success {
		t.Fatalf("key A settles: %s", r)
	}
	served := []byte(`{"city":"Lisbon","forecast":"sunny"}` + "\n")
	digest := sha256.Sum256(served)
	record := map[string]any{"sha256": hexutil.Encode(digest[:]), "contentType": "application/json", "size": len(served)}
	u := s.URL + "/v1/settlements/" + res.Transaction + "/delivery"
	authPath := status.AuthorizationPath(s.Network.ID, chain.USDC.Address.Hex(), p.auth.From.Hex(), hexutil.Encode(p.auth.Nonce[:]))

	errorBody(t, doAuth(t, http.MethodPost, u, keyB, marshal(t, record)), http.StatusForbidden, facilitator.ReasonNotSettlingKey)
	errorBody(t, doAuth(t, http.MethodPost, u, reader, marshal(t, record)), http.StatusForbidden, facilitator.ReasonForbiddenScope)
	if r := doAuth(t, http.MethodPost, u, "", marshal(t, record)); r.Status != http.StatusUnauthorized {
		t.Fatalf("no key: want 401, got %s", r)
	}
	// Refused, nothing recorded.
	if st := statusOf(t, s.URL+authPath, keyA); st.Delivery != nil {
		t.Fatalf("after the refusals the status carries %+v", st.Delivery)
	}

	r = doAuth(t, http.MethodPost, u, keyA, marshal(t, record))
	var ans facilitator.DeliveryAnswer
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &ans) != nil {
		t.Fatalf("key A records its delivery: want 201, got %s", r)
	}
	if ans.Status != authPath || ans.Delivery.SHA256 != hexutil.Encode(digest[:]) || ans.Delivery.RecordedAt.IsZero() {
		t.Fatalf("the answer: %+v; want the record on %s", ans, authPath)
	}
	for _, path := range []string{authPath, "/v1/settlements/" + res.Transaction} {
		st := statusOf(t, s.URL+path, reader)
		if d := st.Delivery; d == nil || d.SHA256 != hexutil.Encode(digest[:]) || d.ContentType != "application/json" ||
			d.Size == nil || *d.Size != int64(len(served)) || !d.RecordedAt.Equal(ans.Delivery.RecordedAt) {
			t.Fatalf("%s carries %+v, want the record %+v", path, st.Delivery, ans.Delivery)
		}
	}
	// The payer, with no key, reads the same record on its public receipt: by authorization, by
	// transaction and on the receipt page's JSON.
	for _, path := range []string{authPath, "/v1/settlements/" + res.Transaction, "/r" + strings.TrimPrefix(authPath, "/v1/authorizations") + ".json"} {
		r := doAuth(t, http.MethodGet, s.URL+path, "", nil)
		var rc facilitator.Receipt
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &rc) != nil || rc.View != facilitator.ViewPublic {
			t.Fatalf("GET %s without a key: want the public view, got %s", path, r)
		}
		if d := rc.Delivery; d == nil || d.SHA256 != hexutil.Encode(digest[:]) || !d.RecordedAt.Equal(ans.Delivery.RecordedAt) {
			t.Fatalf("the public view at %s carries %+v, want the record %+v", path, rc.Delivery, ans.Delivery)
		}
	}

	// The same record again, naming the authorization this time: accepted, the one kept.
	record["authorization"] = map[string]string{"network": s.Network.ID, "asset": chain.USDC.Address.Hex(),
		"from": p.auth.From.Hex(), "nonce": hexutil.Encode(p.auth.Nonce[:])}
	r = doAuth(t, http.MethodPost, u, keyA, marshal(t, record))
	var again facilitator.DeliveryAnswer
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &again) != nil || !again.Delivery.RecordedAt.Equal(ans.Delivery.RecordedAt) {
		t.Fatalf("the same record again: want 200 with the one kept, got %s", r)
	}
	other := sha256.Sum256([]byte("another answer"))
	record["sha256"] = hexutil.Encode(other[:])
	errorBody(t, doAuth(t, http.MethodPost, u, keyA, marshal(t, record)), http.StatusConflict, facilitator.ReasonDeliveryConflict)
	if st := statusOf(t, s.URL+authPath, keyA); st.Delivery == nil || st.Delivery.SHA256 != hexutil.Encode(digest[:]) {
		t.Fatalf("after the conflict the status carries %+v, want the first record", st.Delivery)
	}

	unknown := s.URL + "/v1/settlements/0x" + hexutil.Encode(randomBytes(t, 32))[2:] + "/delivery"
	errorBody(t, doAuth(t, http.MethodPost, unknown, keyA, marshal(t, record)), http.StatusNotFound, facilitator.ReasonNotFound)
	for name, body := range map[string]string{
		"not JSON":            `sha256`,
		"a short digest":      `{"sha256":"0xabcd"}`,
		"no 0x":               `{"sha256":"` + hexutil.Encode(digest[:])[2:] + `"}`,
		"an unknown field":    `{"sha256":"` + hexutil.Encode(digest[:]) + `","sha":"x"}`,
		"a negative size":     `{"sha256":"` + hexutil.Encode(digest[:]) + `","size":-1}`,
		"not a media type":    `{"sha256":"` + hexutil.Encode(digest[:]) + `","contentType":"json"}`,
		"two objects":         `{"sha256":"` + hexutil.Encode(digest[:]) + `"} {}`,
		"a control character": `{"sha256":"` + hexutil.Encode(digest[:]) + `","contentType":"text/plain\u0000"}`,
	} {
		t.Run(name, func(t *testing.T) {
			errorBody(t, doAuth(t, http.MethodPost, u, keyA, []byte(body)), http.StatusBadRequest, facilitator.ReasonInvalidDelivery)
		})
	}
	errorBody(t, doAuth(t, http.MethodPost, s.URL+"/v1/settlements/0x12/delivery", keyA, marshal(t, record)), http.StatusBadRequest, "invalid_parameter")
}

// statusOf reads a status answer with key.
func statusOf(t *testing.T, u, key string) facilitator.AuthorizationStatus {
	t.Helper()
	r := doAuth(t, http.MethodGet, u, key, nil)
	var st facilitator.AuthorizationStatus
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &st) != nil {
		t.Fatalf("GET %s: want 200, got %s", u, r)
	}
	return st
}
