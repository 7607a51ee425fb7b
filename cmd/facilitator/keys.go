package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const keysUsage = `usage: facilitator keys <create|list|rotate|revoke|budget> [flags]

  create --name N --scopes verify,settle,status,webhooks,operator [--pay-to 0x..,0x..] [--gas-budget-wei N]
         make a key and print it, once: only its hash is stored
  list   list keys (id, name, scopes, pay-to allow-list, gas budget, created, rotated, revoked)
  rotate [--grace 24h] <id>
         give a key a new secret and print it, once; the key keeps its id, name, scopes,
         pay-to, gas budget, payment ids and webhooks. The old secret keeps working for
         --grace (0: refused at once), then stops; a secret an earlier rotation replaced
         stops at once. Console sessions end when the old secret does
  revoke <id>
         revoke a key; requests with it are refused from then on, and its console
         sessions end
  budget --gas-budget-wei N|default <id>
         set a key's gas budget: wei of worst-case gas cost (gas limit x max fee per gas) its
         settlements may reserve per rolling 24 hours; 0 is unlimited, default (or none given at
         create) follows serve's --key-gas-budget-wei

Keys are sent as "Authorization: Bearer <key>". Uses DATABASE_URL (or --database-url).
`

// runKeys manages merchant API keys.
func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, keysUsage)
		return errors.New("keys: a subcommand is required")
	}
	sub := args[0]
	fs := flag.NewFlagSet("keys "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string (DATABASE_URL)")
	var name, scopes, payTo, budget *string
	var grace *time.Duration
	switch sub {
	case "create":
		name = fs.String("name", "", "what the key is for (shown in list)")
		scopes = fs.String("scopes", "", "comma-separated: verify, settle, status, webhooks, operator")
		payTo = fs.String("pay-to", "", "comma-separated payTo addresses the key may be used for (empty: any)")
		budget = fs.String("gas-budget-wei", "default", "gas budget in wei per rolling 24 hours; 0: unlimited; default: serve's --key-gas-budget-wei")
	case "budget":
		budget = fs.String("gas-budget-wei", "", "gas budget in wei per rolling 24 hours; 0: unlimited; default: serve's --key-gas-budget-wei")
	case "rotate":
		grace = fs.Duration("grace", 24*time.Hour, "how long the old secret keeps working; 0: refused at once")
	case "list", "revoke":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, keysUsage)
		return nil
	default:
		fmt.Fprint(stderr, keysUsage)
		return fmt.Errorf("keys: unknown subcommand %q", sub)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	// Check the arguments before touching the database.
	var key facilitator.APIKey
	var keyID string
	switch sub {
	case "list":
		if err := noArguments(fs); err != nil {
			return err
		}
	case "create":
		if strings.TrimSpace(*name) == "" {
			return errors.New("keys create: --name is required")
		}
		sc, err := auth.ParseScopes(*scopes)
		if err != nil {
			return fmt.Errorf("keys create: --scopes: %w", err)
		}
		pt, err := auth.ParsePayTo(*payTo)
		if err != nil {
			return fmt.Errorf("keys create: --pay-to: %w", err)
		}
		gb, err := auth.ParseGasBudget(*budget)
		if err != nil {
			return fmt.Errorf("keys create: --gas-budget-wei: %w", err)
		}
		key = facilitator.APIKey{Name: strings.TrimSpace(*name), Scopes: sc, PayTo: pt, GasBudgetWei: gb}
		if fs.NArg() != 0 {
			return fmt.Errorf("keys create: unexpected argument %q", fs.Arg(0))
		}
	case "budget":
		if *budget == "" {
			return errors.New("keys budget: --gas-budget-wei is required (a number of wei, 0 for unlimited, or default)")
		}
		gb, err := auth.ParseGasBudget(*budget)
		if err != nil {
			return fmt.Errorf("keys budget: --gas-budget-wei: %w", err)
		}
		key.GasBudgetWei = gb
		if fs.NArg() != 1 || !auth.ValidID(fs.Arg(0)) {
			return errors.New("keys budget: want exactly one key id (12 hex characters, as keys list shows it) after the flags")
		}
		keyID = fs.Arg(0)
	case "revoke":
		if fs.NArg() != 1 || !auth.ValidID(fs.Arg(0)) {
			return errors.New("keys revoke: want exactly one key id (12 hex characters, as keys list shows it)")
		}
		keyID = fs.Arg(0)
	case "rotate":
		if *grace < 0 {
			return fmt.Errorf("keys rotate: --grace %s is negative (0 refuses the old secret at once)", *grace)
		}
		if fs.NArg() != 1 || !auth.ValidID(fs.Arg(0)) {
			return errors.New("keys rotate: want exactly one key id (12 hex characters, as keys list shows it) after the flags")
		}
		keyID = fs.Arg(0)
	}
	if *url == "" {
		return errors.New("DATABASE_URL is required")
	}
	db, err := openDB(ctx, *url, newLogger(stderr, "warn", "text"))
	if err != nil {
		return err
	}
	defer db.Close()

	switch sub {
	case "create":
		full, id, hash, err := auth.Generate()
		if err != nil {
			return err
		}
		key.ID, key.Hash = id, hash
		if err := db.InsertAPIKey(ctx, &key); err != nil {
			return fmt.Errorf("keys create: %w (has 'facilitator migrate' run?)", err)
		}
		fmt.Fprintf(stdout, "created key %s (%s), scopes %s%s\n", id, key.Name, auth.ScopesText(key.Scopes), payToSuffix(&key))
		fmt.Fprintf(stdout, "\n  %s\n\nIt is shown only now; only its hash is stored. Send it as \"Authorization: Bearer <key>\".\n", full)
	case "list":
		keys, err := db.APIKeys(ctx)
		if err != nil {
			return fmt.Errorf("keys list: %w (has 'facilitator migrate' run?)", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tPAY-TO\tGAS-BUDGET-WEI\tCREATED\tROTATED\tREVOKED")
		now := time.Now()
		for _, k := range keys {
			pt := "any"
			if len(k.PayTo) > 0 {
				pt = auth.PayToText(k.PayTo)
			}
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, auth.ScopesText(k.Scopes), pt, auth.GasBudgetText(k.GasBudgetWei),
				k.CreatedAt.UTC().Format(time.RFC3339), rotatedText(k, now), revoked)
		}
		return tw.Flush()
	case "revoke":
		at, err := db.RevokeAPIKey(ctx, keyID, time.Now())
		if errors.Is(err, facilitator.ErrNotFound) {
			return fmt.Errorf("keys revoke: no key %s", keyID)
		}
		if err != nil {
			return fmt.Errorf("keys revoke: %w", err)
		}
		fmt.Fprintf(stdout, "key %s revoked at %s\n", keyID, at.UTC().Format(time.RFC3339))
	case "rotate":
		full, hash, err := auth.NewSecret(keyID)
		if err != nil {
			return err
		}
		k, err := db.RotateAPIKey(ctx, keyID, hash, time.Now(), *grace)
		if errors.Is(err, facilitator.ErrNotFound) {
			if _, lookErr := db.APIKey(ctx, keyID); lookErr == nil {
				return fmt.Errorf("keys rotate: key %s is revoked: create a new one (keys create)", keyID)
			}
			return fmt.Errorf("keys rotate: no key %s", keyID)
		}
		if err != nil {
			return fmt.Errorf("keys rotate: %w (has 'facilitator migrate' run?)", err)
		}
		old := "the old secret is refused from now on, and the key's console sessions have ended"
		if k.PreviousUntil != nil {
			old = fmt.Sprintf("the old secret keeps working until %s (--grace %s), then stops, and so do console sessions opened before now",
				k.PreviousUntil.UTC().Format(time.RFC3339), *grace)
		}
		fmt.Fprintf(stdout, "rotated key %s (%s), scopes %s%s: %s\n", k.ID, k.Name, auth.ScopesText(k.Scopes), payToSuffix(k), old)
		fmt.Fprintf(stdout, "\n  %s\n\nIt is shown only now; only its hash is stored. Send it as \"Authorization: Bearer <key>\".\n", full)
	case "budget":
		err := db.SetAPIKeyGasBudget(ctx, keyID, key.GasBudgetWei)
		if errors.Is(err, facilitator.ErrNotFound) {
			return fmt.Errorf("keys budget: no key %s", keyID)
		}
		if err != nil {
			return fmt.Errorf("keys budget: %w", err)
		}
		fmt.Fprintf(stdout, "key %s gas budget: %s\n", keyID, auth.GasBudgetText(key.GasBudgetWei))
	}
	return nil
}

func payToSuffix(k *facilitator.APIKey) string {
	if len(k.PayTo) == 0 {
		return ", any payTo"
	}
	return ", payTo " + auth.PayToText(k.PayTo)
}

// rotatedText is a key's ROTATED column: when its secret was last replaced, and until when the
// replaced one still works.
func rotatedText(k *facilitator.APIKey, now time.Time) string {
	if k.RotatedAt == nil {
		return "-"
	}
	at := k.RotatedAt.UTC().Format(time.RFC3339)
	if k.InGrace(now) {
		return at + " (old secret until " + k.PreviousUntil.UTC().Format(time.RFC3339) + ")"
	}
	return at
}
