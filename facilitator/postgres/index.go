package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// leaseCheckEvery is how often a leader checks that the connection holding its lock is alive.
const leaseCheckEvery = time.Second

// leaseIdleTimeout ends a lease session that goes quiet (its process frozen, or cut off): Postgres
// then drops the session and its lock, and a replica takes over. A live leader pings every
// leaseCheckEvery, so it never trips.
const leaseIdleTimeout = "5s"

// lease is a held indexer lease: the connection whose session holds the advisory lock. The index's
// writes go through this connection only, so a process that lost its lock (its session ended)
// cannot write: its commits fail with the connection.
type lease struct {
	mu   sync.Mutex // one statement at a time on conn: pings, commits, the unlock
	conn *pgxpool.Conn
}

func (db *DB) setLease(network string, l *lease) {
	db.leaseMu.Lock()
	defer db.leaseMu.Unlock()
	if l == nil {
		delete(db.leases, network)
		return
	}
	db.leases[network] = l
}

func (db *DB) lease(network string) *lease {
	db.leaseMu.Lock()
	defer db.leaseMu.Unlock()
	return db.leases[network]
}

// ErrNotLeading: an index write was attempted by a process that does not hold the network's lease.
var ErrNotLeading = errors.New("postgres: this process does not hold the network's indexer lease")

// Lead takes the network's indexer lease: a session advisory lock on a connection held for as long
// as the lease. Replicas wait here and retry every second.
func (db *DB) Lead(ctx context.Context, network string) (context.Context, func(), error) {
	for {
		l, ok, err := db.takeLease(ctx, network)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			leading, cancel := context.WithCancel(ctx)
			done, stopped := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(stopped)
				// A leader whose lock connection died no longer holds the lock: stop it writing.
				t := time.NewTicker(leaseCheckEvery)
				defer t.Stop()
				for {
					select {
					case <-done:
						return
					case <-t.C:
						// Lock first: a long commit holds the connection, and its success proves the
						// session alive as well as a ping would.
						l.mu.Lock()
						pctx, pcancel := context.WithTimeout(leading, leaseCheckEvery)
						err := l.conn.Ping(pctx)
						pcancel()
						l.mu.Unlock()
						if err != nil && leading.Err() == nil {
							db.log.Warn("indexer lease connection lost", "network", network, "err", err)
							cancel()
							return
						}
					}
				}
			}()
			release := func() {
				close(done)
				<-stopped
				cancel()
				db.dropLease(network, l)
			}
			return leading, release, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// TryLead takes the network's indexer lease if no one holds it, for a job that must not run while
// an indexer writes (it would race the indexer's cursor).
func (db *DB) TryLead(ctx context.Context, network string) (release func(), ok bool, err error) {
	l, ok, err := db.takeLease(ctx, network)
	if err != nil || !ok {
		return nil, false, err
	}
	return func() { db.dropLease(network, l) }, true, nil
}

func (db *DB) takeLease(ctx context.Context, network string) (*lease, bool, error) {
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, leaseKey(network)).Scan(&got); err != nil || !got {
		conn.Release()
		return nil, false, err
	}
	if _, err := conn.Exec(ctx, `SET idle_session_timeout = '`+leaseIdleTimeout+`'`); err != nil {
		_ = conn.Conn().Close(ctx)
		conn.Release()
		return nil, false, err
	}
	l := &lease{conn: conn}
	db.setLease(network, l)
	return l, true, nil
}

