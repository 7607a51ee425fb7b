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
)

const keysUsage = `usage: facilitator keys <create|list|revoke> [flags]

  create --name N --scopes verify,settle,status,webhooks [--pay-to 0x..,0x..]
         make a key and print it, once: only its hash is stored
  list   list keys (id, name, scopes, pay-to allow-list, created, revoked)
  revoke <id>
         revoke a key; requests with it are refused from then on

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
	var name, scopes, payTo *string
	switch sub {
	case "create":
		name = fs.String("name", "", "what the key is for (shown in list)")
		scopes = fs.String("scopes", "", "comma-separated: verify, settle, status, webhooks")
		payTo = fs.String("pay-to", "", "comma-separated payTo addresses the key may be used for (empty: any)")
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
	var key auth.Key
	var revokeID string
	switch sub {
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
		key = auth.Key{Name: strings.TrimSpace(*name), Scopes: sc, PayTo: pt}
		if fs.NArg() != 0 {
			return fmt.Errorf("keys create: unexpected argument %q", fs.Arg(0))
		}
	case "revoke":
		if fs.NArg() != 1 || !auth.ValidID(fs.Arg(0)) {
			return errors.New("keys revoke: want exactly one key id (12 hex characters, as keys list shows it)")
		}
		revokeID = fs.Arg(0)
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
		fmt.Fprintf(stdout, "created key %s (%s), scopes %s%s\n", id, key.Name, joinScopes(key.Scopes), payToSuffix(&key))
		fmt.Fprintf(stdout, "\n  %s\n\nIt is shown only now; only its hash is stored. Send it as \"Authorization: Bearer <key>\".\n", full)
	case "list":
		keys, err := db.APIKeys(ctx)
		if err != nil {
			return fmt.Errorf("keys list: %w", err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tPAY-TO\tCREATED\tREVOKED")
		for _, k := range keys {
			pt := "any"
			if len(k.PayTo) > 0 {
				s := make([]string, len(k.PayTo))
				for i, a := range k.PayTo {
					s[i] = a.Hex()
				}
				pt = strings.Join(s, ",")
			}
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, joinScopes(k.Scopes), pt, k.CreatedAt.UTC().Format(time.RFC3339), revoked)
		}
		return tw.Flush()
	case "revoke":
		at, err := db.RevokeAPIKey(ctx, revokeID, time.Now())
		if errors.Is(err, auth.ErrNotFound) {
			return fmt.Errorf("keys revoke: no key %s", revokeID)
		}
		if err != nil {
			return fmt.Errorf("keys revoke: %w", err)
		}
		fmt.Fprintf(stdout, "key %s revoked at %s\n", revokeID, at.UTC().Format(time.RFC3339))
	}
	return nil
}

func joinScopes(scopes []auth.Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ",")
}

func payToSuffix(k *auth.Key) string {
	if len(k.PayTo) == 0 {
		return ", any payTo"
	}
	s := make([]string, len(k.PayTo))
	for i, a := range k.PayTo {
		s[i] = a.Hex()
	}
	return ", payTo " + strings.Join(s, ",")
}
