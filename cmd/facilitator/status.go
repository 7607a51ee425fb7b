package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const statusUsage = `usage: facilitator status [--url URL] [--json] <what>

  authorization <network> <asset> <from> <nonce>   what happened to an EIP-3009 authorization
  payment <payment id>                              the settlement made under a payment-identifier id
  tx <transaction hash>                             one of the facilitator's settlement transactions
`

var (
	hexAddress = regexp.MustCompile(`^0[xX][0-9a-fA-F]{40}$`)
	hexHash    = regexp.MustCompile(`^0[xX][0-9a-fA-F]{64}$`)
)

// runStatus prints what the status API answers, for a person or (--json) for a script.
func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, statusUsage); fs.PrintDefaults() }
	base := getenv("FACILITATOR_URL")
	if base == "" {
		base = "http://127.0.0.1:4021"
	}
	url := fs.String("url", base, "the facilitator's base URL (FACILITATOR_URL)")
	asJSON := fs.Bool("json", false, "print the API's JSON answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("status: say what to look up")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := client.New(*url)
	var st *facilitator.AuthorizationStatus
	var err error
	found := true
	switch {
	case rest[0] == "authorization" && len(rest) == 5:
		key, kerr := authorizationKey(rest[1:])
		if kerr != nil {
			return kerr
		}
		st, found, err = c.Authorization(ctx, key)
	case rest[0] == "payment" && len(rest) == 2:
		st, err = c.Payment(ctx, rest[1])
	case rest[0] == "tx" && len(rest) == 2:
		if !hexHash.MatchString(rest[1]) {
			return fmt.Errorf("status: %q is not a 0x-prefixed 32-byte transaction hash", rest[1])
		}
		st, err = c.Settlement(ctx, common.HexToHash(rest[1]))
	default:
		fs.Usage()
		return fmt.Errorf("status: unknown lookup %q", strings.Join(rest, " "))
	}
	if errors.Is(err, client.ErrNotFound) {
		return errors.New("status: the facilitator knows nothing under that key")
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	client.PrintStatus(stdout, st, found)
	return nil
}

func authorizationKey(args []string) (facilitator.AuthorizationKey, error) {
	var key facilitator.AuthorizationKey
	if _, err := facilitator.ParseCAIP2(args[0]); err != nil {
		return key, fmt.Errorf("status: %w", err)
	}
	if !hexAddress.MatchString(args[1]) || !hexAddress.MatchString(args[2]) {
		return key, errors.New("status: asset and from must be 0x-prefixed 20-byte addresses")
	}
	if !hexHash.MatchString(args[3]) {
		return key, errors.New("status: the nonce must be 0x-prefixed 32-byte hex")
	}
	key.Network, key.Asset, key.Payer = args[0], common.HexToAddress(args[1]), common.HexToAddress(args[2])
	copy(key.Nonce[:], common.FromHex(args[3]))
	return key, nil
}
