package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

const settlementsUsage = `usage: facilitator settlements stuck [--older-than 10m] [--signer 0x..] [--limit 100] [--json]

  stuck  settlements still owed an outcome (signed, broadcast, or mined and not yet final)
         that were signed longer than --older-than ago, by state, oldest first: id, network,
         signer key, payer, authorization nonce, state, age, transaction hash. Every replica's,
         read from the ledger (DATABASE_URL or --database-url), so it answers while serve does
         not. --signer lists one key's only: with --older-than 0, what a retiring key
         (--retire-signers) has left to finish; none: it is drained.

`

// runSettlements is `facilitator settlements`: the operator's reads of the ledger.
func runSettlements(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "stuck" {
		if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
			fmt.Fprint(stdout, settlementsUsage)
			return nil
		}
		fmt.Fprint(stderr, settlementsUsage)
		if len(args) == 0 {
			return errors.New("settlements: a subcommand is required")
		}
		return fmt.Errorf("settlements: unknown subcommand %q", args[0])
	}
	fs, f := stuckFlags(getenv)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, settlementsUsage); fs.PrintDefaults() }
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if err := noArguments(fs); err != nil {
		return err
	}
	switch {
	case *f.olderThan < 0:
		return errors.New("settlements stuck: --older-than must not be negative")
	case *f.limit < 1:
		return errors.New("settlements stuck: --limit must be at least 1")
	case *f.url == "":
		return errors.New("DATABASE_URL is required")
	}
	db, err := openDB(ctx, *f.url, newLogger(stderr, "warn", "text"))
	if err != nil {
		return err
	}
	defer db.Close()
	var signer *common.Address
	if *f.signer != "" {
		if !common.IsHexAddress(*f.signer) {
			return fmt.Errorf("settlements stuck: --signer %q is not an address", *f.signer)
		}
		a := common.HexToAddress(*f.signer)
		signer = &a
	}
	// One more than asked for says whether there are more.
	stuck, err := db.StuckSettlements(ctx, *f.olderThan, *f.limit+1, signer)
	if err != nil {
		return fmt.Errorf("settlements stuck: %w (has 'facilitator migrate' run?)", err)
	}
	more := len(stuck) > *f.limit
	if more {
		stuck = stuck[:*f.limit]
	}
	if *f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(stuckJSON(stuck, more))
	}
	return printStuck(stdout, stuck, *f.olderThan, signer, more)
}

type stuckFlagSet struct {
	url       *string
	olderThan *time.Duration
	limit     *int
	asJSON    *bool
	signer    *string
}

func stuckFlags(getenv func(string) string) (*flag.FlagSet, *stuckFlagSet) {
	fs := flag.NewFlagSet("settlements stuck", flag.ContinueOnError)
	return fs, &stuckFlagSet{
		url:       fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string (DATABASE_URL)"),
		olderThan: fs.Duration("older-than", 10*time.Minute, "list the settlements signed longer ago than this and still open"),
		limit:     fs.Int("limit", 100, "list at most this many (the oldest of each state first)"),
		asJSON:    fs.Bool("json", false, "print JSON: {settlements: [...], more: bool}"),
		signer:    fs.String("signer", "", "list only the settlements of this signer key (with --older-than 0: what a retiring key has left)"),
	}
}

// stuckRow is one stuck settlement as printed: the columns of the table, and of the JSON.
type stuckRow struct {
	ID         int64  `json:"id"`
	Network    string `json:"network"`
	Signer     string `json:"signer"`
	Payer      string `json:"payer"`
	Nonce      string `json:"nonce"`
	State      string `json:"state"`
	AgeSeconds int64  `json:"ageSeconds"`
	TxHash     string `json:"txHash,omitempty"`
}

func stuckRows(stuck []postgres.StuckSettlement) []stuckRow {
	out := make([]stuckRow, len(stuck))
	for i, s := range stuck {
		out[i] = stuckRow{ID: s.ID, Network: s.Key.Network, Signer: s.Signer.Hex(), Payer: s.Key.Payer.Hex(), Nonce: hexutil.Encode(s.Key.Nonce[:]),
			State: string(s.State), AgeSeconds: int64(s.Age / time.Second)}
		if s.TxHash != (common.Hash{}) {
			out[i].TxHash = s.TxHash.Hex()
		}
	}
	return out
}

func stuckJSON(stuck []postgres.StuckSettlement, more bool) any {
	return struct {
		Settlements []stuckRow `json:"settlements"`
		More        bool       `json:"more"`
	}{stuckRows(stuck), more}
}

// printStuck prints a line per state with its count, then the table; rows come ordered by state.
func printStuck(w io.Writer, stuck []postgres.StuckSettlement, olderThan time.Duration, signer *common.Address, more bool) error {
	if len(stuck) == 0 && signer != nil {
		_, err := fmt.Fprintf(w, "no settlement of signer %s open longer than %s\n", signer.Hex(), olderThan)
		return err
	}
	if len(stuck) == 0 {
		_, err := fmt.Fprintf(w, "no settlement open longer than %s\n", olderThan)
		return err
	}
	rows := stuckRows(stuck)
	var counts []string
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].State == rows[i].State {
			j++
		}
		counts = append(counts, fmt.Sprintf("%s %d", rows[i].State, j-i))
		i = j
	}
	plus := ""
	if more {
		plus = " (and more: raise --limit)"
	}
	fmt.Fprintf(w, "%d settlement(s) open longer than %s%s: %s\n\n", len(rows), olderThan, plus, strings.Join(counts, ", "))
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNETWORK\tSIGNER\tPAYER\tNONCE\tSTATE\tAGE\tTX")
	for _, r := range rows {
		tx := r.TxHash
		if tx == "" {
			tx = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Network, r.Signer, r.Payer, r.Nonce, r.State, time.Duration(r.AgeSeconds)*time.Second, tx)
	}
	return tw.Flush()
}
