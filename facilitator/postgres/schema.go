package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/migrations"
)

// SchemaNewerError is a database migrated by a newer release than this binary: it has migrations
// the binary does not know, so the binary's queries may no longer match its tables, and what it
// would write may break the newer replicas' invariants. The fix is the newer binary, never a
// step back of the schema by hand while those replicas run.
type SchemaNewerError struct {
	Database int   // the highest version applied
	Binary   int   // the highest version this binary carries
	Unknown  []int // the applied versions this binary does not carry
}

func (e *SchemaNewerError) Error() string {
	return fmt.Sprintf("postgres: the database schema is at version %d, newer than this binary knows (%d; it lacks migration(s) %v): "+
		"upgrade this binary to the release that applied them (an older binary must not serve a newer schema)", e.Database, e.Binary, e.Unknown)
}

// schemaNewer is the refusal for a database whose applied versions include ones not in known
// (sorted), nil when every applied version is known.
func schemaNewer(applied []int, known []migration) error {
	var unknown []int
	for _, v := range applied {
		if !slices.ContainsFunc(known, func(m migration) bool { return m.version == v }) {
			unknown = append(unknown, v)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	binary := 0
	if len(known) > 0 {
		binary = known[len(known)-1].version
	}
	return &SchemaNewerError{Database: slices.Max(applied), Binary: binary, Unknown: unknown}
}

// MigrationState is one migration as `migrate status` shows it: known to this binary, applied to
// the database, or both.
type MigrationState struct {
	Version   int
	Name      string     // "" for one applied by a binary that knows it and this one does not
	AppliedAt *time.Time // nil: pending
	Known     bool       // this binary carries it
}

// KnownSchemaVersion is the highest migration this binary carries.
func KnownSchemaVersion() (int, error) {
	all, err := loadMigrations(migrations.FS)
	if err != nil || len(all) == 0 {
		return 0, err
	}
	return all[len(all)-1].version, nil
}

// Migrations lists every migration this binary carries and every one the database has applied,
// by version, without changing anything (a database never migrated has every one pending).
func (db *DB) Migrations(ctx context.Context) ([]MigrationState, error) {
	all, err := loadMigrations(migrations.FS)
	if err != nil {
		return nil, err
	}
	applied, err := db.appliedMigrations(ctx)
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*MigrationState{}
	for _, m := range all {
		byVersion[m.version] = &MigrationState{Version: m.version, Name: m.name, Known: true}
	}
	for _, a := range applied {
		st, ok := byVersion[a.Version]
		if !ok {
			st = &MigrationState{Version: a.Version, Name: a.Name}
			byVersion[a.Version] = st
		}
		st.AppliedAt = a.AppliedAt
	}
	out := make([]MigrationState, 0, len(byVersion))
	for _, st := range byVersion {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b MigrationState) int { return a.Version - b.Version })
	return out, nil
}

// CheckSchema refuses (SchemaNewerError) a database migrated past what this binary knows: what a
// start without migrating (--migrate=false) asks.
func (db *DB) CheckSchema(ctx context.Context) error {
	all, err := loadMigrations(migrations.FS)
	if err != nil {
		return err
	}
	applied, err := db.appliedMigrations(ctx)
	if err != nil {
		return err
	}
	versions := make([]int, len(applied))
	for i, a := range applied {
		versions[i] = a.Version
	}
	return schemaNewer(versions, all)
}

// appliedMigrations reads schema_migrations, none when it does not exist yet.
func (db *DB) appliedMigrations(ctx context.Context) ([]MigrationState, error) {
	var exists bool
	if err := db.pool.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("postgres: reading the schema version: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.pool.Query(ctx, `SELECT version, name, applied_at FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("postgres: reading the schema version: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (MigrationState, error) {
		var st MigrationState
		var at time.Time
		err := row.Scan(&st.Version, &st.Name, &at)
		st.AppliedAt = &at
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: reading the schema version: %w", err)
	}
	return out, nil
}
