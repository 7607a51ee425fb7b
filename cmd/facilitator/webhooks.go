package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const webhooksUsage = `usage: facilitator webhooks redeliver [--database-url URL] <webhook id> <event id>...

  redeliver  send given-up deliveries again: each is due at once, with the full retry schedule
             ahead of it (its attempts start again from 0). The webhook id is wh_…, the event
             ids those GET /v1/webhooks/{id}/deliveries lists (eventId) with gaveUpAt set.
             Reads and writes the ledger (DATABASE_URL), like keys: any merchant's webhook.

`

var webhookIDPattern = regexp.MustCompile(`^wh_[0-9a-f]{32}$`)

// runWebhooks is `facilitator webhooks`: the operator's hand on webhook deliveries.
func runWebhooks(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "redeliver" {
		if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
			fmt.Fprint(stdout, webhooksUsage)
			return nil
		}
		fmt.Fprint(stderr, webhooksUsage)
		if len(args) == 0 {
			return errors.New("webhooks: a subcommand is required")
		}
		return fmt.Errorf("webhooks: unknown subcommand %q", args[0])
	}
	fs := redeliverFlags(getenv)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, webhooksUsage); fs.PrintDefaults() }
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() < 2 || !webhookIDPattern.MatchString(fs.Arg(0)) {
		return errors.New("webhooks redeliver: want a webhook id (wh_ and 32 hex characters) and one or more event ids after the flags")
	}
	webhook := fs.Arg(0)
	var events []int64
	for _, a := range fs.Args()[1:] {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("webhooks redeliver: event id %q is not a positive integer", a)
		}
		events = append(events, id)
	}
	url := fs.Lookup("database-url").Value.String()
	if url == "" {
		return errors.New("DATABASE_URL is required")
	}
	db, err := openDB(ctx, url, newLogger(stderr, "warn", "text"))
	if err != nil {
		return err
	}
	defer db.Close()
	var failed int
	for _, ev := range events {
		due, err := db.RedeliverWebhook(ctx, facilitator.Viewer{All: true}, webhook, ev)
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "event %d: due again at %s\n", ev, due.UTC().Format(time.RFC3339))
			continue
		case errors.Is(err, facilitator.ErrNotFound):
			fmt.Fprintf(stdout, "event %d: no such delivery of %s (or the retention job removed it)\n", ev, webhook)
		case errors.Is(err, facilitator.ErrDeliveryNotGivenUp):
			fmt.Fprintf(stdout, "event %d: not given up (delivered, or still being tried): left as it is\n", ev)
		case errors.Is(err, facilitator.ErrWebhookDisabled):
			fmt.Fprintf(stdout, "event %d: %s is disabled: nothing is sent to it\n", ev, webhook)
		default:
			return fmt.Errorf("webhooks redeliver: %w", err)
		}
		failed++
	}
	if failed > 0 {
		return fmt.Errorf("webhooks redeliver: %d of %d event(s) not scheduled", failed, len(events))
	}
	return nil
}

func redeliverFlags(getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("webhooks redeliver", flag.ContinueOnError)
	fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string (DATABASE_URL)")
	return fs
}
