package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestWebhooksRedeliver: `facilitator webhooks redeliver` puts a given-up delivery back in the
// queue, due now with a fresh count of attempts, so that the dispatcher's next claim takes it;
// a delivered one, an unknown one and one of a disabled webhook are left alone and said so.
func TestWebhooksRedeliver(t *testing.T) {
	ctx, dbURL, db, conn := opsLedger(t, "opcli_redeliver")
	const network = opsNetwork
	hook := func(id string) string {
		t.Helper()
		if ok, err := db.InsertWebhook(ctx, &facilitator.Webhook{ID: id, URL: "https://merchant.example/hook", Secret: "s"}, 100); err != nil || !ok {
			t.Fatalf("insert webhook: %v %v", ok, err)
		}
		return id
	}
	live, gone := hook("wh_"+strings.Repeat("a1", 16)), hook("wh_"+strings.Repeat("b2", 16))

	// A settlement broadcast and mined after the webhooks were registered: each hears both.
	var settlement int64
	asset := common.HexToAddress("0xa5")
	if err := conn.QueryRow(ctx, `INSERT INTO settlements (network, asset, payer, auth_nonce, pay_to, value, valid_after,
			valid_before, x402_version, request, fingerprint, signer, tx_nonce, state)
		VALUES ($1, $2, $2, $3, $2, 1, 0, 99999999999, 2, '\x7b7d', $3, $2, 0, 'mined') RETURNING id`,
		network, asset[:], bytes.Repeat([]byte{7}, 32)).Scan(&settlement); err != nil {
		t.Fatal(err)
	}
	var events []int64
	for _, state := range []string{"broadcast", "mined"} {
		var id int64
		if err := conn.QueryRow(ctx, `INSERT INTO settlement_events (settlement_id, state) VALUES ($1, $2) RETURNING id`,
			settlement, state).Scan(&id); err != nil {
			t.Fatal(err)
		}
		events = append(events, id)
	}
	if _, err := db.EnqueueWebhookEvents(ctx, []string{"broadcast", "mined"}, 100); err != nil {
		t.Fatal(err)
	}
	// The first event was given up after the whole schedule (the receiver was down for a day);
	// the second was delivered. The other webhook gave up the first too, and was then deleted.
	if _, err := conn.Exec(ctx, `UPDATE webhook_deliveries SET attempts = 20, gave_up_at = now(), next_attempt_at = NULL,
			last_status = 503, last_error = 'the receiver answered HTTP 503' WHERE event_id = $1`, events[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE webhook_deliveries SET attempts = 1, delivered_at = now(), next_attempt_at = NULL,
			last_status = 200 WHERE event_id = $1`, events[1]); err != nil {
		t.Fatal(err)
	}
	if err := db.DisableWebhook(ctx, "", gone); err != nil {
		t.Fatal(err)
	}
	claim := func() []facilitator.WebhookDelivery {
		t.Helper()
		ds, err := db.ClaimWebhookDeliveries(ctx, facilitator.DeliveryClaim{Limit: 10, PerWebhook: 10, PerOwner: 10, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	if ds := claim(); len(ds) != 0 {
		t.Fatalf("before the redelivery %d deliveries are due: %+v", len(ds), ds)
	}

	cli := func(args ...string) (int, string) {
		var out, errs bytes.Buffer
		code := run(ctx, append([]string{"webhooks", "redeliver"}, args...), func(k string) string {
			return map[string]string{"DATABASE_URL": dbURL}[k]
		}, &out, &errs)
		return code, out.String() + errs.String()
	}
	ev := func(i int) string { return strconv.FormatInt(events[i], 10) }
	code, out := cli(live, ev(1), "999999")
	if code != 1 || !strings.Contains(out, "event "+ev(1)+": not given up") || !strings.Contains(out, "event 999999: no such delivery") {
		t.Errorf("a delivered and an unknown event: exit %d\n%s", code, out)
	}
	code, out = cli(gone, ev(0))
	if code != 1 || !strings.Contains(out, "is disabled") {
		t.Errorf("a disabled webhook's delivery: exit %d\n%s", code, out)
	}
	if ds := claim(); len(ds) != 0 {
		t.Fatalf("the refused redeliveries scheduled %d deliveries: %+v", len(ds), ds)
	}

	code, out = cli(live, ev(0))
	if code != 0 || !strings.Contains(out, "event "+ev(0)+": due again at ") {
		t.Fatalf("redeliver: exit %d\n%s", code, out)
	}
	ds := claim()
	if len(ds) != 1 || ds[0].WebhookID != live || ds[0].Event.ID != events[0] || ds[0].Attempt != 1 {
		t.Fatalf("after the redelivery the claim took %+v, want the live webhook's event %d on its first attempt", ds, events[0])
	}
	var givenUp bool
	if err := conn.QueryRow(ctx, `SELECT gave_up_at IS NOT NULL FROM webhook_deliveries WHERE webhook_id = $1 AND event_id = $2`,
		live, events[0]).Scan(&givenUp); err != nil || givenUp {
		t.Errorf("the redelivered delivery still reads given up (%v, %v)", givenUp, err)
	}
	// Asked again while it is being tried, it is not given up: left as it is.
	if code, out := cli(live, ev(0)); code != 1 || !strings.Contains(out, "not given up") {
		t.Errorf("redeliver again while in flight: exit %d\n%s", code, out)
	}
	if code, out := cli("wh_nope", ev(0)); code != 1 || !strings.Contains(out, "want a webhook id") {
		t.Errorf("a malformed webhook id: exit %d\n%s", code, out)
	}

	// The API: POST /v1/webhooks/{id}/deliveries/{eventId}/redeliver, under --auth keys, only for
	// the webhook's owner (or an operator key); another merchant's key learns nothing.
	keyOf := func(name, scopes string) (text, id string) {
		t.Helper()
		var out, errs bytes.Buffer
		if code := run(ctx, []string{"keys", "create", "--name", name, "--scopes", scopes}, func(k string) string {
			return map[string]string{"DATABASE_URL": dbURL}[k]
		}, &out, &errs); code != 0 {
			t.Fatalf("keys create: %s", errs.String())
		}
		m := regexp.MustCompile(`created key (\S+)`).FindStringSubmatch(out.String())
		return regexp.MustCompile(`x402_\S+`).FindString(out.String()), m[1]
	}
	owner, ownerID := keyOf("owner", "webhooks")
	other, _ := keyOf("other", "webhooks")
	owned := "wh_" + strings.Repeat("c3", 16)
	if ok, err := db.InsertWebhook(ctx, &facilitator.Webhook{ID: owned, URL: "https://merchant.example/hook", Secret: "s",
		PayTo: []common.Address{asset}, Owner: ownerID}, 100); err != nil || !ok {
		t.Fatalf("insert owned webhook: %v %v", ok, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, gave_up_at, next_attempt_at)
		VALUES ($1, $2, 20, now(), NULL)`, owned, events[1]); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Redeliver: db, Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: db}}).Handler())
	defer srv.Close()
	post := func(key, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	path := "/v1/webhooks/" + owned + "/deliveries/" + ev(1) + "/redeliver"
	if code, body := post(other, path); code != http.StatusNotFound {
		t.Errorf("another merchant's key: %d %s, want 404", code, body)
	}
	if code, body := post(owner, "/v1/webhooks/"+owned+"/deliveries/"+ev(0)+"/redeliver"); code != http.StatusNotFound {
		t.Errorf("an event the webhook was never owed: %d %s, want 404", code, body)
	}
	code, body := post(owner, path)
	if code != http.StatusAccepted || !strings.Contains(body, `"webhookId":"`+owned+`"`) || !strings.Contains(body, `"nextAttemptAt":"`) {
		t.Fatalf("the owner's key: %d %s, want 202", code, body)
	}
	if code, body := post(owner, path); code != http.StatusConflict || !strings.Contains(body, "delivery_not_given_up") {
		t.Errorf("again: %d %s, want 409 delivery_not_given_up", code, body)
	}
	if ds := claim(); len(ds) != 1 || ds[0].WebhookID != owned || ds[0].Event.ID != events[1] || ds[0].Attempt != 1 {
		t.Errorf("after the API's redelivery the claim took %+v, want %s's event %d on its first attempt", ds, owned, events[1])
	}
}
