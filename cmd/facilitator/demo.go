package main

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/x402-facilitator/x402-facilitator/demo"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// runDemo is `facilitator demo`: flags, the log file, then the story on a stack startDemoStack builds.
func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string of an empty database (DATABASE_URL; 'make demo' makes one)")
	logPath := fs.String("log-file", "", "file the facilitator's and anvil's logs go to (default: a new file in the temporary directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("demo: DATABASE_URL is required (an empty database: 'make demo' makes one)")
	}
	var f *os.File
	var err error
	if *logPath == "" {
		f, err = os.CreateTemp("", "x402-demo-*.log")
	} else {
		f, err = os.Create(*logPath)
	}
	if err != nil {
		return fmt.Errorf("demo: log file: %w", err)
	}
	defer f.Close()
	return demo.Run(ctx, demo.Options{Start: startDemoStack(*dbURL, f), LogPath: f.Name()}, stdout)
}

// startDemoStack starts the stack `facilitator dev` runs, on free ports: a fresh anvil with
// Circle's USDC, and the facilitator on dbURL (an empty database: it is bound to that fresh
// chain) signing with dev account #0. Both log to logs.
func startDemoStack(dbURL string, logs io.Writer) demo.StartFunc {
	return func(ctx context.Context) (*demo.Stack, error) {
		log := newLogger(logs, "info", "text")
		chain, err := devchain.Start(ctx, devchain.Options{Logger: log})
		if err != nil {
			return nil, &demo.StackError{Err: err}
		}
		m := &Main{Config: devStackConfig(chain, "127.0.0.1:0", dbURL, "info",
			[]*ecdsa.PrivateKey{chain.Accounts[0].Key}), Logger: log}
		if err := m.Run(ctx); err != nil {
			_ = m.Close()
			_ = chain.Close()
			if errors.Is(err, postgres.ErrNetworkMismatch) {
				return nil, fmt.Errorf("this database already holds another chain's ledger; the demo needs an empty one ('make demo' makes one): %w", err)
			}
			return nil, &demo.StackError{Err: err}
		}
		return &demo.Stack{
			Chain:          chain,
			FacilitatorURL: "http://" + m.Addr,
			Ledger:         m.db,
			Close:          func() error { return errors.Join(m.Close(), chain.Close()) },
		}, nil
	}
}
