package notify_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

var settlementTypes = []string{"settlement.broadcast", "settlement.mined", "settlement.final"}

// TestWebhookRetriesThenDeliversOnce: a receiver that fails twice and then succeeds gets every
// event three times and processes it once (it dedupes on the event id), the ledger counts three
// attempts, and every request carries a signature that verifies with the webhook's secret.
func TestWebhookRetriesThenDeliversOnce(t *testing.T) {
	r := newRig(t)
	obs := &attemptObserver{}
	d := r.dispatcher(t, r.db, func(c *notify.Config) { c.Observer = obs })
	rec := newReceiver(t, 2)
	w := register(t, d, rec) // no payTo filter: every settlement (this package's tests run one at a time)
	if len(w.Secret) != 64 {
		t.Fatalf("secret %q, want 32 bytes of hex", w.Secret)
	}
	p := newPayment(t, stacktest.NewAddress(t))
	out := r.settle(t, p)

	msgs := rec.await(t, out.SettlementID, settlementTypes...)
	eventually(t, "the three deliveries recorded as delivered", func() bool {
		ds := deliveries(t, w.ID)
		for _, m := range msgs {
			if !ds[m.ID].delivered {
				return false
			}
		}
		return len(ds) == 3
	})
	ds := deliveries(t, w.ID)
	// Each event failed twice, then was delivered.
	if got := obs.snapshot(); got[notify.DeliveryDelivered] != 3 || got[notify.DeliveryRetrying] != 6 || got[notify.DeliveryGaveUp] != 0 {
		t.Errorf("observed attempts %v, want 3 delivered and 6 failed_retrying", got)
	}
	// The loop beat on every round it made, on the dispatcher's clock.
	if n, at := obs.beaten(); n < 2 || time.Since(at) > time.Minute {
		t.Errorf("the delivery loop beat %d times, last at %v", n, at)
	}
	requests, processed, badSig := rec.counts()
	if badSig != 0 {
		t.Fatalf("%d requests whose signature did not verify", badSig)
	}
	if processed != 3 {
		t.Fatalf("the receiver processed %d events, want 3 (broadcast, mined, final; signed is not sent)", processed)
	}
	for ty, m := range msgs {
		dl := ds[m.ID]
		if requests[m.ID] != 3 || dl.attempts != 3 || dl.pending || dl.gaveUp || dl.lastStatus == nil || *dl.lastStatus != 204 {
			t.Errorf("%s (event %s): %d requests, delivery %+v; want 3 requests, 3 attempts, delivered with 204", ty, m.ID, requests[m.ID], dl)
		}
		if m.State != strings.TrimPrefix(ty, "settlement.") {
			t.Errorf("%s: state %q", ty, m.State)
		}
	}

	var ids []int64
	for _, ty := range settlementTypes {
		id, err := strconv.ParseInt(msgs[ty].ID, 10, 64)
		if err != nil {
			t.Fatalf("%s: event id %q is not a settlement_events id", ty, msgs[ty].ID)
		}
		ids = append(ids, id)
	}
	if !(ids[0] < ids[1] && ids[1] < ids[2]) {
		t.Errorf("event ids %v: want broadcast < mined < final", ids)
	}
	mined := msgs["settlement.mined"]
	st := mined.Data
	if st.State != facilitator.StatusSettled || st.Transaction != out.Response.Transaction || st.To != p.PayTo.Hex() ||
		st.SettledBy != "facilitator" || st.Value != "1000000" || st.Network != env.Network().ID {
		t.Errorf("mined event data %+v, want the settled status of %s", st, out.Response.Transaction)
	}
	if time.Since(mined.CreatedAt) > time.Minute || mined.CreatedAt.After(time.Now()) {
		t.Errorf("createdAt %s", mined.CreatedAt)
	}

	// The signature is the secret's: recomputed with another key, it does not match.
	h, bodies := rec.lastRequest(mined.ID)
	ts, err := strconv.ParseInt(h.Get(notify.HeaderTimestamp), 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)) > time.Minute {
		t.Fatalf("X402-Timestamp %q", h.Get(notify.HeaderTimestamp))
	}
	sig := h.Get(notify.HeaderSignature)
	var matches int
	for _, b := range bodies {
		for _, key := range []string{w.Secret, strings.Repeat("0", 64)} {
			mac := hmac.New(sha256.New, []byte(key))
			mac.Write([]byte(h.Get(notify.HeaderTimestamp) + "." + b))
			if hmac.Equal([]byte(sig), []byte("sha256="+hex.EncodeToString(mac.Sum(nil)))) {
				if key != w.Secret {
					t.Fatalf("the signature verifies with a key that is not the secret")
				}
				matches++
			}
		}
	}
	if matches != 1 {
		t.Fatalf("the last request's signature matches %d of the bodies received, want 1", matches)
	}
}

