// Package postgres is the one place that holds SQL: the facilitator's durable state in Postgres.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/migrations"
)

// DB is the facilitator's Postgres store.
type DB struct {
	pool *pgxpool.Pool
	log  *slog.Logger

	leaseMu sync.Mutex
	leases  map[string]*lease // indexer leases held by this process, by network
}

// Open connects to url and checks the connection within the context's bound.
func Open(ctx context.Context, url string, log *slog.Logger, opts ...Option) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The parse error can echo the URL, password included.
		return nil, errors.New("postgres: DATABASE_URL is not a valid connection string")
	}
	if cfg.MaxConns < 16 {
		// Long-held connections (the indexer's lease, one per network) must not starve requests.
		cfg.MaxConns = 16
	}
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connecting to %s/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Database, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &DB{pool: pool, log: log, leases: map[string]*lease{}}, nil
}

// Close closes the pool.
func (db *DB) Close() { db.pool.Close() }

// Ping checks that Postgres answers.
func (db *DB) Ping(ctx context.Context) error { return db.pool.Ping(ctx) }

// migrationLockID serialises migrations across replicas starting at once.
const migrationLockID = 0x78343032 // "x402"

// Migrate applies every embedded migration not yet applied, each in its own transaction (or, for
// one marked noTransaction, statement by statement), under an advisory lock so that concurrent
// starts do not race. It returns the versions it applied.
//
// Replicas of the previous release go on serving while a new one migrates, so no statement may
// hold a lock that stalls them for long: every statement that takes a lock blocking reads or
// writes waits at most migrationLockTimeout for it (a statement queued behind a long transaction
// would otherwise block every query queued behind it) and is tried again; work on big tables is written not to need a strong lock
// (indexes built CONCURRENTLY, constraints added NOT VALID and validated after).
func (db *DB) Migrate(ctx context.Context) ([]int, error) { return db.migrate(ctx, 0) }

// noTransaction marks a migration (its first line) whose statements run one by one outside a
// transaction, as CREATE INDEX CONCURRENTLY must. Each statement ends with ";" at the end of a
// line, and the whole file can run again from its start after a failure part of the way.
const noTransaction = "-- migrate: no transaction"

// migrationLockTimeout bounds a migration statement's wait for a lock (and so how long the
// queries queued behind it wait); migrationLockTries is how many times it is tried, a pause
// growing to a second between tries.
const (
	migrationLockTimeout = "100ms"
	migrationLockTries   = 60
)

// migrate is Migrate up to version upTo (0: every version).
func (db *DB) migrate(ctx context.Context, upTo int) ([]int, error) {
	all, err := loadMigrations(migrations.FS)
	if err != nil {
		return nil, err
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	if err := takeMigrationLock(ctx, conn); err != nil {
		conn.Release()
		return nil, fmt.Errorf("postgres: migrate: taking the lock: %w", err)
	}
	defer func() {
		// A fresh context: the caller's may be done, and the lock must not outlive us on a pooled
		// connection. One whose unlock failed (or whose settings are the migration's) is closed,
		// not returned to the pool: its session's end releases the lock.
		unlockCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(unlockCtx, `SELECT pg_advisory_unlock($1)`, migrationLockID); err != nil {
			db.log.Warn("postgres: migrate: releasing the lock failed; closing its connection", "err", err)
		}
		_ = conn.Hijack().Close(unlockCtx)
	}()
	if _, err := conn.Exec(ctx, `SET lock_timeout = '`+migrationLockTimeout+`'`); err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	ints := make([]int, len(versions))
	for i, v := range versions {
		applied[int(v)] = true
		ints[i] = int(v)
	}
	// Checked under the lock, before anything is applied: a binary older than the schema would
	// otherwise report nothing to apply and go on to serve it.
	if err := schemaNewer(ints, all); err != nil {
		return nil, err
	}
	var done []int
	for _, m := range all {
		if applied[m.version] || (upTo > 0 && m.version > upTo) {
			continue
		}
		record := func(ctx context.Context, q interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		}) error {
			_, err := q.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name)
			return err
		}
		if strings.HasPrefix(m.sql, noTransaction) {
			for _, stmt := range statements(m.sql) {
				step := func() error { _, err := conn.Exec(ctx, stmt); return err }
				if weakLock(stmt) {
					// Its lock blocks no read or write, so nothing queues behind its waits; and a
					// concurrent build given up half way would leave an invalid index behind.
					step = func() error {
						if _, err := conn.Exec(ctx, `SET lock_timeout = 0`); err != nil {
							return err
						}
						_, err := conn.Exec(ctx, stmt)
						if _, rerr := conn.Exec(ctx, `SET lock_timeout = '`+migrationLockTimeout+`'`); err == nil {
							err = rerr
						}
						return err
					}
				}
				if err := db.withLockRetry(ctx, m, step); err != nil {
					return done, fmt.Errorf("postgres: migration %04d_%s: %w", m.version, m.name, err)
				}
			}
			err = record(ctx, conn)
		} else {
			err = db.withLockRetry(ctx, m, func() error {
				return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, m.sql); err != nil {
						return err
					}
					return record(ctx, tx)
				})
			})
		}
		if err != nil {
			return done, fmt.Errorf("postgres: migration %04d_%s: %w", m.version, m.name, err)
		}
		db.log.InfoContext(ctx, "applied migration", "version", m.version, "name", m.name)
		done = append(done, m.version)
	}
	return done, nil
}

// takeMigrationLock takes the migration lock on conn, trying it between growing pauses rather
// than waiting in pg_advisory_lock: a session waiting there is a transaction open all the while,
// and a concurrent index build under the lock (CREATE INDEX CONCURRENTLY) waits for every open
// transaction to end, so replicas starting together on a fresh database deadlocked, and all but
// one failed to start.
func takeMigrationLock(ctx context.Context, conn *pgxpool.Conn) error {
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, migrationLockID).Scan(&got); err != nil {
			return err
		}
		if got {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

// withLockRetry runs step, again after a pause while it fails on its lock timeout (a statement
// that gave up its place in the lock queue lets the queries behind it run meanwhile).
func (db *DB) withLockRetry(ctx context.Context, m migration, step func() error) error {
	for try := 1; ; try++ {
		err := step()
		var pgErr *pgconn.PgError
		// 55P03 lock_not_available: the lock timeout ended the wait.
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || try == migrationLockTries {
			return err
		}
		db.log.WarnContext(ctx, "migration waited too long for a lock; trying again", "version", m.version, "name", m.name, "try", try)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(try)*100*time.Millisecond, time.Second)):
		}
	}
}

// weakLock says whether a statement takes only locks that block no read or write of the table
// (SHARE UPDATE EXCLUSIVE): a concurrent index build or drop, a constraint's validation.
func weakLock(stmt string) bool {
	up := strings.ToUpper(stmt)
	return strings.Contains(up, "CONCURRENTLY") || strings.Contains(up, "VALIDATE CONSTRAINT")
}

// statements splits a noTransaction migration into its statements: each ends with ";" at the end
// of a line. Comment lines are dropped.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(t, ";") {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, cur.String())
	}
	return out
}

type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.up.sql")
	if err != nil {
		return nil, err
	}
	var out []migration
	seen := map[int]string{}
	for _, file := range names {
		base := strings.TrimSuffix(file, ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("postgres: migration file %q is not named NNNN_name.up.sql", file)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("postgres: migrations %q and %q share version %d", prev, file, v)
		}
		seen[v] = file
		body, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}
