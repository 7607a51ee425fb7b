package postgres_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

var stallRows = flag.Int("migrate.rows", 20_000, "settlements in the ledger TestMigrationsKeepServing migrates (docs/migrations.md's figure: 1000000)")

// stallFrom is the last migration an older release applied: the test migrates from there.
const stallFrom = 14

// TestMigrationsKeepServing: every migration after stallFrom runs against a ledger of
// -migrate.rows settlements while an older release goes on serving it: the authorization-key
// lookup (/settle's and status's first read) and a settlement's row update (the engine's
// writes), in a loop each. Both keep answering, every migration is applied, and the longest
// wait of each is logged: the stall a migration makes (go test ./facilitator/postgres -run
// TestMigrationsKeepServing -migrate.rows 1000000 -v).
func TestMigrationsKeepServing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	db, url := olderLedger(ctx, t, "stall")
	began := time.Now()
	if err := db.FillSynthetic(ctx, postgres.Fill{Network: "stall:fill", Rows: *stallRows}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d settlements written in %v", *stallRows, time.Since(began).Round(time.Millisecond))
	load, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer load.Close(context.Background())
	var (
		id                    int64
		network               string
		asset, payer, nonceAt []byte
	)
	if err := load.QueryRow(ctx, `SELECT id, network, asset, payer, auth_nonce FROM settlements ORDER BY id DESC LIMIT 1`).
		Scan(&id, &network, &asset, &payer, &nonceAt); err != nil {
		t.Fatal(err)
	}

	// The older release serving: a lookup and a write in a loop each, on connections of their own.
	type served struct {
		n       int
		longest time.Duration
		err     error
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	serve := func(out *served, step func(*pgx.Conn) error) {
		defer wg.Done()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			out.err = err
			return
		}
		defer c.Close(context.Background())
		for {
			select {
			case <-stop:
				return
			default:
			}
			began := time.Now()
			if err := step(c); err != nil {
				out.err = err
				return
			}
			out.n++
			out.longest = max(out.longest, time.Since(began))
		}
	}
	var lookups, writes served
	wg.Add(2)
	go serve(&lookups, func(c *pgx.Conn) error {
		var got int64
		err := c.QueryRow(ctx, `SELECT id FROM settlements WHERE network = $1 AND asset = $2 AND payer = $3 AND auth_nonce = $4`,
			network, asset, payer, nonceAt).Scan(&got)
		if err == nil && got != id {
			err = errors.New("the lookup found another settlement")
		}
		return err
	})
	go serve(&writes, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `UPDATE settlements SET updated_at = now() WHERE id = $1`, id)
		return err
	})
	time.Sleep(200 * time.Millisecond) // serving before the migrations start
	migrating := time.Now()
	applied, err := db.Migrate(ctx)
	took := time.Since(migrating)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("migrating (applied %v): %v", applied, err)
	}
	if len(applied) == 0 || applied[0] != stallFrom+1 {
		t.Fatalf("applied %v, want every migration after %d", applied, stallFrom)
	}
	for name, s := range map[string]*served{"lookup": &lookups, "write": &writes} {
		if s.err != nil {
			t.Fatalf("the older release's %s failed during the migrations: %v", name, s.err)
		}
		if s.n == 0 {
			t.Fatalf("no %s was served", name)
		}
	}
	var valid bool
	if err := load.QueryRow(ctx, `SELECT bool_and(convalidated) FROM pg_constraint
		WHERE conrelid = 'settlements'::regclass AND conname IN ('settlements_batch_slot_check', 'settlements_network_signer_tx_nonce_key')`).Scan(&valid); err != nil || !valid {
		t.Fatalf("the migrated constraints: valid %v, %v", valid, err)
	}
	t.Logf("migrations %v over %d settlements took %v; the longest lookup %v (of %d), the longest write %v (of %d)",
		applied, *stallRows, took.Round(time.Millisecond), lookups.longest.Round(time.Microsecond), lookups.n,
		writes.longest.Round(time.Microsecond), writes.n)
}

// TestMigrationsWaitOutALongTransaction: a transaction of the older release stays open on
// settlements while the migrations run. The statements whose lock would stop reads or writes give
// up their place in the lock queue every 100 ms and try again; the concurrent index builds, which
// stop neither, wait for it (given up half way, a build leaves an invalid index behind, and the
// next try failed on it: "already exists"). Once it ends, every migration is applied.
func TestMigrationsWaitOutALongTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, url := olderLedger(ctx, t, "wait")
	if err := db.FillSynthetic(ctx, postgres.Fill{Network: "wait:fill", Rows: 1_000}); err != nil {
		t.Fatal(err)
	}
	long, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close(context.Background())
	tx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM settlements`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	type result struct {
		applied []int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		applied, err := db.Migrate(ctx)
		done <- result{applied, err}
	}()
	// Long enough for a 100 ms lock timeout to end several waits.
	select {
	case r := <-done:
		t.Fatalf("the migrations finished under an open transaction on settlements: %v %v", r.applied, r.err)
	case <-time.After(1500 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.applied) == 0 || r.applied[0] != stallFrom+1 {
		t.Fatalf("migrating once the transaction ended: applied %v, %v; want every migration after %d", r.applied, r.err, stallFrom)
	}
}

// olderLedger is a ledger as an older release left it (migrated up to stallFrom), in a schema of
// its own beside the package's, dropped when the test ends; url connects to it.
func olderLedger(ctx context.Context, t *testing.T, prefix string) (db *postgres.DB, url string) {
	t.Helper()
	openTestDB(t) // a skip locally without a database (a failure under CI)
	schema := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	conn := openConn(t)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	url = os.Getenv("TEST_DATABASE_URL")
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	url += sep + "search_path=" + schema
	db, err := postgres.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.MigrateTo(ctx, stallFrom); err != nil {
		t.Fatal(err)
	}
	return db, url
}
