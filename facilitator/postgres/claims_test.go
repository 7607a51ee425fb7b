package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// claimFixture is a database of the test's own (a claim takes every enabled webhook's due
// deliveries) with owner C's ten webhooks owing ten deliveries each, all an hour overdue, and
// owner A's one webhook owing one delivery due now.
type claimFixture struct {
	db      *postgres.DB
	conn    *pgx.Conn
	ctx     context.Context
	a       string   // A's webhook
	c       []string // C's webhooks
	aEvent  int64
	whOwner map[string]string // by webhook
}

func newClaimFixture(t *testing.T) *claimFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db, conn := migratedDB(ctx, t, freshDB(ctx, t, "claims"))
	l := &ledgerFixture{db: db, ctx: ctx, network: "eip155:31337", signer: common.HexToAddress("0xd")}
	if err := db.BindNetwork(ctx, l.network, 31337, common.HexToHash("0x03")); err != nil {
		t.Fatal(err)
	}
	var events []int64
	for i := range 11 {
		id, _ := l.insert(t, uint64(i))
		var ev int64
		if err := conn.QueryRow(ctx, `SELECT id FROM settlement_events WHERE settlement_id = $1 ORDER BY id LIMIT 1`, id).Scan(&ev); err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	f := &claimFixture{db: db, conn: conn, ctx: ctx, whOwner: map[string]string{}}
	hook := func(owner string) string {
		w := &facilitator.Webhook{ID: webhookID(), URL: "https://" + owner + ".example/hook", Secret: "s", Owner: owner}
		if ok, err := db.InsertWebhook(ctx, w, 100); err != nil || !ok {
			t.Fatalf("registering: %v %v", ok, err)
		}
		f.whOwner[w.ID] = owner
		return w.ID
	}
	owe := func(webhook string, event int64, ago int) { // due ago seconds ago
		if _, err := conn.Exec(ctx, `INSERT INTO webhook_deliveries (webhook_id, event_id, next_attempt_at) VALUES ($1, $2, now() - $3 * interval '1 second')`,
			webhook, event, ago); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		w := hook("keyC")
		f.c = append(f.c, w)
		for j, ev := range events[:10] {
			// Oldest first: the backlog of a dead server, retried and retried.
			owe(w, ev, 3600-i*10-j)
		}
	}
	f.a = hook("keyA")
	f.aEvent = events[10]
	owe(f.a, f.aEvent, 0)
	return f
}

// TestClaimServesOwnersInTurns: owner A's fresh delivery is claimed although owner C owes a
// hundred older ones: with C's share in flight, A's is the one taken; with nothing in flight and
// two slots, A's and C's oldest; C's webhooks passed over (their endpoint failing), A's. Before,
// the claim read the oldest due of all (C's), and A's waited behind C's backlog.
func TestClaimServesOwnersInTurns(t *testing.T) {
	f := newClaimFixture(t)
	claim := func(c facilitator.DeliveryClaim) []facilitator.WebhookDelivery {
		t.Helper()
		c.Lease = time.Minute
		dels, err := f.db.ClaimWebhookDeliveries(f.ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return dels
	}
	give := func(dels []facilitator.WebhookDelivery) { // back, as a deferred attempt does
		t.Helper()
		for _, d := range dels {
			if err := f.db.RecordWebhookAttempt(f.ctx, facilitator.DeliveryAttempt{WebhookID: d.WebhookID, EventID: d.Event.ID, Deferred: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	owners := func(dels []facilitator.WebhookDelivery) map[string]int {
		out := map[string]int{}
		for _, d := range dels {
			if d.Owner != f.whOwner[d.WebhookID] {
				t.Fatalf("delivery of %s claimed as %q's, registered by %q", d.WebhookID, d.Owner, f.whOwner[d.WebhookID])
			}
			out[d.Owner]++
		}
		return out
	}

	// C holds its share (4) in flight: of four free slots, A's delivery takes one and C none.
	dels := claim(facilitator.DeliveryClaim{Limit: 4, PerWebhook: 4, PerOwner: 4, BusyOwners: map[string]int{"keyC": 4}})
	if got := owners(dels); len(dels) != 1 || got["keyA"] != 1 || dels[0].Event.ID != f.aEvent || dels[0].Attempt != 1 {
		t.Fatalf("with C's share in flight, claimed %v (%d): want A's delivery alone", got, len(dels))
	}
	give(dels)

	// Nothing in flight, two slots: one each, A's fresh delivery beside C's oldest.
	dels = claim(facilitator.DeliveryClaim{Limit: 2, PerWebhook: 4, PerOwner: 4})
	if got := owners(dels); got["keyA"] != 1 || got["keyC"] != 1 {
		t.Fatalf("two slots, nothing in flight: claimed %v, want one of A's and one of C's", got)
	}
	give(dels)

	// Sixteen slots: C takes no more than its share (4), whatever it owes.
	dels = claim(facilitator.DeliveryClaim{Limit: 16, PerWebhook: 4, PerOwner: 4, BusyOwners: map[string]int{"keyA": 1}})
	if got := owners(dels); got["keyC"] != 4 || got["keyA"] != 1 {
		t.Fatalf("sixteen slots: claimed %v, want C's share of 4 and A's one", got)
	}
	give(dels)

	// C's webhooks passed over: A's alone, C's not even counted.
	dels = claim(facilitator.DeliveryClaim{Limit: 16, PerWebhook: 4, PerOwner: 4, Skip: f.c})
	if got := owners(dels); len(dels) != 1 || got["keyA"] != 1 {
		t.Fatalf("C's webhooks skipped: claimed %v, want A's alone", got)
	}
	give(dels)

	// Every deferral gave its attempt back: nothing was attempted, nothing counted.
	var attempts int
	if err := f.conn.QueryRow(f.ctx, `SELECT COALESCE(sum(attempts), 0) FROM webhook_deliveries`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("%d attempts counted after claims all deferred, want 0", attempts)
	}
}