// TestWebhookPayToFilter: a webhook for another payTo, and a disabled one, receive nothing; a
// webhook whose list includes the payee receives its events.
func TestWebhookPayToFilter(t *testing.T) {
	r := newRig(t)
	d := r.dispatcher(t, r.db, nil)
	ctx := context.Background()
	payTo := stacktest.NewAddress(t)
	mine, other, off := newReceiver(t, 0), newReceiver(t, 0), newReceiver(t, 0)
	wMine := register(t, d, mine, stacktest.NewAddress(t), payTo)
	wOther := register(t, d, other, stacktest.NewAddress(t))
	wOff := register(t, d, off, payTo)
	if err := d.DisableWebhook(ctx, "", wOff.ID); err != nil {
		t.Fatal(err)
	}
	out := r.settle(t, newPayment(t, payTo))
	msgs := mine.await(t, out.SettlementID, settlementTypes...)
	final, _ := strconv.ParseInt(msgs["settlement.final"].ID, 10, 64)

	// The statement that owed the first webhook the final event moved the second one's cursor past
	// it too: nothing more can come to the second webhook for this settlement.
	conn, err := pgx.Connect(ctx, env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var passed bool
	if err := conn.QueryRow(ctx, `SELECT (w.cursor_xid, w.cursor_event_id) >= (e.xid, e.id)
		FROM webhooks w, settlement_events e WHERE w.id = $1 AND e.id = $2`, wOther.ID, final).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	if !passed {
		t.Fatalf("the other webhook's cursor has not passed the final event")
	}
	if got := deliveries(t, wMine.ID); len(got) != 3 {
		t.Fatalf("the payee's webhook owes %d deliveries, want 3", len(got))
	}
	for name, w := range map[string]facilitator.Webhook{"other payTo": wOther, "disabled": wOff} {
		if got := deliveries(t, w.ID); len(got) != 0 {
			t.Errorf("%s webhook owes %d deliveries, want none", name, len(got))
		}
	}
	for name, rec := range map[string]*receiver{"other payTo": other, "disabled": off} {
		if reqs, _, _ := rec.counts(); len(reqs) != 0 {
			t.Errorf("%s webhook received %v", name, reqs)
		}
	}
	// Only enabled webhooks are listed, and never with their secret.
	ws, err := d.Webhooks(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]facilitator.Webhook{}
	for _, w := range ws {
		if w.Secret != "" {
			t.Fatalf("webhook %s listed with its secret", w.ID)
		}
		listed[w.ID] = w
	}
	if _, ok := listed[wOff.ID]; ok {
		t.Fatalf("the disabled webhook is listed")
	}
	if got := listed[wMine.ID].PayTo; len(got) != 2 || got[1] != payTo {
		t.Fatalf("listed payTo %v, want the two registered", got)
	}
}

// TestLateCommitIsNotSkipped: an event written by a transaction that commits after a later-id
// event was already visible is still delivered. A cursor on the event id alone would have moved
// past it for good; the cursor on the writing transaction waits for it.
func TestLateCommitIsNotSkipped(t *testing.T) {
	r := newRig(t)
	d := r.dispatcher(t, r.db, nil)
	ctx := context.Background()
	payTo := stacktest.NewAddress(t)
	rec := newReceiver(t, 0)
	register(t, d, rec, payTo)
	out := r.settle(t, newPayment(t, payTo))
	rec.await(t, out.SettlementID, settlementTypes...)

	slow, err := pgx.Connect(ctx, env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close(ctx)
	fast, err := pgx.Connect(ctx, env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close(ctx)
	tx, err := slow.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	const insert = `INSERT INTO settlement_events (settlement_id, state, detail) VALUES ($1, $2, 'test: out-of-order commit') RETURNING id`
	var early, late int64
	if err := tx.QueryRow(ctx, insert, out.SettlementID, "expired").Scan(&early); err != nil {
		t.Fatal(err)
	}
	if err := fast.QueryRow(ctx, insert, out.SettlementID, "reverted").Scan(&late); err != nil {
		t.Fatal(err)
	}
	if late <= early {
		t.Fatalf("ids %d then %d: the test needs the later statement to get the higher id", early, late)
	}
	// Ten polls: the committed later event waits behind the open transaction's.
	time.Sleep(500 * time.Millisecond)
	if reqs, _, _ := rec.counts(); reqs[strconv.FormatInt(late, 10)] != 0 {
		t.Fatalf("event %d was sent while event %d could still commit", late, early)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := rec.await(t, out.SettlementID, "settlement.expired", "settlement.reverted")
	if msgs["settlement.expired"].ID != strconv.FormatInt(early, 10) || msgs["settlement.reverted"].ID != strconv.FormatInt(late, 10) {
		t.Fatalf("got %v, want events %d and %d", msgs, early, late)
	}
}

// TestReplicasSendEachAttemptOnce: two dispatchers on one database share the work and never
// send the same attempt twice: with a receiver failing each event once, each is requested
// exactly twice.
func TestReplicasSendEachAttemptOnce(t *testing.T) {
	r := newRig(t)
	r.dispatcher(t, env.OpenDB(t), nil)
	d := r.dispatcher(t, env.OpenDB(t), nil)
	payTo := stacktest.NewAddress(t)
	rec := newReceiver(t, 1)
	w := register(t, d, rec, payTo)

	const n = 4
	pays := make([]payment, n)
	for i := range pays {
		pays[i] = newPayment(t, payTo)
	}
	want := map[int64][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, p := range pays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pay, err := facilitator.DecodeRequest(p.body)
			if err != nil {
				errs <- err
				return
			}
			out, err := r.engine.Settle(context.Background(), pay)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			want[out.SettlementID] = settlementTypes
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rec.awaitAll(t, want)
	eventually(t, "every delivery recorded as delivered", func() bool {
		ds := deliveries(t, w.ID)
		for _, dl := range ds {
			if !dl.delivered {
				return false
			}
		}
		return len(ds) == 3*n
	})
	requests, _, _ := rec.counts()
	for id, dl := range deliveries(t, w.ID) {
		if requests[id] != 2 || dl.attempts != 2 {
			t.Errorf("event %s: %d requests, %d attempts; want 2 and 2", id, requests[id], dl.attempts)
		}
	}
}

// TestWebhookGivesUp: after MaxAttempts failures a delivery is given up: marked, no longer due,
// and nothing more is sent.
func TestWebhookGivesUp(t *testing.T) {
	r := newRig(t)
	obs := &attemptObserver{}
	d := r.dispatcher(t, r.db, func(c *notify.Config) { c.MaxAttempts = 3; c.Observer = obs })
	payTo := stacktest.NewAddress(t)
	rec := newReceiver(t, 1<<30)
	w := register(t, d, rec, payTo)
	r.settle(t, newPayment(t, payTo))
	eventually(t, "three deliveries given up", func() bool {
		ds := deliveries(t, w.ID)
		for _, dl := range ds {
			if !dl.gaveUp {
				return false
			}
		}
		return len(ds) == 3
	})
	time.Sleep(300 * time.Millisecond) // several polls and backoffs: nothing more may be sent
	requests, _, _ := rec.counts()
	for id, dl := range deliveries(t, w.ID) {
		if requests[id] != 3 || dl.attempts != 3 || dl.delivered || dl.pending || dl.lastStatus == nil || *dl.lastStatus != 500 ||
			dl.lastError == nil || !strings.Contains(*dl.lastError, "HTTP 500") {
			t.Errorf("event %s: %d requests, delivery %+v; want 3 attempts given up on HTTP 500", id, requests[id], dl)
		}
	}
	if got := obs.snapshot(); got[notify.DeliveryGaveUp] != 3 || got[notify.DeliveryRetrying] != 6 || got[notify.DeliveryDelivered] != 0 {
		t.Errorf("observed attempts %v, want 6 failed_retrying and 3 gave_up", got)
	}
}

// attemptObserver counts the attempt results the dispatcher reports, and its loop's beats.
type attemptObserver struct {
	mu     sync.Mutex
	counts map[string]int
	beats  int
	last   time.Time
}

func (o *attemptObserver) Beat(loop, network string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if loop == notify.LoopWebhooks && network == "" {
		o.beats++
		o.last = at
	}
}

func (o *attemptObserver) beaten() (int, time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.beats, o.last
}

func (o *attemptObserver) WebhookAttempt(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counts == nil {
		o.counts = map[string]int{}
	}
	o.counts[result]++
}

func (o *attemptObserver) snapshot() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.counts)
}

// TestSlowReceiverHoldsOnlyItsOwn: a receiver that never answers holds a delivery slot per
// delivery until the send timeout, not the loop: another webhook's events still arrive while the
// slow receiver's attempts hang. Decided by order, not by a clock: the fast receiver must have
// every event before any attempt at the slow one has ended (they end only at the send timeout,
// far past anything a loaded machine takes, or at cleanup).
func TestSlowReceiverHoldsOnlyItsOwn(t *testing.T) {
	r := newRig(t)
	d := r.dispatcher(t, r.db, func(c *notify.Config) { c.SendTimeout = time.Minute })
	payTo := stacktest.NewAddress(t)
	hang := make(chan struct{})
	var started, ended atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		defer ended.Add(1)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(hang) }) // runs before slow.Close, which waits for its handlers
	ws, err := d.CreateWebhook(context.Background(), "", slow.URL, []string{payTo.Hex()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.DisableWebhook(context.Background(), "", ws.ID) })
	fast := newReceiver(t, 0)
	register(t, d, fast, payTo)

	out := r.settle(t, newPayment(t, payTo))
	fast.await(t, out.SettlementID, settlementTypes...)
	if n := ended.Load(); n > 0 {
		t.Fatalf("the fast receiver had all events only after %d attempt(s) at the slow one ended: it waited behind them", n)
	}
	if started.Load() == 0 {
		t.Log("the slow receiver was not attempted before the fast one had everything (nothing was held)")
	}
}

// TestPruneKeepsWhatIsOwed: the retention job deletes finished deliveries once they are older than
// DeliveryRetention, and never one still owed.
func TestPruneKeepsWhatIsOwed(t *testing.T) {
	r := newRig(t)
	d := r.dispatcher(t, r.db, func(c *notify.Config) { c.MaxAttempts = 1000 })
	paidOK, paidFailing := stacktest.NewAddress(t), stacktest.NewAddress(t)
	ok, failing := newReceiver(t, 0), newReceiver(t, 1<<30)
	wOK, wFailing := register(t, d, ok, paidOK), register(t, d, failing, paidFailing)
	r.settle(t, newPayment(t, paidOK))
	r.settle(t, newPayment(t, paidFailing))
	eventually(t, "one webhook's deliveries done, the other's owed", func() bool {
		done, owed := deliveries(t, wOK.ID), deliveries(t, wFailing.ID)
		for _, dl := range done {
			if !dl.delivered {
				return false
			}
		}
		for _, dl := range owed {
			if !dl.pending || dl.attempts == 0 {
				return false
			}
		}
		return len(done) == 3 && len(owed) == 3
	})
	// Not stopped: Prune uses only the store and the clock.
	pruner := func(now time.Time) *notify.Dispatcher {
		return notify.New(notify.Config{Store: r.db, Status: r.status, DeliveryRetention: 24 * time.Hour,
			Now: func() time.Time { return now }})
	}
	if _, err := pruner(time.Now()).Prune(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(deliveries(t, wOK.ID)); got != 3 {
		t.Fatalf("deliveries finished within the retention were pruned: %d left of 3", got)
	}
	n, err := pruner(time.Now().Add(25 * time.Hour)).Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := len(deliveries(t, wOK.ID)); got != 0 || n < 3 {
		t.Fatalf("after the retention: %d finished deliveries left, %d pruned; want 0 left, at least 3 pruned", got, n)
	}
	if got := deliveries(t, wFailing.ID); len(got) != 3 {
		t.Fatalf("deliveries still owed were pruned: %d left of 3", len(got))
	}
}

// TestFreedSlotClaimsAtOnce: when a claim fills every delivery slot, an attempt that ends claims
// the next due delivery at once instead of at the next poll. With one slot and 10 s between
// polls, three settlements' nine events all arrive within the wait; before, each full claim
// waited for the next tick (delivery capped at Concurrency per PollInterval: 16/s by default,
// below what the engine settles), and four would have.
func TestFreedSlotClaimsAtOnce(t *testing.T) {
	deliverNineBetweenTicks(t, func(c *notify.Config) { c.Concurrency, c.PollInterval = 1, 10*time.Second })
}

// A webhook's backlog beyond its share of the slots (PerWebhook) is claimed as its attempts end,
// not one share per poll tick: with the share full, the next round's claim finds nothing and the
// loop went back to sleep until the tick, so one merchant's webhook got PerWebhook deliveries per
// PollInterval (the load bench: 496 of 3,000 events delivered in two minutes, p50 62 s). Nine
// events, a share of one, 10 s ticks: well within the wait, which a tick per event would not be.
func TestFullShareClaimsAsAttemptsEnd(t *testing.T) {
	deliverNineBetweenTicks(t, func(c *notify.Config) { c.Concurrency, c.PerWebhook, c.PollInterval = 4, 1, 10*time.Second })
}

// deliverNineBetweenTicks settles three payments to one webhook, then starts a dispatcher set up
// by configure, whose ticks are too far apart to deliver their nine events in the wait one or a
// share per tick: each must be claimed as an attempt ends.
func deliverNineBetweenTicks(t *testing.T, configure func(*notify.Config)) {
	r := newRig(t)
	payTo := stacktest.NewAddress(t)
	rec := newReceiver(t, 0)
	// Registered through a dispatcher that never runs: the events below wait for the one under
	// test, which starts when all of them are in the ledger.
	idle := notify.New(notify.Config{Store: r.db, Status: r.status, AllowPrivateTargets: true})
	register(t, idle, rec, payTo)
	want := map[int64][]string{}
	for range 3 {
		want[r.settle(t, newPayment(t, payTo)).SettlementID] = settlementTypes
	}
	r.waitFinal(t, slices.Collect(maps.Keys(want))...)
	r.dispatcher(t, r.db, configure)
	rec.awaitAll(t, want)
	if requests, processed, bad := rec.counts(); processed != 9 || bad != 0 || len(requests) != 9 {
		t.Fatalf("processed %d events in %d ids, %d bad signatures; want 9, 9, 0", processed, len(requests), bad)
	}
}
