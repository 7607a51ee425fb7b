package main

import (
	"cmp"
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

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/metrics"
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

// startSignerProbes probes every remote signer's keys at once and then every interval (each
// probe bounded by timeout) until Close: a signer that goes down, or comes back, is seen in
// /readyz, the metrics and the log before a payment meets it.
func (m *Main) startSignerProbes(interval, timeout time.Duration) {
	if len(m.signers) == 0 {
		return
	}
	if interval <= 0 {
		interval = 15 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	m.stopProbes = func() { cancel(); <-done }
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			for i, ep := range m.signers {
				for _, k := range ep.Health() {
					pctx, cancelProbe := context.WithTimeout(ctx, timeout)
					err := ep.Probe(pctx, k.Address)
					cancelProbe()
					switch {
					case ctx.Err() != nil:
						return
					case err != nil && (k.Up || !k.Known):
						m.Logger.Error("remote signer down: settlements of its key answer 503 signer_unavailable", "network", m.signerNets[i], "signer", k.Address, "err", err)
					case err == nil && !k.Up && k.Known:
						m.Logger.Info("remote signer answers again", "network", m.signerNets[i], "signer", k.Address)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// remoteSignerHealth is every remote key's health, for the metrics.
func (m *Main) remoteSignerHealth() []metrics.RemoteSigner {
	var out []metrics.RemoteSigner
	for i, ep := range m.signers {
		for _, k := range ep.Health() {
			out = append(out, metrics.RemoteSigner{Network: m.signerNets[i], Address: k.Address.Hex(), Known: k.Known, Up: k.Up,
				LastSigned: k.LastSigned, Refusals: k.Refusals})
		}
	}
	return out
}

// readySigners is what /readyz says of each remote key and each retiring one: "network/address"
// to its state.
func (m *Main) readySigners() map[string]string {
	out := map[string]string{}
	now := time.Now()
	for i, ep := range m.signers {
		for _, k := range ep.Health() {
			state := "not contacted yet"
			switch {
			case k.Known && k.Up && !k.LastSigned.IsZero():
				state = fmt.Sprintf("ok, last signature %s ago", now.Sub(k.LastSigned).Round(time.Second))
			case k.Known && k.Up:
				state = "ok"
			case k.Known:
				state = "down: " + k.State
			}
			out[m.signerNets[i]+"/"+k.Address.Hex()] = state
		}
	}
	if m.engine != nil {
		for _, st := range m.engine.Signers() {
			if !st.Retiring {
				continue
			}
			key := st.Network + "/" + st.Address.Hex()
			state := retiringState(st)
			if remote, ok := out[key]; ok {
				state += "; remote signer " + remote
			}
			out[key] = state
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// retiringState is what /readyz says of a retiring key: what it has left to finish here, or that
// it is drained and can be removed.
func retiringState(st settle.SignerHealth) string {
	switch {
	case !st.Leased:
		return "retiring: held by another instance, whose /readyz tells what it has open"
	case st.Open > 0:
		return fmt.Sprintf("retiring: %d open settlement(s) to finish from it", st.Open)
	}
	return "retiring: drained (nothing open); it can be removed from the signer keys"
}

// runSigner is `facilitator signer`: the narrow signer, holding the keys and signing only
// settlements of one token on one chain, of authorizations their payers signed, within gas and
// fee ceilings and a window's bounds, over Clef's external API.
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
	tokenName := fs.String("token-name", "", "the token's EIP-712 domain name, which the authorizations' signatures are checked in (default: the network preset's, for its USDC)")
	tokenVersion := fs.String("token-version", "", "the token's EIP-712 domain version (default: the network preset's, for its USDC)")
	allowWallets := fs.Bool("allow-contract-wallets", false, "also sign authorizations of contract wallets (ERC-1271, ERC-6492), whose signatures this signer cannot check")
	window := fs.Duration("window", extsigner.DefaultWindow.Period, "the period the transaction and gas bounds count over")
	maxTxs := fs.Int("max-txs-per-window", extsigner.DefaultWindow.MaxTxs, "the most transactions (a settlement or a batch; its fee bumps count once) signed per window, across the keys")
	maxWindowGas := fs.Uint64("max-gas-per-window", extsigner.DefaultWindow.MaxGas, "the most gas (the transactions' limits) signed per window, across the keys")
	keysFile := fs.String("signer-keys-file", env("FACILITATOR_SIGNER_KEYS_FILE", ""), "file with one hex private key per line (FACILITATOR_SIGNER_KEYS_FILE; or FACILITATOR_SIGNER_KEYS)")
	logLevel := fs.String("log-level", env("FACILITATOR_LOG_LEVEL", "info"), "debug, info, warn or error")
	passwordFile := fs.String("password-file", env("FACILITATOR_SIGNER_PASSWORD_FILE", ""), "a file holding the password every request must carry (HTTP basic auth; serve's --signer URL gives it as clef:http://user:password@host:port/); none: no authentication (FACILITATOR_SIGNER_PASSWORD_FILE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArguments(fs); err != nil {
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
	if *chainID == 0 {
		return errors.New("signer: --chain-id is required")
	}
	if *window <= 0 || *maxTxs <= 0 || *maxWindowGas == 0 {
		return errors.New("signer: --window, --max-txs-per-window and --max-gas-per-window must be positive")
	}
	name, version, err := signerTokenDomain(*chainID, common.HexToAddress(*token), *tokenName, *tokenVersion)
	if err != nil {
		return err
	}
	keys, err := readSignerKeys(getenv("FACILITATOR_SIGNER_KEYS"), *keysFile)
	if err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel, "text")
	policy := extsigner.Policy{ChainID: *chainID, Token: common.HexToAddress(*token), TokenName: name, TokenVersion: version,
		AllowContractWallets: *allowWallets, MaxGas: *maxGas, MaxFeeCap: feeCap,
		Window: extsigner.Window{Period: *window, MaxTxs: *maxTxs, MaxGas: *maxWindowGas}}
	srv, err := extsigner.NewServer(policy, keys, log)
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
	if *allowWallets {
		log.Warn("contract wallets allowed (--allow-contract-wallets): their authorizations' signatures are not checked, so a compromised facilitator can make the keys pay for calls that revert, up to the window's bounds")
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
		"token_name", name, "token_version", version, "max_gas", *maxGas, "max_fee_gwei", facilitator.Gwei(feeCap), "allow_contract_wallets", *allowWallets,
		"window", *window, "max_txs_per_window", *maxTxs, "max_gas_per_window", *maxWindowGas, "accounts", strings.Join(accounts, ","))
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

// signerTokenDomain is the token's EIP-712 name and version the narrow signer checks signatures
// in: as given, or else the network preset's whose chain id and USDC are chainID and token.
func signerTokenDomain(chainID uint64, token common.Address, name, version string) (string, string, error) {
	if name != "" && version != "" {
		return name, version, nil
	}
	for _, p := range chains.Presets() {
		if p.ChainID == chainID && p.USDC.Address == token {
			return cmp.Or(name, p.USDC.Name), cmp.Or(version, p.USDC.Version), nil
		}
	}
	return "", "", fmt.Errorf("signer: --token-name and --token-version are required: %s on chain %d is no network preset's USDC (its EIP-712 domain name and version: the token's name() and version())", token, chainID)
}
