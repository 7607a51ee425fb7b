package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Signer leases (ARCHITECTURE.md invariant 7). A process uses a signer key only while it holds the key's
// lease: a session advisory lock taken on a connection of the lease's own, pinged every second
// and set to end when idle (leaseIdleTimeout), so that Postgres drops the lock of a process that
// died, froze or was cut off, and a replica takes the key over.
//
// The key's nonce-allocating writes (a new settlement, a fee-bump replacement) run on that same
// session. A commit on the session that holds the lock proves the lock was held at commit time:
// a process that lost its lease cannot commit a transaction for the key, so the next holder,
// which reads the ledger only after it got the lock, sees every row the previous holder wrote.
//
// To run the ledger's own statements (settlements.go) on that session unchanged, the lease's
// connection is the one connection of a pool of its own, which is never allowed to open a second:
// if the session dies, every later statement fails instead of running on a fresh session that does
// not hold the lock.

// leaseAcquireWait bounds how long a lease check waits for the lease's connection while a write
// holds it (a write is bounded by settle's leaseWriteTimeout); a session busy with a statement is
// not idle, so it keeps its lock meanwhile.
const leaseAcquireWait = 10 * time.Second

// errLeaseSessionGone: the lease's session ended; nothing more runs on the lease.
var errLeaseSessionGone = errors.New("postgres: the signer lease's session ended: this process no longer holds the key")

// LeaseSigner takes a signer key's lease; see settle.Leaser. It returns (nil, nil) when another
// process holds the key (after queueing for up to wait, when wait > 0).
func (db *DB) LeaseSigner(ctx context.Context, network string, signer common.Address, wait time.Duration) (facilitator.SignerLease, error) {
	key := signerLeaseKey(network, signer)
	if wait <= 0 {
		// A look first, through the shared pool: a replica retrying every second for keys another
		// holds does not open a connection each time.
		held, err := db.advisoryLocked(ctx, key)
		if err != nil || held {
			return nil, err
		}
	}
	pool, err := db.leasePool(ctx)
	if err != nil {
		return nil, err
	}
	l, err := db.takeSignerLease(ctx, pool, network, signer, key, wait)
	if err != nil || l == nil {
		pool.Close() // the session, and any lock it got, ends here
		return nil, err
	}
	go l.keep()
	return l, nil
}

func (db *DB) takeSignerLease(ctx context.Context, pool *pgxpool.Pool, network string, signer common.Address, key int64, wait time.Duration) (*signerLease, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	got := false
	if wait <= 0 {
		err = conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got)
	} else {
		// Queue behind the holder: the holder sees a waiter and may hand the key over.
		if _, err = conn.Exec(ctx, fmt.Sprintf(`SET lock_timeout = %d`, wait.Milliseconds())); err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				got = true
			case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available: still held
				err = nil
			}
			if err == nil && got {
				_, err = conn.Exec(ctx, `RESET lock_timeout`)
			}
		}
	}
	if err != nil || !got {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `SET idle_session_timeout = '`+leaseIdleTimeout+`'`); err != nil {
		return nil, err
	}
	var epoch int64
	err = conn.QueryRow(ctx, `
		INSERT INTO signer_leases (network, signer, holder, session_pid) VALUES ($1, $2, $3, pg_backend_pid())
		ON CONFLICT (network, signer) DO UPDATE SET holder = EXCLUDED.holder, session_pid = EXCLUDED.session_pid,
			epoch = signer_leases.epoch + 1, acquired_at = now(), renewed_at = now(), released_at = NULL
		RETURNING epoch`, network, signer[:], leaseHolder()).Scan(&epoch)
	if err != nil {
		return nil, err
	}
	return &signerLease{
		db: &DB{pool: pool, log: db.log}, pool: pool, log: db.log,
		network: network, signer: signer, key: key, epoch: epoch,
		lost: make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{}),
	}, nil
}

// leasePool is a pool of exactly one connection, for one lease's session: it never replaces it
// (no lifetime, no idle limit) and refuses to open another once the first was opened.
func (db *DB) leasePool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg := db.pool.Config()
	const forever = 100 * 365 * 24 * time.Hour
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	cfg.MaxConnLifetime, cfg.MaxConnLifetimeJitter, cfg.MaxConnIdleTime = forever, 0, forever
	cfg.HealthCheckPeriod = time.Hour // nothing to do for it: the lease checks its session itself
	var opened atomic.Bool
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if !opened.CompareAndSwap(false, true) {
			return errLeaseSessionGone
		}
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: signer lease: %w", err)
	}
	return pool, nil
}

// advisoryLocked reports whether any session of this database holds the advisory lock key.
func (db *DB) advisoryLocked(ctx context.Context, key int64) (bool, error) {
	var held bool
	err := db.pool.QueryRow(ctx, `SELECT EXISTS (`+advisoryLockSQL+` AND granted)`, int64(uint64(key)>>32), int64(uint32(key))).Scan(&held)
	return held, err
}

// advisoryLockSQL selects pg_locks' entries of a bigint advisory lock ($1 its high half, $2 its
// low half) in the current database.
const advisoryLockSQL = `SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`

