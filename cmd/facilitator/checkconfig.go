package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/robfig/cron/v3"

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// checkConfig is `serve --check-config`: the start-up checks serve makes, and a few it cannot
// make without failing to start, run against the real dependencies and reported one line each,
// without writing anything (no migration, no network binding, no lease). It returns an error when
// any check failed, so a deploy pipeline can stop on it.
func checkConfig(ctx context.Context, cfg *Config, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	failed := 0
	fail := "FAIL"
	if terminal(out) {
		fail = "\x1b[31mFAIL\x1b[0m" // red, for a person at a terminal; plain in a pipeline's log
	}
	report := func(what string, err error) {
		if err != nil {
			failed++
			fmt.Fprintf(out, "%s  %s: %v\n", fail, what, err)
			return
		}
		fmt.Fprintf(out, "ok    %s\n", what)
	}
	if err := cfg.Check(); err != nil {
		report("configuration", err)
		return fmt.Errorf("the configuration check failed: %w", err)
	}
	report("configuration", nil)
	networks, err := cfg.Domain()
	if err != nil {
		report("networks", err)
		return err
	}
	report(fmt.Sprintf("listen address %s can be bound", cfg.Listen), checkListen(cfg.Listen))
	for _, j := range []struct{ flag, spec string }{{"reconcile-schedule", cfg.ReconcileSchedule},
		{"index-health-schedule", cfg.IndexHealthSchedule}, {"retention-schedule", cfg.RetentionSchedule}} {
		report(fmt.Sprintf("--%s %q is a cron schedule", j.flag, j.spec), checkSchedule(j.spec))
	}

	m := &Main{Config: cfg, Logger: slog.New(slog.DiscardHandler)}
	defer func() {
		for _, c := range m.clients {
			c.Close()
		}
	}()
	db, err := openDB(ctx, cfg.DatabaseURL, m.Logger)
	if err == nil {
		err = db.Ping(ctx)
		defer db.Close()
	}
	report("postgres", err)
	dbOK := err == nil
	if err == nil && cfg.Auth == "keys" {
		report("API keys: at least one merchant key (--auth keys)", checkAPIKeys(ctx, db))
	}

	signers := cfg.SignerAddresses()
	// signed are the keys of every network, checkedAll whether every network's were read.
	var signed []common.Address
	checkedAll := true
	for i, n := range networks {
		nc := cfg.Networks[i]
		pool, genesis, downs, err := m.dialNetwork(ctx, n, nc)
		for _, d := range downs {
			report(fmt.Sprintf("%s: RPC endpoint %s answers", n.ID, d.name), fmt.Errorf("%w; serve starts without it and tries it again in the background; fix: start it, or correct its URL", d.err))
		}
		if err == nil && !genesisKnown(genesis) {
			err = errors.New("no endpoint answered: serve would start without this network, answering 503 " + facilitator.ReasonNetworkUnavailable + " for it until one does")
		}
		report(fmt.Sprintf("%s: %d RPC endpoint(s) serve chain %d; %s", n.ID, len(nc.urls()), n.ChainID, quorumText(nc.quorum(), len(nc.urls()))), err)
		if err != nil {
			checkedAll = false // its remote signer's keys are not known: a retired one may be among them
			continue
		}
		g, _ := genesis.known()
		if p, ok := chains.ByChainID(n.ChainID); ok && p.Genesis != (common.Hash{}) {
			report(fmt.Sprintf("%s: genesis %s is %s's", n.ID, g.Hex(), p.Title), chains.CheckGenesis(n, g))
		}
		if dbOK {
			what, err := checkBinding(ctx, db, n, g)
			report(fmt.Sprintf("%s: %s", n.ID, what), err)
		}
		// Each read below is bounded by --rpc-timeout: an endpoint that never answers is a
		// failed check, not a hang.
		bounded := func(check func(ctx context.Context) error) error {
			cctx, cancel := context.WithTimeout(ctx, cfg.RPCTimeout)
			defer cancel()
			return check(cctx)
		}
		for j, u := range nc.wsURLs() {
			report(fmt.Sprintf("%s: WebSocket ws%d serves chain %d and new heads", n.ID, j, n.ChainID), checkWS(ctx, u, n.ChainID, cfg.RPCTimeout))
		}
		if p, err := nc.feePolicy(); err == nil {
			// As the engine prices: its least tip (1 wei) and --max-fee-gwei where the network sets none.
			p = p.WithDefaults(big.NewInt(1), cfg.MaxFeeCap)
			what, err := checkFeeCap(ctx, pool, p, cfg.RPCTimeout)
			report(fmt.Sprintf("%s: fees: %s", n.ID, what), err)
		}
		reader := &ethrpc.Reader{Chain: pool, Timeout: cfg.RPCTimeout}
		for _, t := range n.Tokens {
			report(fmt.Sprintf("%s: token %s signs under %q version %q", n.ID, t.Address.Hex(), t.Name, t.Version),
				chains.CheckToken(ctx, reader, n, t))
		}
		report(fmt.Sprintf("%s: finality %s", n.ID, finalityText(n.Finality.Tag, n.Finality.Depth)),
			bounded(func(ctx context.Context) error { return checkTag(ctx, pool, n.Finality.Tag) }))
		report(fmt.Sprintf("%s: batched settlement %s", n.ID, batchText(n.Batch)),
			bounded(func(ctx context.Context) error { return checkMulticall(ctx, pool, n.Batch) }))
		keys := signers
		if spec, addrs, _ := cfg.remoteSignerOf(nc); spec != "" {
			ep, remote, err := remoteSigners(ctx, spec, addrs, n.ChainID, cfg.RPCTimeout)
			if err != nil {
				report(fmt.Sprintf("%s: remote signer", n.ID), fmt.Errorf("%w; fix: start the signer, or correct its URL (--signer, or the entry's \"signer\")", err))
			}
			for _, r := range remote {
				// Addresses given are not taken on trust: the signer must answer for each, on
				// this chain, or every /settle of the key would answer 503 signer_unavailable.
				pctx, cancelProbe := context.WithTimeout(ctx, cfg.RPCTimeout)
				err := ep.Probe(pctx, r.Address())
				cancelProbe()
				report(fmt.Sprintf("%s: remote signer at %s holds %s and signs for chain %d", n.ID, ep.String(), r.Address().Hex(), n.ChainID), signerFix(err, n.ChainID))
				keys = append(keys, r.Address())
			}
			if ep != nil {
				ep.Close()
			}
		}
		for _, k := range keys {
			retiring := ""
			if slices.Contains(cfg.RetireSigners, k) {
				retiring = " (retiring: it takes no new settlement, and finishes what it has open)"
			}
			report(fmt.Sprintf("%s: signer %s funded for gas%s", n.ID, k.Hex(), retiring), bounded(func(ctx context.Context) error { return checkBalance(ctx, pool, k, cfg.SignerMinBalance) }))
		}
		if len(cfg.RetireSigners) > 0 {
			report(fmt.Sprintf("%s: a signer key that is not retiring", n.ID), checkNotAllRetiring(keys, cfg.RetireSigners))
		}
		signed = append(signed, keys...)
	}
	if len(cfg.RetireSigners) > 0 && checkedAll {
		for _, a := range cfg.RetireSigners {
			var err error
			if !slices.Contains(signed, a) {
				err = errors.New("it is not a signer key of any network: serve would refuse to start; fix: correct the address, or drop it from --retire-signers (FACILITATOR_RETIRE_SIGNERS) once the key is removed")
			}
			report(fmt.Sprintf("--retire-signers %s is a signer key", a.Hex()), err)
		}
	}
	if failed > 0 {
		return fmt.Errorf("the configuration check failed: %d problem(s)", failed)
	}
	fmt.Fprintln(out, "the configuration is ready to serve")
	return nil
}