func (db *DB) dropLease(network string, l *lease) {
	db.setLease(network, nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The session is not handed back to the pool: it carries the idle timeout, and it may be gone.
	_ = l.conn.Conn().Close(uctx)
	l.conn.Release()
}

// Cursor returns the last indexed block of a network.
func (db *DB) Cursor(ctx context.Context, network string) (facilitator.Block, bool, error) {
	var n int64
	var hash []byte
	err := db.pool.QueryRow(ctx, `SELECT number, hash FROM index_cursors WHERE network = $1`, network).Scan(&n, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return facilitator.Block{}, false, nil
	}
	if err != nil {
		return facilitator.Block{}, false, err
	}
	return facilitator.Block{Number: uint64(n), Hash: common.BytesToHash(hash)}, true, nil
}

// Commit writes one indexer step in one transaction: an optional rollback above a reorg's
// ancestor, the events (with COPY), the window blocks, and the cursor.
func (db *DB) Commit(ctx context.Context, network string, b facilitator.IndexBatch) error {
	l := db.lease(network)
	if l == nil {
		return ErrNotLeading
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return pgx.BeginFunc(ctx, l.conn, func(tx pgx.Tx) error {
		if b.RollbackTo != nil {
			for _, q := range []string{
				`DELETE FROM transfers WHERE network = $1 AND block_number > $2`,
				`DELETE FROM authorization_events WHERE network = $1 AND block_number > $2`,
				`DELETE FROM index_blocks WHERE network = $1 AND number > $2`,
			} {
				if _, err := tx.Exec(ctx, q, network, int64(b.RollbackTo.Number)); err != nil {
					return err
				}
			}
		}
		if len(b.Events.Transfers) > 0 {
			rows := make([][]any, len(b.Events.Transfers))
			for i, t := range b.Events.Transfers {
				rows[i] = []any{network, int64(t.BlockNumber), t.BlockHash[:], blockTime(t.BlockTime), t.TxHash[:], int32(t.LogIndex),
					t.Token[:], t.From[:], t.To[:], pgtype.Numeric{Int: t.Value, Valid: true}}
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"transfers"},
				[]string{"network", "block_number", "block_hash", "block_time", "tx_hash", "log_index", "token", "from_addr", "to_addr", "value"},
				pgx.CopyFromRows(rows)); err != nil {
				return err
			}
		}
		if len(b.Events.Auths) > 0 {
			rows := make([][]any, len(b.Events.Auths))
			for i, a := range b.Events.Auths {
				kind := "used"
				if a.Canceled {
					kind = "canceled"
				}
				rows[i] = []any{network, int64(a.BlockNumber), a.BlockHash[:], blockTime(a.BlockTime), a.TxHash[:], int32(a.LogIndex),
					a.Token[:], kind, a.Authorizer[:], a.Nonce[:]}
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"authorization_events"},
				[]string{"network", "block_number", "block_hash", "block_time", "tx_hash", "log_index", "token", "kind", "authorizer", "nonce"},
				pgx.CopyFromRows(rows)); err != nil {
				return err
			}
		}
		if len(b.Blocks) > 0 {
			nums, hashes, parents := make([]int64, len(b.Blocks)), make([][]byte, len(b.Blocks)), make([][]byte, len(b.Blocks))
			for i, bl := range b.Blocks {
				nums[i], hashes[i], parents[i] = int64(bl.Number), bl.Hash.Bytes(), bl.ParentHash.Bytes()
			}
			if _, err := tx.Exec(ctx, `INSERT INTO index_blocks (network, number, hash, parent_hash)
				SELECT $1, * FROM unnest($2::bigint[], $3::bytea[], $4::bytea[])
				ON CONFLICT (network, number) DO UPDATE SET hash = EXCLUDED.hash, parent_hash = EXCLUDED.parent_hash`,
				network, nums, hashes, parents); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO index_cursors (network, number, hash) VALUES ($1, $2, $3)
			ON CONFLICT (network) DO UPDATE SET number = EXCLUDED.number, hash = EXCLUDED.hash, updated_at = now()`,
			network, int64(b.Cursor.Number), b.Cursor.Hash[:])
		return err
	})
}

func blockTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// WindowBlocks returns the kept blocks from number from upward.
func (db *DB) WindowBlocks(ctx context.Context, network string, from uint64) ([]facilitator.Block, error) {
	rows, err := db.pool.Query(ctx, `SELECT number, hash, parent_hash FROM index_blocks
		WHERE network = $1 AND number >= $2 ORDER BY number`, network, int64(from))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (facilitator.Block, error) {
		var n int64
		var h, p []byte
		err := r.Scan(&n, &h, &p)
		return facilitator.Block{Number: uint64(n), Hash: common.BytesToHash(h), ParentHash: common.BytesToHash(p)}, err
	})
}

// PruneBlocks drops kept blocks below a number: they are final.
func (db *DB) PruneBlocks(ctx context.Context, network string, below uint64) error {
	l := db.lease(network)
	if l == nil {
		return ErrNotLeading
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.conn.Exec(ctx, `DELETE FROM index_blocks WHERE network = $1 AND number < $2`, network, int64(below))
	return err
}

// AuthorizationUse returns the indexed use or cancellation of an authorization, with the transfer
// the use made: FiatToken emits the use's Transfer as the log right after its AuthorizationUsed
// (eip3009.UsedBy reads a receipt the same way). The payer's first transfer in the transaction
// would be another authorization's where one transaction uses several of one payer's.
func (db *DB) AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error) {
	var (
		u             facilitator.AuthorizationUse
		kind          string
		blockHash, tx []byte
		block         int64
		to            []byte
		value         pgtype.Numeric
	)
	err := db.pool.QueryRow(ctx, `
		SELECT a.kind, a.block_number, a.block_hash, a.tx_hash, t.to_addr, t.value
		FROM authorization_events a
		LEFT JOIN LATERAL (
			SELECT to_addr, value FROM transfers t
			WHERE t.network = a.network AND t.block_number = a.block_number AND t.tx_hash = a.tx_hash
				AND t.log_index = a.log_index + 1 AND t.token = a.token AND t.from_addr = a.authorizer) t ON true
		WHERE a.network = $1 AND a.token = $2 AND a.authorizer = $3 AND a.nonce = $4
		ORDER BY a.block_number LIMIT 1`, network, token[:], authorizer[:], nonce[:]).
		Scan(&kind, &block, &blockHash, &tx, &to, &value)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	u.Canceled = kind == "canceled"
	u.BlockNumber, u.BlockHash, u.TxHash = uint64(block), common.BytesToHash(blockHash), common.BytesToHash(tx)
	if to != nil {
		u.To = common.BytesToAddress(to)
		u.Value = numericInt(value)
	}
	return &u, nil
}

// IndexedEvents counts a network's stored events (transfers plus authorization uses and
// cancellations): what a backfill benchmark checks against the events it emitted.
func (db *DB) IndexedEvents(ctx context.Context, network string) (int64, error) {
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM transfers WHERE network = $1)
		+ (SELECT count(*) FROM authorization_events WHERE network = $1)`, network).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("postgres: counting indexed events of %s: %w", network, err)
	}
	return n, nil
}

func leaseKey(network string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("x402-indexer:" + network))
	return int64(h.Sum64())
}

