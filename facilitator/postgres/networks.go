package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// ErrNetworkMismatch means the database's ledger belongs to a different chain than the one
// configured under the same network id.
var ErrNetworkMismatch = errors.New("network does not match the chain this database was bound to")

// BindNetwork records which chain a network id means, the first time, and afterwards checks that
// the configured chain is still that one.
func (db *DB) BindNetwork(ctx context.Context, id string, chainID uint64, genesis common.Hash) error {
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO networks (id, chain_id, genesis_hash) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING`, id, chainID, genesis[:]); err != nil {
			return fmt.Errorf("postgres: binding network %s: %w", id, err)
		}
		var gotChain uint64
		var gotGenesis []byte
		if err := tx.QueryRow(ctx, `SELECT chain_id, genesis_hash FROM networks WHERE id = $1`, id).Scan(&gotChain, &gotGenesis); err != nil {
			return fmt.Errorf("postgres: binding network %s: %w", id, err)
		}
		if gotChain != chainID || common.BytesToHash(gotGenesis) != genesis {
			return fmt.Errorf("%w: %s is bound to chain %d with genesis %s, but the RPC serves chain %d with genesis %s",
				ErrNetworkMismatch, id, gotChain, common.BytesToHash(gotGenesis).Hex(), chainID, genesis.Hex())
		}
		return nil
	})
}

// NetworkBinding is the chain a network id is bound to (BindNetwork), read without binding it;
// facilitator.ErrNotFound when it is not bound yet, or the database has no schema yet.
func (db *DB) NetworkBinding(ctx context.Context, id string) (chainID uint64, genesis common.Hash, err error) {
	var g []byte
	err = db.pool.QueryRow(ctx, `SELECT chain_id, genesis_hash FROM networks WHERE id = $1`, id).Scan(&chainID, &g)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return 0, common.Hash{}, facilitator.ErrNotFound
	case err != nil:
		return 0, common.Hash{}, fmt.Errorf("postgres: reading network %s's binding: %w", id, err)
	}
	return chainID, common.BytesToHash(g), nil
}
