package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// openTestDB connects to TEST_DATABASE_URL ('make test' provides a fresh one). Without it the
// tests skip locally and fail under CI, where a missing database is a broken run.
func openTestDB(t *testing.T) *postgres.DB {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TEST_DATABASE_URL is not set: CI must run the tests through 'make test'")
		}
		t.Skip("TEST_DATABASE_URL is not set; run 'make test'")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// freshDB is a database of the test's own, named by suffix, for a test that must see only its
// own rows or must not leave its own behind; without Postgres it skips, or fails under CI.
func freshDB(ctx context.Context, t *testing.T, suffix string) string {
	t.Helper()
	url, err := stacktest.FreshDB(ctx, suffix)
	if err != nil {
		if err == stacktest.ErrNoDatabase {
			openTestDB(t) // skips, or fails under CI
		}
		t.Fatal(err)
	}
	return url
}

// migratedDB opens url and migrates it, with a plain connection beside the store for the rows
// and plans a test writes and reads in SQL; both close when the test ends.
func migratedDB(ctx context.Context, t *testing.T, url string, opts ...postgres.Option) (*postgres.DB, *pgx.Conn) {
	t.Helper()
	db, err := postgres.Open(ctx, url, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return db, conn
}

// TestMigrateConcurrently: replicas starting together apply each migration exactly once.
func TestMigrateConcurrently(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := db.Migrate(ctx)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	again, err := db.Migrate(ctx)
	if err != nil || len(again) != 0 {
		t.Fatalf("second migrate applied %v, %v", again, err)
	}
}

// TestMigrateFreshReplicas: replicas starting together on a fresh database all start. One
// waiting for the migration lock inside pg_advisory_lock held a transaction open, which the
// holder's CREATE INDEX CONCURRENTLY waited for: Postgres broke the deadlock by failing the
// waiter (40P01), and that replica did not start.
func TestMigrateFreshReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := freshDB(ctx, t, "migrate_fresh")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		db, err := postgres.Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := db.Migrate(ctx)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestBindNetwork(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("eip155:%d", time.Now().UnixNano()%1_000_000_000)
	genesis := common.HexToHash("0x01")
	if err := db.BindNetwork(ctx, id, 7, genesis); err != nil {
		t.Fatal(err)
	}
	if err := db.BindNetwork(ctx, id, 7, genesis); err != nil {
		t.Fatalf("rebinding the same chain: %v", err)
	}
	if err := db.BindNetwork(ctx, id, 7, common.HexToHash("0x02")); !errors.Is(err, postgres.ErrNetworkMismatch) {
		t.Fatalf("another genesis: want ErrNetworkMismatch, got %v", err)
	}
	if err := db.BindNetwork(ctx, id, 8, genesis); !errors.Is(err, postgres.ErrNetworkMismatch) {
		t.Fatalf("another chain id: want ErrNetworkMismatch, got %v", err)
	}
}

func TestOpenBadURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := postgres.Open(ctx, "postgres://user:s3cret@127.0.0.1:1/db?connect_timeout=1", nil)
	if err == nil {
		t.Fatal("connected to nothing")
	}
	if contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