// AuthorizationUsesFrom lists a network's indexed uses of authorizations (AuthorizationUsed, not
// cancels) in blocks from from on, in chain order, at most limit: where the reconcile job looks
// for transactions of our keys the ledger lost.
func (db *DB) AuthorizationUsesFrom(ctx context.Context, network string, from uint64, limit int) ([]facilitator.AuthorizationEvent, error) {
	rows, err := db.pool.Query(ctx, `SELECT block_number, block_hash, tx_hash, log_index, token, authorizer, nonce
		FROM authorization_events WHERE network = $1 AND kind = 'used' AND block_number >= $2
		ORDER BY block_number, log_index LIMIT $3`, network, int64(from), limit)
	if err != nil {
		return nil, err
	}
	var out []facilitator.AuthorizationEvent
	var (
		block                                 int64
		blockHash, tx, token, authorizer, non []byte
		logIndex                              int32
	)
	_, err = pgx.ForEachRow(rows, []any{&block, &blockHash, &tx, &logIndex, &token, &authorizer, &non}, func() error {
		e := facilitator.AuthorizationEvent{Authorizer: common.BytesToAddress(authorizer)}
		e.BlockNumber, e.BlockHash, e.TxHash, e.LogIndex, e.Token = uint64(block), common.BytesToHash(blockHash), common.BytesToHash(tx), uint(logIndex), common.BytesToAddress(token)
		copy(e.Nonce[:], non)
		out = append(out, e)
		return nil
	})
	return out, err
}