// signerLease is a held signer lease.
type signerLease struct {
	db      *DB // over pool: every statement runs on the session that holds the lock
	pool    *pgxpool.Pool
	log     *slog.Logger
	network string
	signer  common.Address
	key     int64
	epoch   int64

	wanted   atomic.Bool
	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopped  chan struct{}
	release  sync.Once
}

func (l *signerLease) Lost() <-chan struct{} { return l.lost }
func (l *signerLease) Wanted() bool          { return l.wanted.Load() }

func (l *signerLease) isLost() bool {
	select {
	case <-l.lost:
		return true
	default:
		return false
	}
}

// markLost ends the lease: the engine stops using the key, and the session is closed so that its
// lock (if it still holds it) goes to the next holder.
func (l *signerLease) markLost() {
	l.lostOnce.Do(func() {
		close(l.lost)
		go l.pool.Close() // waits for a statement in progress, bounded by its own timeout
	})
}

// keep checks the session every second. The check renews the lease's row (naming this session
// and epoch, so it also fails if the row names another holder) and reads whether another process
// queues for the lock.
func (l *signerLease) keep() {
	defer close(l.stopped)
	t := time.NewTicker(leaseCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		if err := l.check(); err != nil {
			select {
			case <-l.stop:
				return
			default:
			}
			l.log.Warn("signer lease lost", "network", l.network, "signer", l.signer, "err", err)
			l.markLost()
			return
		}
	}
}

func (l *signerLease) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), leaseAcquireWait)
	defer cancel()
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	qctx, qcancel := context.WithTimeout(ctx, 2*leaseCheckEvery)
	defer qcancel()
	var renewed int
	var wanted bool
	err = conn.QueryRow(qctx, `
		WITH renewed AS (
			UPDATE signer_leases SET renewed_at = now()
			WHERE network = $3 AND signer = $4 AND epoch = $5 AND session_pid = pg_backend_pid() RETURNING 1)
		SELECT (SELECT count(*) FROM renewed), EXISTS (`+advisoryLockSQL+` AND NOT granted)`,
		int64(uint64(l.key)>>32), int64(uint32(l.key)), l.network, l.signer[:], l.epoch).Scan(&renewed, &wanted)
	if err != nil {
		return err
	}
	if renewed != 1 {
		return errors.New("postgres: the signer lease's row names another holder")
	}
	l.wanted.Store(wanted)
	return nil
}

// Release gives the lease back: the session ends, and its lock with it.
func (l *signerLease) Release() {
	l.release.Do(func() {
		close(l.stop)
		<-l.stopped
		if !l.isLost() {
			l.unlock()
		}
		l.markLost()
		l.pool.Close()
	})
}

// unlock gives the lock back on the lease's own session and closes that session while holding
// its one connection, so that no write can run on it after the unlock. Closing alone ends the
// session too, but Postgres frees a session's locks when its backend exits, a moment after the
// client has gone: a process asking right after Release found the key still held (a loaded CI
// run). With the unlock, the key is free when Release returns.
func (l *signerLease) unlock() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return // the session ends with the pool, and its lock with it
	}
	defer conn.Release()
	defer conn.Conn().Close(ctx) // before Release: the pool drops it and never opens another
	_, _ = conn.Exec(ctx, `
		WITH released AS (
			UPDATE signer_leases SET released_at = now() WHERE network = $1 AND signer = $2 AND epoch = $3 RETURNING 1)
		SELECT pg_advisory_unlock($4), (SELECT count(*) FROM released)`,
		l.network, l.signer[:], l.epoch, l.key)
}

// InsertSettlement commits a new settlement on the lease's session; see DB.InsertSettlement.
func (l *signerLease) InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error) {
	if l.isLost() {
		return 0, errLeaseSessionGone
	}
	return l.db.InsertSettlement(ctx, s)
}

// InsertSettlements commits new settlements on the lease's session; see DB.InsertSettlements.
func (l *signerLease) InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error) {
	if l.isLost() {
		return nil, errLeaseSessionGone
	}
	return l.db.InsertSettlements(ctx, rows)
}

// AddTx records a replacement transaction on the lease's session; see DB.AddTx.
func (l *signerLease) AddTx(ctx context.Context, id int64, tx facilitator.TxRecord) error {
	if l.isLost() {
		return errLeaseSessionGone
	}
	return l.db.AddTx(ctx, id, tx)
}

// MoveNonce records a re-signed transaction on the lease's session; see DB.MoveNonce.
func (l *signerLease) MoveNonce(ctx context.Context, id int64, txNonce uint64, tx facilitator.TxRecord) error {
	if l.isLost() {
		return errLeaseSessionGone
	}
	return l.db.MoveNonce(ctx, id, txNonce, tx)
}

func signerLeaseKey(network string, signer common.Address) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("x402-signer:" + network + ":" + strings.ToLower(signer.Hex())))
	return int64(h.Sum64())
}

// leaseHolder names this process in signer_leases.
func leaseHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "?"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}