func genesisKnown(g *genesisOf) bool {
	_, ok := g.known()
	return ok
}

// checkNotAllRetiring refuses a network whose every signer key is retiring: every /settle would
// answer 503 signers_retiring.
func checkNotAllRetiring(keys, retiring []common.Address) error {
	for _, k := range keys {
		if !slices.Contains(retiring, k) {
			return nil
		}
	}
	return fmt.Errorf("every signer key of the network is in --retire-signers: every /settle would answer 503 %s; fix: add the new key (FACILITATOR_SIGNER_KEYS, or the remote signer's) before retiring the last old one", facilitator.ReasonSignersRetiring)
}

// checkBinding compares the chain an endpoint serves with the one the ledger is bound to for the
// network's id: serve refuses to start on another (postgres.ErrNetworkMismatch).
func checkBinding(ctx context.Context, db *postgres.DB, n facilitator.Network, genesis common.Hash) (string, error) {
	chainID, bound, err := db.NetworkBinding(ctx, n.ID)
	switch {
	case errors.Is(err, facilitator.ErrNotFound):
		return fmt.Sprintf("the ledger is not bound to a chain yet: serve binds it to genesis %s", genesis.Hex()), nil
	case err != nil:
		return "the ledger's chain", err
	case chainID != n.ChainID || bound != genesis:
		return "the ledger's chain", fmt.Errorf("the ledger is bound to chain %d with genesis %s, and the RPC serves chain %d with genesis %s: serve would refuse to start (a dev chain restarted from genesis, or an RPC of another chain); fix: point the network's RPC at the chain the ledger was written against, or give the network a database of its own",
			chainID, bound.Hex(), n.ChainID, genesis.Hex())
	}
	return fmt.Sprintf("the ledger is bound to this chain (genesis %s)", genesis.Hex()), nil
}

