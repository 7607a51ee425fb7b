package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// remoteSignerURL is the URL of a "clef:<URL>" signer setting. Errors never repeat the URL.
func remoteSignerURL(spec string) (string, error) {
	u, ok := strings.CutPrefix(spec, "clef:")
	if !ok || !(strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) {
		return "", errors.New("signer: want clef:http(s)://host:port (Clef's external API, or `facilitator signer`)")
	}
	return u, nil
}

// remoteSigners connects to the remote signer spec ("clef:<URL>") for chainID and returns its keys
// as the engine signs with them. Without configured addresses it asks the signer (account_list),
// within timeout.
func remoteSigners(ctx context.Context, spec string, addrs []common.Address, chainID uint64, timeout time.Duration) (*extsigner.Endpoint, []settle.Signer, error) {
	u, err := remoteSignerURL(spec)
	if err != nil {
		return nil, nil, err
	}
	ep, err := extsigner.Dial(ctx, u, chainID)
	if err != nil {
		return nil, nil, err
	}
	if len(addrs) == 0 {
		lctx, cancel := context.WithTimeout(ctx, timeout)
		addrs, err = ep.Accounts(lctx)
		cancel()
		if err != nil {
			ep.Close()
			return nil, nil, fmt.Errorf("listing the remote signer's keys (or give --signer-addresses): %w", err)
		}
		if len(addrs) == 0 {
			ep.Close()
			return nil, nil, fmt.Errorf("the remote signer %s lists no keys", ep)
		}
	}
	out := make([]settle.Signer, len(addrs))
	for i, a := range addrs {
		out[i] = ep.Signer(a)
	}
	return ep, out, nil
}

// runSigner is `facilitator signer`: the narrow signer, holding the keys and signing only
// settlements of one token on one chain within gas and fee ceilings, over Clef's external API.
func runSigner(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("signer", flag.ContinueOnError)
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	listen := fs.String("listen", env("FACILITATOR_SIGNER_LISTEN", "127.0.0.1:8550"), "address to serve the signing API on (FACILITATOR_SIGNER_LISTEN); keep it private")
	chainID := fs.Uint64("chain-id", 0, "the only chain id signed for (required)")
	token := fs.String("token", "", "the only contract signed for: the USDC address (required)")
	maxGas := fs.Uint64("max-gas", 300_000, "the highest gas limit signed per settlement (a batch of n: n times it)")
	maxFeeGwei := fs.String("max-fee-gwei", "", "the highest fee per gas signed (maxFeePerGas or gasPrice), in gwei (required)")
	keysFile := fs.String("signer-keys-file", env("FACILITATOR_SIGNER_KEYS_FILE", ""), "file with one hex private key per line (FACILITATOR_SIGNER_KEYS_FILE; or FACILITATOR_SIGNER_KEYS)")
	logLevel := fs.String("log-level", env("FACILITATOR_LOG_LEVEL", "info"), "debug, info, warn or error")
	passwordFile := fs.String("password-file", env("FACILITATOR_SIGNER_PASSWORD_FILE", ""), "a file holding the password every request must carry (HTTP basic auth; serve's --signer URL gives it as clef:http://user:password@host:port/); none: no authentication (FACILITATOR_SIGNER_PASSWORD_FILE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !common.IsHexAddress(*token) {
		return errors.New("signer: --token must be the token's address")
	}
	fee, ok := new(big.Float).SetString(*maxFeeGwei)
	if !ok || fee.Sign() <= 0 {
		return errors.New("signer: --max-fee-gwei must be a positive number of gwei")
	}
	feeCap, _ := new(big.Float).Mul(fee, big.NewFloat(1e9)).Int(nil)
	keys, err := readSignerKeys(getenv("FACILITATOR_SIGNER_KEYS"), *keysFile)
	if err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel, "text")
	srv, err := extsigner.NewServer(extsigner.Policy{ChainID: *chainID, Token: common.HexToAddress(*token), MaxGas: *maxGas, MaxFeeCap: feeCap}, keys, log)
	if err != nil {
		return err
	}
	h, err := srv.Handler()
	if err != nil {
		return err
	}
	if *passwordFile != "" {
		b, err := os.ReadFile(*passwordFile)
		if err != nil {
			return fmt.Errorf("signer: --password-file: %w", err)
		}
		password := strings.TrimSpace(string(b))
		if password == "" {
			return errors.New("signer: --password-file is empty")
		}
		h = extsigner.RequirePassword(h, password)
	} else {
		log.Warn("the narrow signer has no password (--password-file): anything that reaches its port can ask it to sign settlements")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("signer: listening on %s: %w", *listen, err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second, IdleTimeout: 90 * time.Second}
	accounts := make([]string, 0, len(keys))
	for _, a := range srv.Accounts() {
		accounts = append(accounts, a.Hex())
	}
	slices.Sort(accounts)
	log.Info("narrow signer listening", "addr", ln.Addr().String(), "chain_id", *chainID, "token", common.HexToAddress(*token),
		"max_gas", *maxGas, "max_fee_cap", feeCap, "accounts", strings.Join(accounts, ","))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}
