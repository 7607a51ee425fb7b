package notify_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// deadEndpoint is a receiver that never answers: each request hangs until the test ends, or,
// once release is closed, is answered 503 at once. started and ended count the requests.
type deadEndpoint struct {
	URL            string
	started, ended atomic.Int64
}

func newDeadEndpoint(t *testing.T, release <-chan struct{}) *deadEndpoint {
	d := &deadEndpoint{}
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		d.started.Add(1)
		defer d.ended.Add(1)
		select {
		case <-release:
			http.Error(w, "down", http.StatusServiceUnavailable)
		case <-hang:
		case <-req.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) }) // runs before srv.Close, which waits for its handlers
	d.URL = srv.URL
	return d
}

// TestDeadReceiverCannotStarveAnother: one merchant's receiver is unreachable (every attempt
// hangs until the send timeout) and owes 30 deliveries, all older than another merchant's three.
// The other merchant's are delivered while the dead receiver holds at most its share of the
// slots: not after the dead one's backlog, oldest first, went through every slot.
func TestDeadReceiverCannotStarveAnother(t *testing.T) {
	r := newRig(t)
	deadPayTo, livePayTo := stacktest.NewAddress(t), stacktest.NewAddress(t)
	dead := newDeadEndpoint(t, nil)
	live := newReceiver(t, 0)
	// Registered through a dispatcher that never runs: the deliveries are all owed when the one
	// under test starts.
	idle := notify.New(notify.Config{Store: r.db, Status: r.status, AllowPrivateTargets: true})
	wd, err := idle.CreateWebhook(context.Background(), "", dead.URL, []string{deadPayTo.Hex()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idle.DisableWebhook(context.Background(), "", wd.ID) })
	register(t, idle, live, livePayTo)
	var deadIDs []int64
	for range 10 {
		deadIDs = append(deadIDs, r.settle(t, newPayment(t, deadPayTo)).SettlementID)
	}
	out := r.settle(t, newPayment(t, livePayTo))
	r.waitFinal(t, append(deadIDs, out.SettlementID)...)

	r.dispatcher(t, r.db, func(c *notify.Config) {
		c.Concurrency, c.SendTimeout, c.BaseBackoff = 4, 300*time.Millisecond, time.Minute
	})
	live.await(t, out.SettlementID, settlementTypes...)
	// One webhook may hold a quarter of the slots (one of four); a claim round or two of slack.
	if n := dead.started.Load(); n > 3 {
		t.Fatalf("the live receiver had its deliveries only after %d attempts at the dead one: it waited behind them", n)
	}
}

// TestDeadEndpointOfOneKeyCannotDelayAnother: key C's twenty webhooks at one server that never
// answers owe sixty deliveries, all older than key A's three. Decided by order, not by a clock:
// A's receiver has every event while C holds no more than its share of the slots and none of
// C's attempts has ended. Then the dead server starts answering 503 at once: after
// BreakerFailures of them in a row its breaker opens, and C's other deliveries wait for the probe
// without being attempted or spending their attempts (none is given up, though MaxAttempts is 2).
func TestDeadEndpointOfOneKeyCannotDelayAnother(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	deadPayTo, livePayTo := stacktest.NewAddress(t), stacktest.NewAddress(t)
	keyA, keyC := fmt.Sprintf("%012x", time.Now().UnixNano()&0xffffffffffff), fmt.Sprintf("%012x", (time.Now().UnixNano()+1)&0xffffffffffff)
	for id, payTo := range map[string]common.Address{keyA: livePayTo, keyC: deadPayTo} {
		k := &facilitator.APIKey{ID: id, Name: id, Scopes: []facilitator.Scope{facilitator.ScopeWebhooks}, PayTo: []common.Address{payTo}}
		if _, err := rand.Read(k.Hash[:]); err != nil {
			t.Fatal(err)
		}
		if err := r.db.InsertAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	dead := newDeadEndpoint(t, release)
	live := newReceiver(t, 0)
	// Registered through a dispatcher that never runs; C's deliveries are enqueued (now) before
	// A's settlement exists, so that they are the oldest due.
	idle := notify.New(notify.Config{Store: r.db, Status: r.status, AllowPrivateTargets: true})
	var cHooks []string
	for i := range 20 {
		w, err := idle.CreateWebhook(ctx, keyC, fmt.Sprintf("%s/hook/%d", dead.URL, i), []string{deadPayTo.Hex()})
		if err != nil {
			t.Fatal(err)
		}
		cHooks = append(cHooks, w.ID)
		t.Cleanup(func() { _ = idle.DisableWebhook(context.Background(), keyC, w.ID) })
	}
	wa, err := idle.CreateWebhook(ctx, keyA, live.srv.URL+"/hooks/x402", []string{livePayTo.Hex()})
	if err != nil {
		t.Fatal(err)
	}
	live.setSecret(wa.Secret)
	t.Cleanup(func() { _ = idle.DisableWebhook(context.Background(), keyA, wa.ID) })
	r.waitFinal(t, r.settle(t, newPayment(t, deadPayTo)).SettlementID)
	owed := func() int {
		n := 0
		for _, id := range cHooks {
			n += len(deliveries(t, id))
		}
		return n
	}
	eventually(t, "C's sixty deliveries enqueued", func() bool {
		if _, err := r.db.EnqueueWebhookEvents(ctx, notify.EventStates(), 500); err != nil {
			t.Fatal(err)
		}
		return owed() == 60
	})
	out := r.settle(t, newPayment(t, livePayTo))
	r.waitFinal(t, out.SettlementID)

	const perOwner, failures = 2, 3
	r.dispatcher(t, r.db, func(c *notify.Config) {
		c.Concurrency, c.PerWebhook, c.PerOwner, c.SendTimeout = 4, 1, perOwner, time.Minute
		c.BaseBackoff, c.MaxBackoff, c.MaxAttempts, c.BreakerFailures, c.BreakerCooldown = time.Hour, time.Hour, 2, failures, time.Hour
	})
	live.await(t, out.SettlementID, settlementTypes...)
	if n, e := dead.started.Load(), dead.ended.Load(); n > perOwner || e > 0 {
		t.Fatalf("A had its deliveries only after %d attempts at C's dead server (%d ended): it waited behind them", n, e)
	}

	conn, err := pgx.Connect(ctx, env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	close(release)
	// Every one of C's webhooks was claimed once: attempted and failed (retried in an hour), or
	// deferred to the probe an hour away; from then on the claims pass it over.
	eventually(t, "each of C's webhooks waiting an hour", func() bool {
		var waiting int
		if err := conn.QueryRow(ctx, `SELECT count(DISTINCT webhook_id) FROM webhook_deliveries
			WHERE webhook_id = ANY($1) AND next_attempt_at > now() + interval '30 minutes'`, cHooks).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting == len(cHooks)
	})
	var attempts, gaveUp, pending int
	for _, id := range cHooks {
		for _, dl := range deliveries(t, id) {
			attempts += dl.attempts
			if dl.gaveUp {
				gaveUp++
			}
			if dl.pending {
				pending++
			}
		}
	}
	if n := dead.started.Load(); n > failures+perOwner-1 || int64(attempts) != n || gaveUp > 0 || pending != 60 {
		t.Fatalf("the dead server had %d requests, C's deliveries count %d attempts, %d given up, %d still owed: want at most %d requests "+
			"(the breaker's threshold, and what was in flight when it opened), each counted once, all 60 still owed",
			n, attempts, gaveUp, pending, failures+perOwner-1)
	}
}
