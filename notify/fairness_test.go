package notify_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestDeadReceiverCannotStarveAnother: one merchant's receiver is unreachable (every attempt
// hangs until the send timeout) and owes 30 deliveries, all older than another merchant's three.
// The other merchant's are delivered while the dead receiver holds at most its share of the
// slots: not after the dead one's backlog, oldest first, went through every slot.
func TestDeadReceiverCannotStarveAnother(t *testing.T) {
	r := newRig(t)
	deadPayTo, livePayTo := stacktest.NewAddress(t), stacktest.NewAddress(t)
	var started atomic.Int64
	hang := make(chan struct{})
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		started.Add(1)
		select {
		case <-hang:
		case <-req.Context().Done():
		}
	}))
	t.Cleanup(dead.Close)
	t.Cleanup(func() { close(hang) }) // runs before dead.Close, which waits for its handlers
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
	if n := started.Load(); n > 3 {
		t.Fatalf("the live receiver had its deliveries only after %d attempts at the dead one: it waited behind them", n)
	}
}
