// Each test package gets a database of its own on the server named by TEST_DATABASE_URL, so
// packages that bind the same network id to different test chains never meet.

package stacktest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoDatabase is returned when TEST_DATABASE_URL is not set.
var ErrNoDatabase = fmt.Errorf("TEST_DATABASE_URL is not set; run 'make test'")

// FreshDB drops and creates the database "<TEST_DATABASE_URL's database>_<suffix>" and returns its URL.
func FreshDB(ctx context.Context, suffix string) (string, error) {
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		return "", ErrNoDatabase
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("TEST_DATABASE_URL: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/") + "_" + suffix
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	// FORCE cannot end a session this role does not own (an autovacuum worker on the old database,
	// say): those finish within moments, so try again a few times.
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		if err == nil {
			break
		}
		if attempt >= 20 || ctx.Err() != nil {
			return "", err
		}
		time.Sleep(250 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// NewDB is FreshDB for one test (not migrated: a binary under test migrates its own); without
// TEST_DATABASE_URL the test fails under CI=true and is skipped elsewhere.
func NewDB(t testing.TB, suffix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := FreshDB(ctx, suffix)
	if err != nil {
		missing(t, "this test needs Postgres (TEST_DATABASE_URL; run 'make test'): %v", err)
	}
	return u
}
