// Command facilitator is the x402 facilitator: it verifies (and, later, settles) EIP-3009 USDC
// payments for merchants. main only handles signals and the exit code; Main does the wiring.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

const usage = `usage: facilitator <command> [flags]

commands:
  serve     run the facilitator HTTP API (applies pending migrations first unless --migrate=false)
  migrate   apply pending database migrations and exit (migrate status: list them, change nothing)
  networks  list the network presets (chain id, CAIP-2 id, v1 name, USDC and its EIP-712 domain,
            finality) a FACILITATOR_NETWORKS entry can name with "preset"
  index     run only the block indexer (same configuration as serve), logging its progress
  keys      create, list, rotate and revoke merchant API keys (keys create --name N --scopes verify,settle,...;
            keys rotate --grace 24h <id>: a new secret, the old one working through the grace)
  settlements stuck  list the settlements still open (signed, broadcast, mined and not final)
            longer than --older-than (10m), by state, from the ledger (--signer: one key's, what a
            retiring key has left)
  webhooks redeliver  send given-up webhook deliveries again (webhooks redeliver <wh_…> <event id>...)
  status    look up an authorization, a payment id or a transaction through the status API
  signer    the narrow signer: holds keys and signs only transferWithAuthorization calls of one token
            within gas and fee ceilings, over Clef's external API (serve --signer clef:URL uses it)
  healthcheck  ask a running facilitator's /healthz, exit 0 when it answers 200 (the image's
            HEALTHCHECK: the image has no curl)
  version   print the module version and the VCS revision this binary was built from

The local stack, the demo and the load tools are in 'facilitator-dev' (make run, make demo).

Run 'facilitator <command> -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = runServe(ctx, args[1:], getenv, stdout, stderr)
	case "status":
		err = runStatus(ctx, args[1:], getenv, stdout, stderr)
	case "index":
		err = runIndex(ctx, args[1:], getenv, stderr)
	case "migrate":
		err = runMigrate(ctx, args[1:], getenv, stdout, stderr)
	case "keys":
		err = runKeys(ctx, args[1:], getenv, stdout, stderr)
	case "settlements":
		err = runSettlements(ctx, args[1:], getenv, stdout, stderr)
	case "webhooks":
		err = runWebhooks(ctx, args[1:], getenv, stdout, stderr)
	case "signer":
		err = runSigner(ctx, args[1:], getenv, stderr)
	case "networks":
		err = runNetworks(args[1:], stdout, stderr)
	case "healthcheck":
		err = runHealthcheck(ctx, args[1:], getenv, stderr)
	case "version":
		err = runVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "facilitator: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "facilitator: %v\n", err)
		return 1
	}
}

// serviceGCPercent is the garbage collector's target for the long-running service (serve)
// when GOGC is not set: the live heap is small (about 10 MB), so collecting at four times it
// instead of Go's default twice costs about 15 MB of RSS and saved 15-25 % of the CPU per /verify
// and per settlement (docs/benchmark-history.md). GOGC, when set, is the operator's and wins.
const serviceGCPercent = 300

// tuneGC applies serviceGCPercent unless GOGC is set, and says what it applied (-1: GOGC's).
func tuneGC(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		return -1
	}
	debug.SetGCPercent(serviceGCPercent)
	return serviceGCPercent
}

func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	tuneGC(getenv)
	cfg, err := parseCommandFlags("serve", args, getenv, stderr)
	if err != nil {
		return err
	}
	if cfg.CheckConfig {
		return checkConfig(ctx, cfg, stdout)
	}
	return runUntilDone(ctx, cfg, stderr)
}

func runIndex(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := parseCommandFlags("index", args, getenv, stderr)
	if err != nil {
		return err
	}
	cfg.IndexOnly = true
	return runUntilDone(ctx, cfg, stderr)
}

// runUntilDone runs the facilitator until ctx ends (a signal), then closes it.
func runUntilDone(ctx context.Context, cfg *Config, stderr io.Writer) error {
	m := &Main{Config: cfg, Logger: newLogger(stderr, cfg.LogLevel, cfg.LogFormat)}
	if err := m.Run(ctx); err != nil {
		m.Close()
		return err
	}
	return awaitShutdown(ctx, m.Logger, m.Close)
}

// awaitShutdown waits for ctx to end (main's signal context: its cause names the signal), then
// closes, saying so before and after: an operator reading the log of a restart sees that the
// process was asked to stop, drained, and stopped, rather than a log that just ends.
func awaitShutdown(ctx context.Context, log *slog.Logger, stop func() error) error {
	<-ctx.Done()
	log.Info("shutting down: draining requests in flight, then stopping the engine, indexers and jobs", "cause", context.Cause(ctx).Error())
	start := time.Now()
	err := stop()
	if err != nil {
		log.Error("stopped, with errors", "took", time.Since(start).Round(time.Millisecond).String(), "err", err)
		return err
	}
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

const migrateUsage = `usage: facilitator migrate [--database-url URL] [status]

  (none)  apply the pending migrations and exit
  status  list the migrations (applied, with when; pending) and the schema version this binary
          knows, changing nothing; exit 1 when the database is newer than the binary

`

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	statusOnly := len(args) > 0 && args[0] == "status"
	if statusOnly {
		args = args[1:]
	}
	fs := migrateFlags(getenv)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, migrateUsage); fs.PrintDefaults() }
	url := fs.Lookup("database-url").Value
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !statusOnly && fs.NArg() == 1 && fs.Arg(0) == "status" {
		statusOnly = true
	} else if err := noArguments(fs); err != nil {
		return err
	}
	if url.String() == "" {
		return errors.New("DATABASE_URL is required")
	}
	log := newLogger(stderr, "info", "text")
	db, err := openDB(ctx, url.String(), log)
	if err != nil {
		return err
	}
	defer db.Close()
	if statusOnly {
		return migrationStatus(ctx, db, stdout)
	}
	applied, err := db.Migrate(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %d migration(s) %v\n", len(applied), applied)
	return nil
}

func migrateFlags(getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string (DATABASE_URL)")
	return fs
}

// migrationStatus prints every migration, applied or pending, and the versions of the database
// and of the binary; a database newer than the binary is the error serve and index would stop on.
func migrationStatus(ctx context.Context, db *postgres.DB, stdout io.Writer) error {
	states, err := db.Migrations(ctx)
	if err != nil {
		return err
	}
	known, err := postgres.KnownSchemaVersion()
	if err != nil {
		return err
	}
	dbVersion, pending := 0, 0
	tw := tabwriter.NewWriter(stdout, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED")
	for _, st := range states {
		applied := "pending"
		if st.AppliedAt != nil {
			applied = st.AppliedAt.UTC().Format(time.RFC3339)
			dbVersion = max(dbVersion, st.Version)
		} else {
			pending++
		}
		if !st.Known {
			applied += " (unknown to this binary)"
		}
		fmt.Fprintf(tw, "%04d\t%s\t%s\n", st.Version, st.Name, applied)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\ndatabase schema version %d; this binary knows up to %d; %d pending\n", dbVersion, known, pending)
	return db.CheckSchema(ctx)
}
