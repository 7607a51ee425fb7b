package loadgen

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// PGBackends lists, through a connection of its own, the Postgres backends connected to the
// database that connection is on: the facilitator's pool, its indexer's and jobs' connections.
// Its own backend is left out; backends of other databases (other people's work on a shared
// cluster) and the cluster's background processes (WAL writer, checkpointer), which serve every
// database at once, are not counted.
type PGBackends struct {
	mu   sync.Mutex // a pgx.Conn serves one query at a time
	conn *pgx.Conn
}

// OpenPGBackends connects to url (the facilitator's database).
func OpenPGBackends(ctx context.Context, url string) (*PGBackends, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		// pgx's error can quote the connection string's host and user, never its password; the
		// URL itself is not repeated.
		return nil, fmt.Errorf("connecting to the facilitator's database: %w", err)
	}
	return &PGBackends{conn: conn}, nil
}

// BackendPIDs implements BackendLister.
func (b *PGBackends) BackendPIDs(ctx context.Context) ([]int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rows, err := b.conn.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out, nil
}

// Close closes the connection.
func (b *PGBackends) Close(ctx context.Context) error { return b.conn.Close(ctx) }
