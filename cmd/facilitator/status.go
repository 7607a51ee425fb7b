package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

const statusUsage = `usage: facilitator status [--url URL] [--api-key KEY] [--json] <what>

  authorization <network> <asset> <from> <nonce>   what happened to an EIP-3009 authorization
  payment <payment id>                              the settlement made under a payment-identifier id
  tx <transaction hash>                             one of the facilitator's settlement transactions

Without a key, authorization and tx read the public view (a payer's own receipt: no payment ids);
payment always needs a key with the status scope.
`

var (
	hexAddress = regexp.MustCompile(`^0[xX][0-9a-fA-F]{40}$`)
	hexHash    = regexp.MustCompile(`^0[xX][0-9a-fA-F]{64}$`)
)

// runStatus prints what the status API answers, for a person or (--json) for a script.
func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs, api, asJSON := statusFlags(getenv)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, statusUsage); fs.PrintDefaults() }
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
	c := api.client()
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
		return keyHint(err, "status")
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	client.PrintStatus(stdout, st, found)
	return nil
}

// statusFlags is status's flag set: the API's address and key (apiFlags), and --json.
func statusFlags(getenv func(string) string) (*flag.FlagSet, *apiFlags, *bool) {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	api := addAPIFlags(fs, getenv)
	return fs, api, fs.Bool("json", false, "print the API's JSON answer")
}

// apiFlags are the flags of a command that calls the HTTP API: where it is, and the API key its
// routes ask for under --auth keys (the default).
type apiFlags struct {
	url, key *string
	getenv   func(string) string
}

func addAPIFlags(fs *flag.FlagSet, getenv func(string) string) *apiFlags {
	base := getenv("FACILITATOR_URL")
	if base == "" {
		base = "http://127.0.0.1:4021"
	}
	// The key's default is read after parsing, not given to the flag: a flag's default is printed
	// by -h, and the key is a secret.
	return &apiFlags{
		url:    fs.String("url", base, "the facilitator's base URL (FACILITATOR_URL)"),
		key:    fs.String("api-key", "", "the API key sent as \"Authorization: Bearer <key>\" (FACILITATOR_API_KEY); none: no header, as --auth open needs"),
		getenv: getenv,
	}
}

// client is the API client the flags describe. The key travels only in the Authorization header:
// the client's errors carry the answer's status and reason, never the request's headers.
func (f *apiFlags) client() *client.Client {
	key := strings.TrimSpace(*f.key)
	if key == "" {
		key = strings.TrimSpace(f.getenv("FACILITATOR_API_KEY"))
	}
	if key == "" {
		return client.New(*f.url)
	}
	return client.New(*f.url, client.WithHeader("Authorization", "Bearer "+key))
}

// keyHint adds to a refusal of the key (401: none or not a key; 403: not the scope) what to do,
// naming the scope the command's route needs.
func keyHint(err error, scope facilitator.Scope) error {
	var ce *client.Error
	switch {
	case errors.As(err, &ce) && ce.Status == http.StatusUnauthorized:
		return fmt.Errorf("%w (give an API key with the %s scope: --api-key or FACILITATOR_API_KEY; 'facilitator keys create' makes one)", err, scope)
	case errors.As(err, &ce) && ce.Status == http.StatusForbidden:
		return fmt.Errorf("%w (the API key lacks the %s scope, or may not see this payment)", err, scope)
	}
	return err
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
