package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// runFill parses the fill flags and grows a ledger synthetically, for measuring costs as it grows.
func runFill(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "the ledger to grow (DATABASE_URL)")
	rows := fs.Int("rows", 1_000_000, "settlements to add (each with its transaction, 4 events, indexed logs; a payment id for every other)")
	network := fs.String("network", "", "the network id the rows are written under (default: fill:<unix time>, never one the facilitator serves)")
	payers := fs.Int("payers", 10_000, "distinct payers the rows spread over")
	payees := fs.Int("payees", 1_000, "distinct payees the rows spread over")
	// A chunk is one transaction, and an open write transaction holds back the server-wide
	// snapshot horizon that webhook dispatch reads events below: smaller chunks delay the
	// webhooks of every database on the server less while a fill runs.
	chunk := fs.Int("chunk", 50_000, "settlements per transaction")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("fill: unexpected arguments %v", fs.Args())
	}
	if *dbURL == "" {
		return errors.New("fill: --database-url or DATABASE_URL is required")
	}
	if *rows <= 0 || *chunk <= 0 {
		return errors.New("fill: --rows and --chunk must be positive")
	}
	if *network == "" {
		*network = fmt.Sprintf("fill:%d", time.Now().Unix())
	}
	log := newLogger(stderr, "info")
	db, err := openDB(ctx, *dbURL, log)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		return err
	}
	start := time.Now()
	err = db.FillSynthetic(ctx, postgres.Fill{Network: *network, Rows: *rows, Payers: *payers, Payees: *payees, Chunk: *chunk,
		Progress: func(done int) {
			if done%1_000_000 == 0 || done == *rows {
				log.Info("fill", "rows", done, "elapsed", time.Since(start).Round(time.Second))
			}
		}})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "added %d settlements under %s in %s\n", *rows, *network, time.Since(start).Round(time.Millisecond))
	return err
}
