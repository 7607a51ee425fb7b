package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/loadgen"
	"github.com/x402-facilitator/x402-facilitator/official"
)

// runBench parses the bench flags and runs loadgen against a running local stack. The dev keys
// are split so that no two senders share a nonce sequence: the facilitator signs with #0 (and
// its extra dev signers), payers are #1-#7, the ceiling loop sends from #8, the official
// facilitator signs with #9, and the backfill's Emitter is deployed and called from a key of its
// own (devchain.BenchEmitter), since anvil has no eleventh dev account.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := loadgen.Config{}
	fs.StringVar(&cfg.FacilitatorURL, "url", "http://127.0.0.1:4021", "our facilitator (a running 'make run' stack, open auth)")
	fs.StringVar(&cfg.RPCURL, "rpc", "http://127.0.0.1:8545", "the anvil the stack settles on")
	asset := fs.String("asset", "", "the USDC token (default: where 'facilitator-dev dev' deploys it)")
	fs.DurationVar(&cfg.VerifyDuration, "duration", 10*time.Second, "how long each /verify load (one per arrival rate) and the status lookups run")
	fs.IntVar(&cfg.VerifyConcurrency, "verify-c", 32, "concurrent /verify callers in the closed loop, and the most outstanding at a fixed rate")
	rates := fs.String("verify-rates", "50,200,max", "/verify arrival rates per second, run in turn, each on distinct payments verified once; max: as fast as --verify-c callers are answered (the last rate is the table's headline /verify)")
	fs.IntVar(&cfg.VerifyN, "verify-n", 10_000, "distinct payments signed per /verify rate at most (each sent once; a rate ends when they are used up or --duration has passed)")
	fs.IntVar(&cfg.SettleK, "k", 1000, "distinct payments settled by our facilitator")
	fs.IntVar(&cfg.SettleC, "c", 64, "concurrent /settle callers (both facilitators)")
	fs.IntVar(&cfg.RefK, "k-ref", 200, "distinct payments settled by the official facilitator")
	fs.IntVar(&cfg.WebhookK, "webhook-k", 1000, "payments settled with a webhook registered at a loopback receiver, for the dispatch phase (0 skips it)")
	fs.IntVar(&cfg.Replays, "replays", 1000, "payment-identifier replays of one settled payload (0 skips)")
	fs.IntVar(&cfg.CeilingN, "ceiling-n", 1000, "pre-signed transactions per chain-ceiling mode (0 skips the ceiling)")
	fs.IntVar(&cfg.CeilingBatch, "ceiling-batch", 100, "transactions per JSON-RPC batch in the batched ceiling mode")
	fs.IntVar(&cfg.CeilingWindow, "ceiling-window", 256, "unconfirmed ceiling transactions at most (anvil 1.7.1 jams near 1,000 pending)")
	fs.IntVar(&cfg.CeilingInFlight, "ceiling-inflight", 64, "outstanding eth_sendRawTransaction requests in the one-per-request mode")
	fs.IntVar(&cfg.PID, "pid", 0, "our facilitator's process id for its memory (0: the process listening on --url's port; -1: skip)")
	fs.IntVar(&cfg.NodePID, "anvil-pid", 0, "the chain node's process id for its CPU (0: the process listening on --rpc's port; -1: skip)")
	facDB := fs.String("facilitator-database-url", "", "our facilitator's database (its DATABASE_URL), whose backends' CPU is counted (empty: Postgres CPU not measured)")
	fs.DurationVar(&cfg.RPCTimeout, "rpc-timeout", 10*time.Second, "bound on each JSON-RPC call")
	withOfficial := fs.Bool("official", true, "also run the load against the official TypeScript facilitator (needs node and node_modules)")
	script := fs.String("official-script", "", "official-facilitator.mjs (default: interop/js/ under the module root above the working directory)")
	nodeBin := fs.String("node", "node", "node binary for the official facilitator")
	refPoll := fs.Duration("ref-poll", 100*time.Millisecond, "the official facilitator's receipt polling interval (the dev stack's own is 100ms)")
	backfill := fs.Bool("backfill", true, "measure the indexer's backfill into Postgres last (needs --database-url, node and node_modules)")
	backfillEvents := fs.Int("backfill-events", 100_000, "events the backfill's Emitter emits (rounded up to whole 2,000-event calls)")
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres for the backfill (DATABASE_URL); it writes under a network id of its own, eip155:<chain>#bench-<unix time>")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %v", fs.Args())
	}
	verifyRates, err := parseRates(*rates)
	if err != nil {
		return err
	}
	cfg.VerifyRates = verifyRates

	accounts, err := devchain.DevAccounts()
	if err != nil {
		return err
	}
	for _, a := range accounts[1:8] {
		cfg.Payers = append(cfg.Payers, a.Key)
	}
	cfg.CeilingKey = accounts[8].Key
	if *asset != "" {
		if !common.IsHexAddress(*asset) {
			return fmt.Errorf("--asset %q is not an address", *asset)
		}
		cfg.Asset = common.HexToAddress(*asset)
	} else if cfg.Asset, err = devchain.DevUSDCAddress(); err != nil {
		return err
	}
	if *withOfficial {
		path := *script
		if path == "" {
			if path, err = officialScript(); err != nil {
				return err
			}
		}
		cfg.Official = &official.Config{Node: *nodeBin, Script: path, Poll: *refPoll, Key: accounts[9].Key, Stderr: stderr}
	}
	cfg.Logger = newLogger(stderr, "info")
	if *backfill {
		if *dbURL == "" {
			return errors.New("the backfill phase needs --database-url or DATABASE_URL (--backfill=false skips it)")
		}
		// Opened and migrated before any load, so that a wrong URL fails the run at once rather
		// than after minutes of it.
		db, err := openDB(ctx, *dbURL, cfg.Logger)
		if err != nil {
			return err
		}
		defer db.Close()
		migrateCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if _, err := db.Migrate(migrateCtx); err != nil {
			return err
		}
		emitter, err := devchain.BenchEmitter()
		if err != nil {
			return err
		}
		cfg.Backfill = &loadgen.Backfill{DB: db, Key: emitter.Key, Events: *backfillEvents}
	} else {
		cfg.IndexNote = "skipped (--backfill=false)"
	}
	if *facDB != "" {
		pgCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		pg, err := loadgen.OpenPGBackends(pgCtx, *facDB)
		cancel()
		if err != nil {
			return err
		}
		defer pg.Close(context.Background())
		cfg.Postgres = pg
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	return loadgen.Render(stdout, rep)
}

// parseRates reads --verify-rates: comma-separated requests per second, "max" for a closed loop.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "max" {
			out = append(out, 0)
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r <= 0 || math.IsInf(r, 0) {
			return nil, fmt.Errorf("--verify-rates: %q is neither a positive rate nor max", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// officialScript finds interop/js/official-facilitator.mjs above the working directory: the
// bench runs from a checkout, where node_modules sits beside it.
func officialScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "interop", "js", "official-facilitator.mjs")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("interop/js/official-facilitator.mjs not found above the working directory; pass --official-script or --official=false")
		}
		dir = parent
	}
}