// terminal reports whether w is a character device (a terminal).
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// checkListen binds addr and lets it go: serve would fail there at start (taken, not an address
// of this host, a privileged port).
func checkListen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%w; fix: stop what holds it, or choose another --listen (FACILITATOR_LISTEN)", err)
	}
	return ln.Close()
}

// checkSchedule parses spec as the jobs' scheduler does (cron.New's parser: five fields, or a
// descriptor such as @every 30s): serve would otherwise fail at start, after its migrations.
func checkSchedule(spec string) error {
	if _, err := cron.ParseStandard(spec); err != nil {
		return fmt.Errorf("%w; fix: five cron fields (minute hour day-of-month month day-of-week) or a descriptor such as \"@every 30s\"", err)
	}
	return nil
}

// checkAPIKeys refuses keys mode without a key that is not revoked: every route but the open ones
// would answer 401.
func checkAPIKeys(ctx context.Context, db *postgres.DB) error {
	const fix = "fix: create one, `facilitator keys create --name <merchant> --scopes verify,settle,status` (or serve with --auth open, for local development only)"
	all, live, err := db.CountAPIKeys(ctx)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fmt.Errorf("no API key: the database has no schema yet (`facilitator migrate` applies it); %s", fix)
	case err != nil:
		return fmt.Errorf("reading the API keys: %w", err)
	case live > 0:
		return nil
	}
	return fmt.Errorf("no API key that is not revoked (%d revoked): every /verify and /settle would answer 401; %s", all, fix)
}

// checkWS dials a WebSocket endpoint (named, never shown: its URL may hold a key) and asks it for
// the chain id and a newHeads subscription, within timeout each: one that does not answer leaves
// the watcher and the indexer on polling alone.
func checkWS(ctx context.Context, url string, chainID uint64, timeout time.Duration) error {
	const fix = "fix: correct the network's ws/wss URL, or remove it (polling goes on without it)"
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := rpc.DialContext(dctx, url)
	if err != nil {
		return fmt.Errorf("dialing: %s; %s", scrubURL(err, url), fix)
	}
	defer c.Close()
	var id hexutil.Uint64
	if err := c.CallContext(dctx, &id, "eth_chainId"); err != nil {
		return fmt.Errorf("eth_chainId: %s; %s", scrubURL(err, url), fix)
	}
	if uint64(id) != chainID {
		return fmt.Errorf("it serves chain %d; %s", uint64(id), fix)
	}
	heads := make(chan json.RawMessage, 1)
	sub, err := c.EthSubscribe(dctx, heads, "newHeads")
	if err != nil {
		return fmt.Errorf("subscribing to newHeads: %s; %s", scrubURL(err, url), fix)
	}
	sub.Unsubscribe()
	return nil
}

// scrubURL is err's text without url, which an error may repeat.
func scrubURL(err error, url string) string {
	return strings.ReplaceAll(err.Error(), url, "(the URL)")
}

// checkFeeCap compares the network's max fee with the fee cap its chain needs now: below it,
// every /settle answers 503 network_fees_above_cap. Amounts are shown in gwei, as they are given.
func checkFeeCap(ctx context.Context, c ethrpc.Chain, p facilitator.FeePolicy, timeout time.Duration) (string, error) {
	q, err := settle.QuoteFees(ctx, c, p, timeout)
	if err != nil {
		return "max fee against the chain's fees", fmt.Errorf("reading the network's fees: %w", err)
	}
	if p.MaxFee == nil {
		return fmt.Sprintf("no max fee (fees.maxFeeGwei, --max-fee-gwei); the chain needs a fee cap of %s gwei now", facilitator.Gwei(q.Least)), nil
	}
	what := fmt.Sprintf("max fee %s gwei, and the chain needs a fee cap of %s gwei now", facilitator.Gwei(p.MaxFee), facilitator.Gwei(q.Least))
	if q.Above {
		return what, fmt.Errorf("the max fee, %s gwei, is below the fee cap the chain needs now, %s gwei (next base fee plus tip): every /settle would answer 503 network_fees_above_cap; fix: raise the network's fees.maxFeeGwei (or --max-fee-gwei) above %s gwei",
			facilitator.Gwei(p.MaxFee), facilitator.Gwei(q.Least), facilitator.Gwei(q.Least))
	}
	return what, nil
}

