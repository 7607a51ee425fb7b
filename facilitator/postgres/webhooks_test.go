package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestInsertWebhookLimitConcurrent: an owner's registrations made at once never pass its limit
// (each one's count and insert would otherwise both see room for one more).
func TestInsertWebhookLimitConcurrent(t *testing.T) {
	db := openTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	owner := fmt.Sprintf("%012x", time.Now().UnixNano()&0xffffffffffff)
	const limit, tries = 3, 24
	var wg sync.WaitGroup
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &facilitator.Webhook{ID: webhookID(), URL: "http://127.0.0.1:1/hook", Secret: "s", Owner: owner}
			if _, err := db.InsertWebhook(ctx, w, limit); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ws, err := db.Webhooks(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != limit {
		t.Fatalf("%d enabled webhooks after %d registrations at once, want the limit %d", len(ws), tries, limit)
	}
}

// TestDisableWebhookDuringEnqueue: a webhook disabled while an enqueue holds it (and writes its
// deliveries) leaves none of them owed: they would never be sent (the webhook is disabled) nor
// pruned (they are not finished).
func TestDisableWebhookDuringEnqueue(t *testing.T) {
	l := newLedgerFixture(t, 30*time.Second)
	db, ctx := l.db, l.ctx
	settlement, _ := l.insert(t, 0)
	owner := fmt.Sprintf("%012x", time.Now().UnixNano()&0xffffffffffff)
	w := &facilitator.Webhook{ID: webhookID(), URL: "http://127.0.0.1:1/hook", Secret: "s", Owner: owner}
	if ok, err := db.InsertWebhook(ctx, w, 10); err != nil || !ok {
		t.Fatalf("registering: %v %v", ok, err)
	}
	conn := openConn(t)
	// An enqueue under way: it holds the webhook's row and writes a delivery of an event.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT id FROM webhooks WHERE id = $1 FOR UPDATE`, w.ID); err != nil {
		t.Fatal(err)
	}
	var event int64
	if err := tx.QueryRow(ctx, `SELECT id FROM settlement_events WHERE settlement_id = $1 ORDER BY id LIMIT 1`, settlement).Scan(&event); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (webhook_id, event_id, next_attempt_at) VALUES ($1, $2, now())`, w.ID, event); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- db.DisableWebhook(ctx, owner, w.ID) }()
	// The disable waits for the enqueue's lock; then the enqueue commits.
	waitBlocked(t, conn)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var owed int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1 AND next_attempt_at IS NOT NULL`, w.ID).Scan(&owed); err != nil {
		t.Fatal(err)
	}
	if owed != 0 {
		t.Fatalf("%d deliveries of the disabled webhook still owed: never sent, never pruned", owed)
	}
}

// openConn is a connection of the test's own to TEST_DATABASE_URL, closed when the test ends.
func openConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// waitBlocked waits until some backend waits for a lock that conn's backend holds.
func waitBlocked(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	pid := conn.PgConn().PID()
	probe := openConn(t)
	for limit := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := probe.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, int32(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(limit) {
			t.Fatal("nothing waited for the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// webhookID is a fresh webhook id of the ledger's form.
func webhookID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("wh_%x", b)
}
