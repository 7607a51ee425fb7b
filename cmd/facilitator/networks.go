package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// runNetworks prints the network presets: what a network entry gets by naming one.
func runNetworks(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("networks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: facilitator networks\n\nprints the network presets a FACILITATOR_NETWORKS entry can name with \"preset\"\n")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("networks takes no arguments (got %q)", fs.Args())
	}
	return printPresets(stdout, chains.Presets())
}

// printPresets writes the presets as a table, one line each. A domain no source confirmed is
// marked, with a footnote saying what stands behind it.
func printPresets(w io.Writer, presets []chains.Preset) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRESET\tCAIP-2\tCHAIN ID\tV1 NAME\tUSDC\tEIP-712 NAME\tVERSION\tFINALITY\tCHAIN")
	unconfirmed := false
	for _, p := range presets {
		v1 := p.V1Name
		if v1 == "" {
			v1 = "-"
		}
		name := strconv.Quote(p.USDC.Name)
		if !p.DomainConfirmed {
			name += "*"
			unconfirmed = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%q\t%s\t%s\n", p.Name, p.CAIP2(), p.ChainID, v1,
			p.USDC.Address.Hex(), name, p.USDC.Version, finalityRule(p.Finality), p.Title)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if unconfirmed {
		fmt.Fprintln(w, "\n* EIP-712 domain stated by none of the sources the table was built from; serve reads it from the contract at start and refuses to start if it differs")
	}
	_, err := fmt.Fprintln(w, "\nconfigure one with {\"preset\": \"<PRESET>\", \"rpc\": \"<URL>\"}; any of id, v1Name, tokens and finality given beside it wins")
	return err
}

// finalityRule is a finality rule as an operator reads it.
func finalityRule(f facilitator.Finality) string {
	blocks := "blocks"
	if f.Depth == 1 {
		blocks = "block"
	}
	if f.Tag == "" {
		return fmt.Sprintf("depth %d %s", f.Depth, blocks)
	}
	return fmt.Sprintf("%s tag, else depth %d %s", f.Tag, f.Depth, blocks)
}
