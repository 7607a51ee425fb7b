// Package postgrestest gives each test package a database of its own on the server named by
// TEST_DATABASE_URL, so packages that bind the same network id to different test chains never
// meet. Under CI=true a missing TEST_DATABASE_URL is a failure, elsewhere a skip.
package postgrestest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoDatabase is returned when TEST_DATABASE_URL is not set.
var ErrNoDatabase = fmt.Errorf("TEST_DATABASE_URL is not set; run 'make test'")

// Fresh drops and creates the database "<TEST_DATABASE_URL's database>_<suffix>" and returns its URL.
func Fresh(ctx context.Context, suffix string) (string, error) {
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