// signerFix is a failed probe of a remote signer with what to do about it; nil stays nil.
func signerFix(err error, chainID uint64) error {
	var se *extsigner.SignError
	if err == nil || !errors.As(err, &se) {
		return err
	}
	fix := map[string]string{
		extsigner.ReasonUnreachable:  "start the signer, or correct its host and port (--signer, or the entry's \"signer\")",
		extsigner.ReasonTimeout:      "the signer did not answer within --rpc-timeout: check that it runs and that nothing between drops the connection",
		extsigner.ReasonUnauthorized: "give the signer's password in the URL, clef:http://facilitator:<password>@host:port/ (its --password-file)",
		extsigner.ReasonWrongChain:   fmt.Sprintf("run the signer for chain %d (`facilitator signer --chain-id %d`, Clef's --chainid %d), or give this network the signer of its chain", chainID, chainID, chainID),
		extsigner.ReasonUnknownKey:   "put the key in the signer (its keys file or keystore), or correct --signer-addresses (the entry's \"signerAddresses\")",
		extsigner.ReasonRefused:      "the signer refused the probe: check its rules (Clef) or its log",
		extsigner.ReasonBadAnswer:    "the signer's answer is not a signed transaction: is it a Clef-compatible signer?",
	}[se.Reason]
	return fmt.Errorf("%w; fix: %s", err, fix)
}

func finalityText(tag string, depth uint64) string {
	if tag != "" {
		return fmt.Sprintf("by tag %q (depth %d when it cannot be read)", tag, depth)
	}
	return fmt.Sprintf("by depth %d", depth)
}

// checkTag reads the network's finality tag, when it has one: a node that does not serve it is
// judged by depth at run time, which an operator should know before serving.
func checkTag(ctx context.Context, c ethrpc.Chain, tag string) error {
	if tag == "" {
		return nil
	}
	b := []rpc.BatchElem{ethrpc.TagElem(tag)}
	if err := c.BatchCallContext(ctx, b); err != nil {
		return fmt.Errorf("the node does not answer the %q block (finality would count by depth): %w", tag, err)
	}
	if b[0].Error != nil {
		return fmt.Errorf("the node does not answer the %q block (finality would count by depth): %w", tag, b[0].Error)
	}
	if !ethrpc.TagAnswer(b[0]).OK {
		return fmt.Errorf("the node answers no %q block (finality would count by depth)", tag)
	}
	return nil
}

// checkBalance refuses a signer key whose native balance is below the minimum that lets it take
// settlements (or is zero, without a minimum).
func checkBalance(ctx context.Context, c ethrpc.Chain, addr common.Address, min *big.Int) error {
	var bal hexutil.Big
	if err := ethrpc.One(ctx, c, ethrpc.Balance(addr, "latest", &bal)); err != nil {
		return fmt.Errorf("reading its balance: %w", err)
	}
	have := (*big.Int)(&bal)
	switch {
	case min != nil && have.Cmp(min) < 0:
		return fmt.Errorf("it holds %s wei, below the minimum of %s: it would take no settlement", have, min)
	case have.Sign() == 0:
		return errors.New("it holds no native token to pay gas with")
	}
	return nil
}

// checkMulticall refuses batching on a chain without Multicall3 at its canonical address: every
// batch would be a call to an empty account, succeeding without transferring anything.
func checkMulticall(ctx context.Context, c ethrpc.Chain, p facilitator.BatchPolicy) error {
	if !p.On() {
		return nil
	}
	var code hexutil.Bytes
	if err := ethrpc.One(ctx, c, ethrpc.Code(multicall3.Address, "latest", &code)); err != nil {
		return fmt.Errorf("reading Multicall3's code: %w", err)
	}
	if len(code) == 0 {
		return fmt.Errorf("no Multicall3 at %s on this chain", multicall3.Address)
	}
	return nil
}

// quorumText says who an outcome's reads rest on.
func quorumText(quorum, endpoints int) string {
	if quorum <= 1 {
		return "quorum 1: each provider is trusted alone"
	}
	return fmt.Sprintf("quorum %d of %d: an outcome needs %d providers to agree", quorum, endpoints, quorum)
}
