package api_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// countedLists is the ledger's lists, counting the reads that reach it.
type countedLists struct {
	*postgres.DB
	reads atomic.Int64
}

func (c *countedLists) ListSettlements(ctx context.Context, v facilitator.Viewer, f facilitator.SettlementFilter, p facilitator.Page) (facilitator.SettlementPage, error) {
	c.reads.Add(1)
	return c.DB.ListSettlements(ctx, v, f, p)
}

func (c *countedLists) WebhookDeliveries(ctx context.Context, v facilitator.Viewer, id string, p facilitator.Page) (facilitator.DeliveryPage, error) {
	c.reads.Add(1)
	return c.DB.WebhookDeliveries(ctx, v, id, p)
}

// listedNonces reads GET /v1/settlements with key, every page, and returns the listed nonces.
func listedNonces(t *testing.T, base, key string, q url.Values) []string {
	t.Helper()
	var out []string
	for pages := 0; ; pages++ {
		r := doAuth(t, http.MethodGet, base+"/v1/settlements?"+q.Encode(), key, nil)
		var body struct {
			Settlements []status.SettlementItem `json:"settlements"`
			NextCursor  *string                 `json:"next_cursor"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &body) != nil || body.Settlements == nil {
			t.Fatalf("GET /v1/settlements?%s: %s", q.Encode(), r)
		}
		for _, s := range body.Settlements {
			out = append(out, s.Nonce)
		}
		if body.NextCursor == nil || pages > 100 {
			return out
		}
		q = cloneValues(q)
		q.Set("cursor", *body.NextCursor)
	}
}

func cloneValues(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = slices.Clone(v)
	}
	return out
}

func nonceHex(p stacktest.Pay) string { return "0x" + hex.EncodeToString(p.Nonce[:]) }

// TestListsScopedByKey: on the real stack in keys mode, merchant A's and B's keys each list,
// export and read the webhook deliveries of their own settlements only, whatever filter they
// send (a payer who paid both included); an operator key sees both; a key without the status
// scope is refused; and a bad filter is an x402-shaped 400 that reads nothing.
func TestListsScopedByKey(t *testing.T) {
	db, err := postgres.Open(context.Background(), env.Ledger(t, "apilists"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	e := env.NewEngine(t, stacktest.EngineOptions{DB: db})
	lists := &countedLists{DB: db}
	s := env.NewServer(t, stacktest.ServerOptions{Engine: e, Config: func(c *api.Config, _ *stacktest.Server) {
		c.Limits, c.Lists = nil, lists
		c.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: db}
	}})
	merchant := []facilitator.Scope{facilitator.ScopeSettle, facilitator.ScopeStatus, facilitator.ScopeWebhooks}
	keyA, idA := newKey(t, db, merchant)
	keyB, idB := newKey(t, db, merchant)
	operator, _ := newKey(t, db, []facilitator.Scope{facilitator.ScopeStatus, facilitator.ScopeWebhooks, facilitator.ScopeOperator})
	settleOnly, _ := newKey(t, db, []facilitator.Scope{facilitator.ScopeSettle})

	// The ledger is the test's own, but a rerun (-count) adds to it: the operator's unfiltered
	// reads are bounded to this run's rows.
	start := time.Now().UTC().Format(time.RFC3339Nano)
	// One payer pays both merchants; another pays A only.
	both := env.FundedPayer(t, 10_000_000)
	payA1, payA2, payB := env.NewPay(t, both, 1_000_000), env.NewPay(t, env.FundedPayer(t, 1_000_000), 500_000), env.NewPay(t, both, 2_000_000)
	payB.PayTo = payA1.PayTo // the same payee even: what separates the merchants is the key
	ctx := context.Background()
	var hooks []facilitator.Webhook
	for _, owner := range []string{idA, idB} {
		w := facilitator.Webhook{ID: "wh_" + hex.EncodeToString(randomBytes(t, 16)), URL: "https://merchant.example/hook", Secret: "s", Owner: owner}
		if ok, err := db.InsertWebhook(ctx, &w, 100); err != nil || !ok {
			t.Fatalf("webhook: %v %v", ok, err)
		}
		hooks = append(hooks, w)
	}
	settled := map[string]string{} // nonce -> transaction
	for _, c := range []struct {
		key string
		pay stacktest.Pay
	}{{keyA, payA1}, {keyB, payB}, {keyA, payA2}} {
		r := doAuth(t, http.MethodPost, s.URL+"/settle", c.key, c.pay.Body(t))
		res, _ := settlement(t, r)
		if r.Status != http.StatusOK || !res.Success {
			t.Fatalf("settle: %s", r)
		}
		settled[nonceHex(c.pay)] = res.Transaction
	}
	nA1, nA2, nB := nonceHex(payA1), nonceHex(payA2), nonceHex(payB)

	payer := stacktest.AddressOf(both).Hex()
	for _, c := range []struct {
		name string
		key  string
		q    url.Values
		want []string
	}{
		{"A", keyA, url.Values{}, []string{nA2, nA1}},
		{"B", keyB, url.Values{}, []string{nB}},
		{"operator", operator, url.Values{"since": {start}}, []string{nA2, nB, nA1}},
		{"A, pages of one", keyA, url.Values{"limit": {"1"}}, []string{nA2, nA1}},
		{"A, the shared payer", keyA, url.Values{"payer": {payer}}, []string{nA1}},
		{"B, the shared payer", keyB, url.Values{"payer": {strings.ToLower(payer)}}, []string{nB}},
		{"operator, the shared payer", operator, url.Values{"payer": {payer}}, []string{nB, nA1}},
		{"B, the shared payee", keyB, url.Values{"payee": {payA1.PayTo.Hex()}}, []string{nB}},
		{"B, A's other payer", keyB, url.Values{"payer": {stacktest.AddressOf(payA2.Payer).Hex()}}, nil},
		{"A, settled", keyA, url.Values{"state": {"settled,pending"}, "network": {env.Network().ID}}, []string{nA2, nA1}},
		{"A, failed", keyA, url.Values{"state": {"failed"}}, nil},
	} {
		if got := listedNonces(t, s.URL, c.key, c.q); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}

	// The CSV: each key's own rows, newest first, under the header.
	for _, c := range []struct {
		name, key string
		want      []string
	}{{"A", keyA, []string{nA2, nA1}}, {"B", keyB, []string{nB}}, {"operator", operator, []string{nA2, nB, nA1}}} {
		r := doAuth(t, http.MethodGet, s.URL+"/v1/settlements.csv?since="+url.QueryEscape(start), c.key, nil)
		if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/csv") {
			t.Fatalf("%s's CSV: %s", c.name, r)
		}
		recs, err := csv.NewReader(bytes.NewReader(r.Body)).ReadAll()
		if err != nil || len(recs) == 0 || strings.Join(recs[0], ",") != "network,asset,payer,payee,amount,nonce,state,reason,transaction,block,created,updated" {
			t.Fatalf("%s's CSV: %v %q", c.name, err, r.Body)
		}
		var got []string
		for _, rec := range recs[1:] {
			got = append(got, rec[5])
			if rec[8] != settled[rec[5]] {
				t.Errorf("%s's CSV: transaction %s of %s, want %s", c.name, rec[8], rec[5], settled[rec[5]])
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s's CSV lists %v, want %v", c.name, got, c.want)
		}
	}

	// Webhook deliveries: each key its own webhook's; the other's is not found, as an unknown id.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := db.EnqueueWebhookEvents(ctx, notify.EventStates(), 100); err != nil {
			t.Fatal(err)
		}
		a, errA := db.WebhookDeliveries(ctx, facilitator.Viewer{All: true}, hooks[0].ID, facilitator.Page{Limit: 100})
		b, errB := db.WebhookDeliveries(ctx, facilitator.Viewer{All: true}, hooks[1].ID, facilitator.Page{Limit: 100})
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		if len(a.Items) > 0 && len(b.Items) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no deliveries owed: A %+v, B %+v", a.Items, b.Items)
		}
	}
	deliveries := func(key, id string) []string {
		t.Helper()
		r := doAuth(t, http.MethodGet, s.URL+"/v1/webhooks/"+id+"/deliveries", key, nil)
		var body struct {
			Webhook    webhookAnswer `json:"webhook"`
			Deliveries []struct {
				Nonce string `json:"nonce"`
			} `json:"deliveries"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &body) != nil || body.Webhook.ID != id || body.Webhook.Secret != "" {
			t.Fatalf("deliveries of %s: %s", id, r)
		}
		var out []string
		for _, d := range body.Deliveries {
			if !slices.Contains(out, d.Nonce) {
				out = append(out, d.Nonce)
			}
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	if got := deliveries(keyA, hooks[0].ID); !slices.Equal(got, sorted(nA1, nA2)) {
		t.Errorf("A's deliveries are of %v, want %v", got, sorted(nA1, nA2))
	}
	if got := deliveries(keyB, hooks[1].ID); !slices.Equal(got, []string{nB}) {
		t.Errorf("B's deliveries are of %v, want %v", got, []string{nB})
	}
	for _, id := range []string{hooks[0].ID, hooks[1].ID} {
		if got := deliveries(operator, id); len(got) == 0 {
			t.Errorf("the operator reads no deliveries of %s", id)
		}
	}
	errorBody(t, doAuth(t, http.MethodGet, s.URL+"/v1/webhooks/"+hooks[0].ID+"/deliveries", keyB, nil), http.StatusNotFound, "not_found")
	errorBody(t, doAuth(t, http.MethodGet, s.URL+"/v1/webhooks/"+hooks[1].ID+"/deliveries", keyA, nil), http.StatusNotFound, "not_found")

	// Refusals read nothing: a key without the status scope, no key, and every bad filter.
	cursor := status.CursorText(facilitator.Cursor{At: time.Now(), ID: 5})
	tampered := []byte(cursor)
	tampered[len(tampered)-2] ^= 1
	before := lists.reads.Load()
	for _, c := range []struct {
		name, key, path string
		status          int
		reason          string
	}{
		{"no status scope", settleOnly, "/v1/settlements", 403, facilitator.ReasonForbiddenScope},
		{"no status scope, CSV", settleOnly, "/v1/settlements.csv", 403, facilitator.ReasonForbiddenScope},
		{"no webhooks scope, deliveries", settleOnly, "/v1/webhooks/" + hooks[0].ID + "/deliveries", 403, facilitator.ReasonForbiddenScope},
		{"no key", "", "/v1/settlements", 401, facilitator.ReasonUnauthorized},
		{"unknown state", keyA, "/v1/settlements?state=done", 400, "invalid_parameter"},
		{"unknown state among good ones", keyA, "/v1/settlements?state=settled,done", 400, "invalid_parameter"},
		{"bad payer", keyA, "/v1/settlements?payer=0x1234", 400, "invalid_parameter"},
		{"bad payee", keyA, "/v1/settlements?payee=" + strings.Repeat("z", 42), 400, "invalid_parameter"},
		{"bad network", keyA, "/v1/settlements?network=base", 400, facilitator.ReasonInvalidNetwork},
		{"bad since", keyA, "/v1/settlements?since=yesterday", 400, "invalid_parameter"},
		{"bad until", keyA, "/v1/settlements?until=2026-13-01T00:00:00Z", 400, "invalid_parameter"},
		{"since after until", keyA, "/v1/settlements?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z", 400, "invalid_parameter"},
		{"limit 0", keyA, "/v1/settlements?limit=0", 400, "invalid_parameter"},
		{"limit 501", keyA, "/v1/settlements?limit=501", 400, "invalid_parameter"},
		{"limit not a number", keyA, "/v1/settlements?limit=ten", 400, "invalid_parameter"},
		{"tampered cursor", keyA, "/v1/settlements?cursor=" + string(tampered), 400, "invalid_parameter"},
		{"cursor not ours", keyA, "/v1/settlements?cursor=abc", 400, "invalid_parameter"},
		{"unknown parameter", keyA, "/v1/settlements?payto=" + payA1.PayTo.Hex(), 400, "invalid_parameter"},
		{"CSV, unknown state", keyA, "/v1/settlements.csv?state=done", 400, "invalid_parameter"},
		{"CSV, a cursor", keyA, "/v1/settlements.csv?cursor=" + cursor, 400, "invalid_parameter"},
		{"CSV, unknown parameter", keyA, "/v1/settlements.csv?format=xlsx", 400, "invalid_parameter"},
		{"deliveries, limit 501", keyA, "/v1/webhooks/" + hooks[0].ID + "/deliveries?limit=501", 400, "invalid_parameter"},
		{"deliveries, tampered cursor", keyA, "/v1/webhooks/" + hooks[0].ID + "/deliveries?cursor=" + string(tampered), 400, "invalid_parameter"},
		{"deliveries, unknown parameter", keyA, "/v1/webhooks/" + hooks[0].ID + "/deliveries?state=final", 400, "invalid_parameter"},
	} {
		r := doAuth(t, http.MethodGet, s.URL+c.path, c.key, nil)
		var body map[string]string
		if r.Status != c.status || json.Unmarshal(r.Body, &body) != nil || body["error"] != c.reason || body["message"] == "" {
			t.Errorf("%s: want %d {error: %s, message}, got %s", c.name, c.status, c.reason, r)
		}
		for _, k := range []string{keyA, keyB, operator, settleOnly} {
			if strings.Contains(string(r.Body), k) {
				t.Errorf("%s: the answer holds a key", c.name)
			}
		}
	}
	if n := lists.reads.Load() - before; n != 0 {
		t.Errorf("refused requests read the ledger %d times", n)
	}
	// The cursor itself is good: untampered, it reads.
	if r := doAuth(t, http.MethodGet, s.URL+"/v1/settlements?cursor="+cursor, keyA, nil); r.Status != http.StatusOK {
		t.Errorf("a good cursor: %s", r)
	}
}
