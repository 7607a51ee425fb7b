package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestMigrateStatusAndNewerSchema: `migrate status` lists applied and pending migrations and the
// version the binary knows, changing nothing; and a database a newer release migrated (a version
// this binary lacks) is refused by migrate, serve and index alike, naming both versions and the
// fix, where it used to say "applied 0" and serve.
func TestMigrateStatusAndNewerSchema(t *testing.T) {
	dbURL := stacktest.NewDB(t, "opcli_schema")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	known, err := postgres.KnownSchemaVersion()
	if err != nil || known == 0 {
		t.Fatalf("known version %d, %v", known, err)
	}
	cli := func(env map[string]string, args ...string) (int, string) {
		var out, errs bytes.Buffer
		code := run(ctx, args, func(k string) string { return env[k] }, &out, &errs)
		return code, out.String() + errs.String()
	}
	env := map[string]string{"DATABASE_URL": dbURL}

	code, out := cli(env, "migrate", "status")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("database schema version 0; this binary knows up to %d; %d pending", known, known)) ||
		!regexp.MustCompile(`0001 +networks +pending`).MatchString(out) {
		t.Fatalf("status of an empty database: exit %d\n%s", code, out)
	}
	if code, again := cli(env, "migrate", "status"); code != 0 || again != out {
		t.Fatalf("migrate status changed the database: exit %d\n%s", code, again)
	}
	if code, out := cli(env, "migrate"); code != 0 || !strings.Contains(out, fmt.Sprintf("applied %d migration(s)", known)) {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	// Flags go after the subcommand too.
	code, out = cli(nil, "migrate", "status", "--database-url", dbURL)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("database schema version %d; this binary knows up to %d; 0 pending", known, known)) ||
		strings.Contains(out, "  pending\n") {
		t.Fatalf("status of a migrated database: exit %d\n%s", code, out)
	}

	// A newer release applies a migration this binary does not carry.
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	newer := known + 1
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_a_newer_release')`, newer); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("the database schema is at version %d, newer than this binary knows (%d", newer, known)
	refused := func(what string, code int, out string) {
		t.Helper()
		if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "upgrade this binary") {
			t.Errorf("%s on a newer schema: exit %d, want 1 and %q:\n%s", what, code, want, out)
		}
	}
	code, out = cli(env, "migrate", "status")
	refused("migrate status", code, out)
	if !regexp.MustCompile(fmt.Sprintf(`%04d +from_a_newer_release +\S+ \(unknown to this binary\)`, newer)).MatchString(out) {
		t.Errorf("migrate status does not list the unknown migration:\n%s", out)
	}
	code, out = cli(env, "migrate")
	refused("migrate", code, out)
	if strings.Contains(out, "applied 0") {
		t.Errorf("migrate says it applied nothing, as if all were well:\n%s", out)
	}

	networks, _ := json.Marshal([]map[string]any{{
		"id": "eip155:31337", "rpc": "http://127.0.0.1:1", // never dialled: the schema is checked first
		"tokens": []map[string]string{{"address": "0x5FbDB2315678afecb367f032d93F642f64180aa3", "name": "USD Coin", "version": "2"}},
	}})
	serveEnv := map[string]string{
		"DATABASE_URL": dbURL, "FACILITATOR_NETWORKS": string(networks), "FACILITATOR_LISTEN": "127.0.0.1:0",
		"FACILITATOR_SIGNER_KEYS": "0x" + strings.Repeat("11", 32), "FACILITATOR_AUTH": "open",
	}
	for _, args := range [][]string{{"serve"}, {"serve", "--migrate=false"}, {"index"}, {"index", "--migrate=false"}} {
		code, out := cli(serveEnv, args...)
		refused(strings.Join(args, " "), code, out)
	}
}
