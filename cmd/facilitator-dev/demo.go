package main

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"

	"github.com/x402-facilitator/x402-facilitator/demo"
	"github.com/x402-facilitator/x402-facilitator/devchain"
)

// runDemo is `facilitator-dev demo`: flags, the log file, then the story on a stack startDemoStack builds.
func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string of an empty database (DATABASE_URL; 'make demo' makes one)")
	logPath := fs.String("log-file", "", "file the facilitator's and anvil's logs go to (default: a new file in the temporary directory)")
	binary := fs.String("facilitator", "", "the production binary to serve with (default: 'facilitator' beside this one, else on PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("demo: DATABASE_URL is required (an empty database: 'make demo' makes one)")
	}
	bin, err := facilitatorBinary(*binary)
	if err != nil {
		return err
	}
	var f *os.File
	if *logPath == "" {
		f, err = os.CreateTemp("", "x402-demo-*.log")
	} else {
		f, err = os.Create(*logPath)
	}
	if err != nil {
		return fmt.Errorf("demo: log file: %w", err)
	}
	defer f.Close()
	return demo.Run(ctx, demo.Options{Start: startDemoStack(bin, *dbURL, f), LogPath: f.Name()}, stdout)
}

// startDemoStack starts the stack `facilitator-dev dev` runs, on free ports, but under --auth keys
// as production serves: a fresh anvil with Circle's USDC, and the production binary serving on
// dbURL (an empty database: it is bound to that fresh chain) signing with dev account #0, with one
// merchant API key made for the story's merchant (the agent has none). Both log to logs; the demo
// reads the ledger through a connection of its own.
func startDemoStack(bin, dbURL string, logs io.Writer) demo.StartFunc {
	return func(ctx context.Context) (*demo.Stack, error) {
		log := newLogger(logs, "info")
		chain, err := devchain.Start(ctx, devchain.Options{Logger: log})
		if err != nil {
			return nil, &demo.StackError{Err: err}
		}
		srv, err := startServe(ctx, stackConfig{Binary: bin, Listen: "127.0.0.1:0", DBURL: dbURL, LogLevel: "info",
			Chain: chain, Signers: []*ecdsa.PrivateKey{chain.Accounts[0].Key}, Keys: true}, logs)
		if err != nil {
			_ = chain.Close()
			return nil, &demo.StackError{Err: err}
		}
		// Serving means the database was migrated and bound to this chain.
		db, err := openDB(ctx, dbURL, log)
		if err != nil {
			_ = srv.Close()
			_ = chain.Close()
			return nil, &demo.StackError{Err: err}
		}
		key, err := merchantKey(ctx, bin, dbURL)
		if err != nil {
			db.Close()
			_ = srv.Close()
			_ = chain.Close()
			return nil, &demo.StackError{Err: err}
		}
		return &demo.Stack{
			Chain:          chain,
			FacilitatorURL: "http://" + srv.Addr,
			MerchantKey:    key,
			Ledger:         db,
			Close: func() error {
				db.Close()
				return errors.Join(srv.Close(), chain.Close())
			},
		}, nil
	}
}

// merchantKey makes the demo merchant's API key with the production binary's own `keys create`
// (verify, settle and status: its payment ids among them), and returns the key's text.
func merchantKey(ctx context.Context, bin, dbURL string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, "keys", "create", "--name", "demo merchant", "--scopes", "verify,settle,status")
	cmd.Env = append(cmd.Environ(), "DATABASE_URL="+dbURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("making the merchant's API key: %w: %s", err, out)
	}
	key := regexp.MustCompile(`x402_[0-9a-f]{12}_[0-9a-f]{64}`).Find(out)
	if key == nil {
		return "", fmt.Errorf("making the merchant's API key: keys create printed no key")
	}
	return string(key), nil
}
