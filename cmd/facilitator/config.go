package main

import (
	"bufio"
	"crypto/ecdsa"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Config is everything serve needs, from flags with environment defaults.
type Config struct {
	Listen      string
	DatabaseURL string
	Networks    []NetworkConfig
	SignerKeys  []*ecdsa.PrivateKey
	// RemoteSigner is a signer holding keys outside the process, "clef:<http(s) URL>" (Clef's
	// external API, which `facilitator signer` speaks too); RemoteAddresses are its keys, or, when
	// empty, whatever its account_list answers at start.
	RemoteSigner    string
	RemoteAddresses []common.Address
	// RetireSigners are signer keys (local or remote) that take no new settlement: each works what
	// it has open to the end from itself, and reports draining (/readyz, metrics), so that it can
	// be removed once drained (docs/operating.md, rotating a signer key).
	RetireSigners []common.Address
	Factories     []common.Address
	RPCTimeout    time.Duration
	VerifyTimeout time.Duration
	// StatusTimeout bounds one status lookup, API and console alike.
	StatusTimeout time.Duration
	Migrate       bool
	LogLevel      string
	LogFormat     string
	// CheckConfig makes serve check the configuration against its dependencies and exit instead
	// of serving (checkconfig.go).
	CheckConfig bool
	// Pprof, when set, is a loopback address on which net/http/pprof is served (off by default).
	Pprof string

	SettleTimeout time.Duration
	PollInterval  time.Duration
	BumpAfter     time.Duration
	MaxInFlight   int
	MaxFeeCap     *big.Int // wei; nil: fee bumps are unbounded

	PaymentIDWindow     time.Duration
	RetentionSchedule   string
	ReconcileSchedule   string
	IndexHealthSchedule string
	ReconcileStale      time.Duration
	// Fault is a crash point (settle.FaultPoint) at which the process kills itself: crash tests
	// set it through FACILITATOR_TEST_FAULT, nothing else does.
	Fault string

	// Index runs the block indexer in this process (serve: on by default; replicas elect one
	// indexer per network among themselves).
	Index bool
	// IndexOnly runs only the indexers (facilitator index): no HTTP, no settlement.
	IndexOnly bool
	// ReadyMaxIndexLag is how many blocks behind the head an indexer this process leads may be
	// while /readyz still answers ready (0: any lag).
	ReadyMaxIndexLag uint64
	// ReadyTimeout bounds one /readyz, all checks at once.
	ReadyTimeout time.Duration

	// WebhookPollInterval is how often new settlement events and due webhook deliveries are
	// looked for (0: 1s).
	WebhookPollInterval time.Duration
	// WebhookAllowPrivate lets webhooks target loopback and private addresses (local development).
	WebhookAllowPrivate bool
	// WebhookDeliveryRetention is how long finished webhook deliveries are kept (the retention job).
	WebhookDeliveryRetention time.Duration

	// Auth is "keys" (merchant API keys required; serve's default) or "open" (no keys: local
	// development). "" is open: only programmatic configurations (dev, demo) leave it empty.
	Auth string
	// KeyRate/KeyBurst and ClientRate/ClientBurst are the per-key and per-client-IP request
	// limits, per process (rate per second; 0: no limit).
	KeyRate, ClientRate   float64
	KeyBurst, ClientBurst int
	// PublicReceipts serves the public view of an authorization without a key (api.Config.Receipts):
	// the status routes under --auth keys, and the receipt pages; PublicRate/PublicBurst limit its
	// lookups per client address (rate per second; 0: no limit).
	PublicReceipts bool
	PublicRate     float64
	PublicBurst    int
	// ConsoleSessionTTL is how long a console login lasts (0: api.DefaultSessionTTL).
	ConsoleSessionTTL time.Duration
	// TrustedProxies are the reverse proxies whose X-Forwarded-For the API believes
	// (api.Config.TrustedProxies); none: the TCP peer is the client.
	TrustedProxies []netip.Prefix

	// WalletCapCount and WalletCapAmount (token base units) bound each paying wallet's settlements
	// per network and asset over WalletCapWindow; 0/nil: no cap.
	WalletCapCount  int
	WalletCapAmount *big.Int
	WalletCapWindow time.Duration
	// KeyGasBudget is the gas budget (wei per rolling 24 hours) of an API key that has none of its
	// own; nil: unlimited.
	KeyGasBudget *big.Int
	// SignerMinBalance is the native balance (wei) below which a signer takes no new settlement;
	// nil: no minimum. BalanceInterval is how often balances are read.
	SignerMinBalance *big.Int
	BalanceInterval  time.Duration
	// ClaimLease is how long a claimed success waits for its answer to be written before the
	// next identical request may have it (settle.Config.ClaimLease).
	ClaimLease time.Duration
}

// NetworkConfig is one entry of FACILITATOR_NETWORKS.
type NetworkConfig struct {
	// Preset names a known chain (`facilitator networks` lists them): it fills id, v1Name, tokens
	// and finality; whatever of those the entry gives itself wins over the preset's.
	Preset string `json:"preset,omitempty"`
	ID     string `json:"id"`
	RPC    string `json:"rpc"`
	// RPCs are more endpoints of the network, from other providers (rpc, when set, is the first).
	// Reads fail over among them, sends go to all, and an outcome (mined, final, or a terminal
	// failure) needs Quorum of them to agree.
	RPCs []string `json:"rpcs,omitempty"`
	// Quorum is how many of the endpoints must agree on the reads an outcome rests on (0: two
	// with two or more endpoints, one with one: a quorum of one trusts each provider alone).
	Quorum int `json:"quorum,omitempty"`
	// WSs are more WebSocket endpoints for the head subscription (ws, when set, is the first);
	// one that fails gives way to the next.
	WSs []string `json:"wss,omitempty"`
	// RPCRate bounds the requests per second sent to each endpoint (0: no bound), in bursts of
	// RPCBurst.
	RPCRate  float64       `json:"rpcRate,omitempty"`
	RPCBurst int           `json:"rpcBurst,omitempty"`
	WS       string        `json:"ws,omitempty"`
	V1Name   *string       `json:"v1Name,omitempty"`
	Tokens   []TokenConfig `json:"tokens"`
	// Finality is the confirmations (the mined block counts as one) at which a settlement is
	// final; 0 takes the default: 1 on local dev chains (31337, 1337), 12 elsewhere. With a
	// FinalityTag it is the fallback while the node does not answer the tag.
	Finality uint64 `json:"finality,omitempty"`
	// FinalityTag, "finalized" or "safe", makes a block final once it is at or below the block
	// the node reports under that tag (the chain's own word), instead of by depth.
	FinalityTag string `json:"finalityTag,omitempty"`
	// StartBlock is where the block indexer starts on an empty database (default 0; set it to the
	// token's deployment block, or a recent one, on a real chain).
	StartBlock uint64 `json:"startBlock,omitempty"`
	// LogRange caps eth_getLogs block ranges during backfill (default 2000).
	LogRange uint64 `json:"logRange,omitempty"`
	// Fees prices the network's transactions (fees.go); absent: the defaults.
	Fees *FeesConfig `json:"fees,omitempty"`
	// Batch batches the network's settlements through Multicall3 (one transaction for up to max
	// settlements, closed when full or when its first has waited wait); absent: off.
	Batch *BatchConfig `json:"batch,omitempty"`
	// Signer is the network's own remote signer, "clef:<http(s) URL>", with its keys'
	// SignerAddresses (empty: its account_list): a remote signer signs for one chain, so with
	// several networks each names its own (--signer then serves one network only).
	Signer          string   `json:"signer,omitempty"`
	SignerAddresses []string `json:"signerAddresses,omitempty"`

	// presetFinality is the preset's finality rule, set by resolve when the entry names a preset
	// and gives no finality of its own.
	presetFinality *facilitator.Finality
	// presetExplorer is the preset's block explorer (chains.Preset.Explorer), set by resolve.
	presetExplorer string
}

// feePolicy is the network's fee policy: the defaults with the configured fields set.
func (nc NetworkConfig) feePolicy() (facilitator.FeePolicy, error) {
	return nc.Fees.Apply(facilitator.FeePolicy{})
}

// urls are the network's RPC endpoints, rpc first, without repeats.
func (nc NetworkConfig) urls() []string { return endpoints(nc.RPC, nc.RPCs) }

// quorum is how many endpoints must agree: the configured quorum, or the default for them.
func (nc NetworkConfig) quorum() int {
	if nc.Quorum > 0 {
		return nc.Quorum
	}
	return ethrpc.DefaultQuorum(len(nc.urls()))
}

// wsURLs are the network's WebSocket endpoints, ws first, without repeats.
func (nc NetworkConfig) wsURLs() []string { return endpoints(nc.WS, nc.WSs) }

func endpoints(first string, more []string) []string {
	var out []string
	for _, u := range append([]string{first}, more...) {
		if u != "" && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// finality returns the network's finality depth: the rule's depth (finalityRule).
func (nc NetworkConfig) finality(chainID uint64) uint64 { return nc.finalityRule(chainID).Depth }

// finalityRule returns when the network's blocks are final: a configured finality is a depth;
// without one, the preset's rule (a tag with a depth to fall back on), or else a depth of 1 on
// local dev chains (31337, 1337) and 12 elsewhere.
func (nc NetworkConfig) finalityRule(chainID uint64) facilitator.Finality {
	switch {
	case nc.Finality > 0:
		return facilitator.Finality{Depth: nc.Finality}
	case nc.presetFinality != nil:
		return *nc.presetFinality
	case chainID == 31337 || chainID == 1337:
		return facilitator.Finality{Depth: 1}
	default:
		return facilitator.Finality{Depth: 12}
	}
}

// resolve fills what the entry's preset provides and the entry does not give: the id, the v1
// name, the tokens (a token without an address is the preset's USDC; the preset's USDC without a
// name or version takes the preset's) and the finality rule. An id naming another chain than the
// preset's is refused rather than merged: nothing else in the preset would fit it. Without a
// preset the entry is returned as it is; resolving twice changes nothing.
func (nc NetworkConfig) resolve() (NetworkConfig, error) {
	if nc.Preset == "" {
		return nc, nil
	}
	p, err := chains.Lookup(nc.Preset)
	if err != nil {
		return nc, err
	}
	switch {
	case nc.ID == "":
		nc.ID = p.CAIP2()
	case nc.ID != p.CAIP2():
		return nc, fmt.Errorf("id %s is not preset %s's network (%s): drop the id, or the preset", nc.ID, p.Name, p.CAIP2())
	}
	if nc.V1Name == nil {
		v1 := p.V1Name
		nc.V1Name = &v1
	}
	usdc := TokenConfig{Address: p.USDC.Address.Hex(), Name: p.USDC.Name, Version: p.USDC.Version}
	if len(nc.Tokens) == 0 {
		nc.Tokens = []TokenConfig{usdc}
	} else {
		// A copy: the caller's entry keeps its own slice.
		tokens := make([]TokenConfig, len(nc.Tokens))
		for i, tc := range nc.Tokens {
			if tc.Address == "" {
				tc.Address = usdc.Address
			}
			if common.IsHexAddress(tc.Address) && common.HexToAddress(tc.Address) == p.USDC.Address {
				if tc.Name == "" {
					tc.Name = usdc.Name
				}
				if tc.Version == "" {
					tc.Version = usdc.Version
				}
			}
			tokens[i] = tc
		}
		nc.Tokens = tokens
	}
	if nc.Finality == 0 {
		rule := p.Finality
		nc.presetFinality = &rule
	}
	nc.presetExplorer = p.Explorer
	return nc, nil
}

// TokenConfig is one accepted EIP-3009 token.
type TokenConfig struct {
	Address string `json:"address"`
	Name    string `json:"name"`
	Version string `json:"version"`
	// Decimals is the token's decimals() (default 6, USDC's); checked against the contract at start.
	Decimals *uint8 `json:"decimals,omitempty"`
}

// Domain turns the configuration into domain networks.
func (c *Config) Domain() ([]facilitator.Network, error) {
	var out []facilitator.Network
	seen := map[string]bool{}
	for i, nc := range c.Networks {
		nc, err := nc.resolve()
		if err != nil {
			return nil, fmt.Errorf("networks[%d]: %w", i, err)
		}
		if nc.ID == "" {
			return nil, fmt.Errorf("networks[%d]: id (or preset) is required", i)
		}
		chainID, err := facilitator.ParseCAIP2(nc.ID)
		if err != nil {
			return nil, fmt.Errorf("networks[%d]: %w", i, err)
		}
		if seen[nc.ID] {
			return nil, fmt.Errorf("networks[%d]: %s is configured twice", i, nc.ID)
		}
		seen[nc.ID] = true
		if len(nc.urls()) == 0 {
			return nil, fmt.Errorf("networks[%d] (%s): rpc is required (or rpcs, a list of endpoints)", i, nc.ID)
		}
		if nc.Quorum < 0 || nc.Quorum > len(nc.urls()) {
			return nil, fmt.Errorf("networks[%d] (%s): quorum %d with %d RPC endpoint(s): want 1 to %d (or 0: the default)", i, nc.ID, nc.Quorum, len(nc.urls()), len(nc.urls()))
		}
		if nc.RPCRate < 0 || nc.RPCBurst < 0 {
			return nil, fmt.Errorf("networks[%d] (%s): rpcRate and rpcBurst must not be negative", i, nc.ID)
		}
		if len(nc.Tokens) == 0 {
			return nil, fmt.Errorf("networks[%d] (%s): at least one token is required", i, nc.ID)
		}
		if _, err := nc.feePolicy(); err != nil {
			return nil, fmt.Errorf("networks[%d] (%s): fees: %w", i, nc.ID, err)
		}
		n := facilitator.Network{ID: nc.ID, ChainID: chainID, Finality: nc.finalityRule(chainID), Explorer: nc.presetExplorer}
		if n.Batch, err = nc.Batch.policy(); err != nil {
			return nil, fmt.Errorf("networks[%d] (%s): batch: %w", i, nc.ID, err)
		}
		if nc.FinalityTag != "" {
			n.Finality.Tag = nc.FinalityTag
		}
		if err := n.Finality.Validate(); err != nil {
			return nil, fmt.Errorf("networks[%d] (%s): %w", i, nc.ID, err)
		}
		if nc.V1Name != nil {
			n.V1Name = *nc.V1Name
		} else {
			n.V1Name, _ = facilitator.V1NetworkName(chainID)
		}
		for j, tc := range nc.Tokens {
			if !common.IsHexAddress(tc.Address) {
				return nil, fmt.Errorf("networks[%d].tokens[%d]: address %q is not an address", i, j, tc.Address)
			}
			if tc.Name == "" || tc.Version == "" {
				return nil, fmt.Errorf("networks[%d].tokens[%d]: name and version (the token's EIP-712 domain) are required", i, j)
			}
			decimals := uint8(6)
			if tc.Decimals != nil {
				decimals = *tc.Decimals
			}
			n.Tokens = append(n.Tokens, facilitator.Token{Address: common.HexToAddress(tc.Address), Name: tc.Name, Version: tc.Version, Decimals: decimals})
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no networks configured (FACILITATOR_NETWORKS or --networks-file)")
	}
	return out, nil
}

// remoteSignerOf is the network's remote signer and its keys' addresses: its own entry's, else
// --signer's; "" when it signs with local keys only.
func (c *Config) remoteSignerOf(nc NetworkConfig) (spec string, addrs []common.Address, err error) {
	if nc.Signer == "" {
		return c.RemoteSigner, c.RemoteAddresses, nil
	}
	if _, err := remoteSignerURL(nc.Signer); err != nil {
		return "", nil, err
	}
	addrs, err = addressList(strings.Join(nc.SignerAddresses, ","), "signer address")
	return nc.Signer, addrs, err
}

// SignerAddresses are the addresses of the configured keys.
func (c *Config) SignerAddresses() []common.Address {
	out := make([]common.Address, len(c.SignerKeys))
	for i, k := range c.SignerKeys {
		out[i] = crypto.PubkeyToAddress(k.PublicKey)
	}
	return out
}

// Check reports a configuration that cannot work.
func (c *Config) Check() error {
	if c.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required")
	}
	if _, err := c.Domain(); err != nil {
		return err
	}
	if c.RPCTimeout <= 0 || c.VerifyTimeout <= 0 || c.SettleTimeout <= 0 || c.PollInterval <= 0 || c.BumpAfter <= 0 {
		return errors.New("timeouts and intervals must be positive")
	}
	if c.ClaimLease < 0 {
		return errors.New("claim-lease must not be negative")
	}
	if c.RemoteSigner != "" {
		if _, err := remoteSignerURL(c.RemoteSigner); err != nil {
			return err
		}
		if len(c.Networks) > 1 {
			// Clef and `facilitator signer` each sign for one chain id.
			return errors.New("a remote signer (--signer) signs for one chain: with several networks, give each its own (\"signer\" in its entry)")
		}
	}
	for i, nc := range c.Networks {
		spec, _, err := c.remoteSignerOf(nc)
		if err != nil {
			return fmt.Errorf("networks[%d] (%s): %w", i, nc.ID, err)
		}
		if len(c.SignerKeys) == 0 && spec == "" && !c.IndexOnly {
			return fmt.Errorf("networks[%d] (%s): no signer keys (FACILITATOR_SIGNER_KEYS or --signer-keys-file, or a remote signer: --signer clef:URL, or the entry's \"signer\"): /settle needs a funded wallet", i, nc.ID)
		}
	}
	if c.MaxInFlight <= 0 {
		return errors.New("max-in-flight must be positive")
	}
	if c.WalletCapCount < 0 {
		return errors.New("wallet-cap-count must not be negative")
	}
	if (c.WalletCapCount > 0 || c.WalletCapAmount != nil) && c.WalletCapWindow <= 0 {
		return errors.New("wallet-cap-window must be positive when a wallet cap is set")
	}
	if c.Pprof != "" {
		if err := checkPprofAddr(c.Pprof); err != nil {
			return err
		}
	}
	return nil
}

// parseServeFlags reads serve's flags; each defaults to its environment variable.
func parseServeFlags(args []string, getenv func(string) string) (*Config, error) {
	return parseCommandFlags("serve", args, getenv, os.Stderr)
}

// parseCommandFlags reads serve's flags for command (serve and index share them), whose name
// its -h and its errors carry. A positional argument is refused: the flag package stops at it,
// so every flag after it would be dropped without a word.
func parseCommandFlags(command string, args []string, getenv func(string) string, stderr io.Writer) (*Config, error) {
	fs, finish := serveFlags(getenv)
	fs.Init(command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: facilitator %s [flags]\n\nflags (most default to the environment variable they name):\n", command)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := noArguments(fs); err != nil {
		return nil, err
	}
	return finish()
}

// noArguments refuses what the flag package left over: a stray word ends its parsing, and the
// flags after it would otherwise be ignored.
func noArguments(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (it takes flags only; a flag's value goes as --flag=value)", fs.Name(), fs.Arg(0))
	}
	return nil
}

// boolSpellings are the boolean spellings a flag or an environment variable takes
// (strconv.ParseBool's): anything else is refused rather than read as one or the other.
const boolSpellings = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False"

// parseBool is strconv.ParseBool with an error that says what is accepted.
func parseBool(s string) (bool, error) {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean: want one of %s", s, boolSpellings)
	}
	return v, nil
}

// boolValue is a boolean flag as strict as the flag package's own, but whose default may come
// from an environment variable: given alone (--index) it is true and takes no argument after it.
type boolValue struct{ p *bool }

func (b boolValue) Set(s string) error {
	v, err := parseBool(s)
	if err != nil {
		return err
	}
	*b.p = v
	return nil
}

func (b boolValue) String() string {
	if b.p == nil {
		return "false"
	}
	return strconv.FormatBool(*b.p)
}

func (b boolValue) IsBoolFlag() bool { return true }

// serveFlags declares serve's flags, their environment variables and defaults, on a flag set of
// their own (what parseServeFlags parses, and what the documentation's table is held to); finish
// reads the parsed values into a Config.
func serveFlags(getenv func(string) string) (fs *flag.FlagSet, finish func() (*Config, error)) {
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	cfg := &Config{}
	// A boolean environment variable that is no boolean is refused when the flags are read, under
	// its own name (it is not the flag's value, so the flag package never sees it).
	var envErrs []error
	boolFlag := func(p *bool, name, key string, def bool, usage string) {
		*p = def
		if v := getenv(key); v != "" {
			b, err := parseBool(v)
			if err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s: %w", key, err))
			}
			*p = b
		}
		fs.Var(boolValue{p}, name, usage)
	}
	// The same for a whole number: a word there would otherwise reach Check as some number and be
	// refused for its sign, under the flag's name, misleading whoever set the variable.
	envInt := func(key, def string) int {
		v := env(key, def)
		n, err := strconv.Atoi(v)
		if err != nil {
			envErrs = append(envErrs, fmt.Errorf("%s=%q is not a whole number", key, v))
		}
		return n
	}
	fs.StringVar(&cfg.Listen, "listen", env("FACILITATOR_LISTEN", "127.0.0.1:4021"), "address to listen on (FACILITATOR_LISTEN)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", env("DATABASE_URL", ""), "Postgres connection string (DATABASE_URL)")
	fs.BoolVar(&cfg.CheckConfig, "check-config", false, "check the configuration (listen address, job schedules, networks, presets, every RPC and WebSocket endpoint, each chain's genesis and the ledger's binding, fees, token domains, remote signers, signer keys and their balances, Postgres, API keys) and exit: 0 when everything passed")
	networksJSON := fs.String("networks", env("FACILITATOR_NETWORKS", ""), "networks as JSON (FACILITATOR_NETWORKS)")
	networksFile := fs.String("networks-file", env("FACILITATOR_NETWORKS_FILE", ""), "file holding the networks JSON (FACILITATOR_NETWORKS_FILE)")
	fs.StringVar(&cfg.RemoteSigner, "signer", env("FACILITATOR_SIGNER", ""), "a remote signer holding the keys, clef:<http(s) URL> (FACILITATOR_SIGNER); the URL is never logged")
	remoteAddrs := fs.String("signer-addresses", env("FACILITATOR_SIGNER_ADDRESSES", ""), "comma-separated addresses of the remote signer's keys; empty: ask it (account_list) at start (FACILITATOR_SIGNER_ADDRESSES)")
	keysFile := fs.String("signer-keys-file", env("FACILITATOR_SIGNER_KEYS_FILE", ""), "file with one hex private key per line (FACILITATOR_SIGNER_KEYS_FILE)")
	retire := fs.String("retire-signers", env("FACILITATOR_RETIRE_SIGNERS", ""), "comma-separated signer addresses to retire: they take no new settlement and finish what they have open (FACILITATOR_RETIRE_SIGNERS)")
	factories := fs.String("eip6492-factories", env("FACILITATOR_EIP6492_FACTORIES", ""), "comma-separated factory addresses allowed for counterfactual wallets (FACILITATOR_EIP6492_FACTORIES)")
	rpcTimeout := fs.String("rpc-timeout", env("FACILITATOR_RPC_TIMEOUT", "5s"), "bound on one RPC round trip (FACILITATOR_RPC_TIMEOUT)")
	verifyTimeout := fs.String("verify-timeout", env("FACILITATOR_VERIFY_TIMEOUT", "10s"), "bound on one /verify (FACILITATOR_VERIFY_TIMEOUT)")
	boolFlag(&cfg.Migrate, "migrate", "FACILITATOR_MIGRATE", true, "apply pending migrations at start (FACILITATOR_MIGRATE)")
	settleTimeout := fs.String("settle-timeout", env("FACILITATOR_SETTLE_TIMEOUT", "30s"), "bound on one /settle; past it the answer is settlement_pending with the hash (FACILITATOR_SETTLE_TIMEOUT)")
	pollInterval := fs.String("poll-interval", env("FACILITATOR_POLL_INTERVAL", "500ms"), "how often receipts are polled (FACILITATOR_POLL_INTERVAL)")
	bumpAfter := fs.String("bump-after", env("FACILITATOR_BUMP_AFTER", "90s"), "replace an unmined settlement transaction with 10% higher fees after this long (FACILITATOR_BUMP_AFTER)")
	idWindow := fs.String("payment-id-window", env("FACILITATOR_PAYMENT_ID_WINDOW", "24h"), "how long the full answer under a payment identifier is kept (FACILITATOR_PAYMENT_ID_WINDOW); the id's link to its settlement stays after it")
	fs.StringVar(&cfg.RetentionSchedule, "retention-schedule", env("FACILITATOR_RETENTION_SCHEDULE", "@every 10m"), "cron schedule of the payment-identifier retention job (FACILITATOR_RETENTION_SCHEDULE)")
	boolFlag(&cfg.Index, "index", "FACILITATOR_INDEX", true, "run the block indexer in this process (FACILITATOR_INDEX)")
	readyLag := fs.String("ready-max-index-lag", env("FACILITATOR_READY_MAX_INDEX_LAG", "64"), "blocks an indexer this process leads may lag the head while /readyz answers ready; 0: any (FACILITATOR_READY_MAX_INDEX_LAG)")
	statusTimeout := fs.String("status-timeout", env("FACILITATOR_STATUS_TIMEOUT", "10s"), "bound on one status lookup, API and console (FACILITATOR_STATUS_TIMEOUT)")
	readyTimeout := fs.String("ready-timeout", env("FACILITATOR_READY_TIMEOUT", "2s"), "bound on one /readyz, all checks at once (FACILITATOR_READY_TIMEOUT)")
	fs.StringVar(&cfg.ReconcileSchedule, "reconcile-schedule", env("FACILITATOR_RECONCILE_SCHEDULE", "@every 30s"), "cron schedule of the job that resolves settlements nothing is working on (FACILITATOR_RECONCILE_SCHEDULE)")
	fs.StringVar(&cfg.IndexHealthSchedule, "index-health-schedule", env("FACILITATOR_INDEX_HEALTH_SCHEDULE", "@every 5m"), "cron schedule of the index health check (FACILITATOR_INDEX_HEALTH_SCHEDULE)")
	reconcileStale := fs.String("reconcile-stale", env("FACILITATOR_RECONCILE_STALE", "2m"), "how long a settlement goes without an update before the reconcile job looks at it (FACILITATOR_RECONCILE_STALE)")
	maxFeeGwei := fs.String("max-fee-gwei", env("FACILITATOR_MAX_FEE_GWEI", ""), "most a transaction may offer per gas (fee cap, or gas price on a legacy network), in gwei, on networks whose fees set no maxFeeGwei; a settlement the chain's fees do not fit under is refused (FACILITATOR_MAX_FEE_GWEI; empty: no cap)")
	maxInFlight := fs.Int("max-in-flight", envInt("FACILITATOR_MAX_IN_FLIGHT", "128"), "unmined transactions per signer before /settle answers 503 (FACILITATOR_MAX_IN_FLIGHT)")
	fs.StringVar(&cfg.LogLevel, "log-level", env("FACILITATOR_LOG_LEVEL", "info"), "debug, info, warn or error (FACILITATOR_LOG_LEVEL)")
	fs.StringVar(&cfg.Pprof, "pprof", env("FACILITATOR_PPROF", ""), "serve net/http/pprof on this loopback address, e.g. 127.0.0.1:6060 (FACILITATOR_PPROF; empty: off)")
	fs.StringVar(&cfg.LogFormat, "log-format", env("FACILITATOR_LOG_FORMAT", "text"), "text or json (FACILITATOR_LOG_FORMAT)")
	deliveryRetention := fs.String("webhook-delivery-retention", env("FACILITATOR_WEBHOOK_DELIVERY_RETENTION", "720h"), "how long delivered or given-up webhook deliveries are kept before the retention job deletes them (FACILITATOR_WEBHOOK_DELIVERY_RETENTION)")
	webhookPoll := fs.String("webhook-poll-interval", env("FACILITATOR_WEBHOOK_POLL_INTERVAL", "1s"), "how often new settlement events and due webhook deliveries are looked for (FACILITATOR_WEBHOOK_POLL_INTERVAL)")
	boolFlag(&cfg.WebhookAllowPrivate, "webhook-allow-private", "FACILITATOR_WEBHOOK_ALLOW_PRIVATE", false, "let webhooks target loopback and private addresses, for local development (FACILITATOR_WEBHOOK_ALLOW_PRIVATE)")
	fs.StringVar(&cfg.Auth, "auth", env("FACILITATOR_AUTH", "keys"), "keys (merchant API keys required) or open (no keys, local development only) (FACILITATOR_AUTH)")
	keyRate := fs.String("rate-per-key", env("FACILITATOR_RATE_PER_KEY", "50"), "requests per second per API key, per process; 0: no limit (FACILITATOR_RATE_PER_KEY)")
	fs.IntVar(&cfg.KeyBurst, "burst-per-key", envInt("FACILITATOR_BURST_PER_KEY", "100"), "burst per API key (FACILITATOR_BURST_PER_KEY)")
	clientRate := fs.String("rate-per-client", env("FACILITATOR_RATE_PER_CLIENT", "100"), "requests per second per client IP, per process; 0: no limit (FACILITATOR_RATE_PER_CLIENT)")
	boolFlag(&cfg.PublicReceipts, "public-receipts", "FACILITATOR_PUBLIC_RECEIPTS", true, "answer an authorization's public view (state, transaction, payer, payee, amount; never payment ids, keys or webhooks) without an API key: GET /v1/authorizations/… and /v1/settlements/{tx} under --auth keys, and the receipt pages /r/… (FACILITATOR_PUBLIC_RECEIPTS)")
	publicRate := fs.String("rate-public-per-client", env("FACILITATOR_RATE_PUBLIC_PER_CLIENT", "2"), "public receipt lookups per second per client IP, per process, on top of --rate-per-client; 0: no limit (FACILITATOR_RATE_PUBLIC_PER_CLIENT)")
	fs.IntVar(&cfg.PublicBurst, "burst-public-per-client", envInt("FACILITATOR_BURST_PUBLIC_PER_CLIENT", "20"), "burst of public receipt lookups per client IP (FACILITATOR_BURST_PUBLIC_PER_CLIENT)")
	sessionTTL := fs.String("console-session-ttl", env("FACILITATOR_CONSOLE_SESSION_TTL", "12h"), "how long a console login lasts before the console asks for the key again (FACILITATOR_CONSOLE_SESSION_TTL)")
	trustedProxies := fs.String("trusted-proxies", env("FACILITATOR_TRUSTED_PROXIES", ""), "comma-separated CIDRs (or addresses) of the reverse proxies in front; a request from one is keyed on the right-most X-Forwarded-For address outside them; empty: the TCP peer, always (FACILITATOR_TRUSTED_PROXIES)")
	fs.IntVar(&cfg.ClientBurst, "burst-per-client", envInt("FACILITATOR_BURST_PER_CLIENT", "200"), "burst per client IP (FACILITATOR_BURST_PER_CLIENT)")
	fs.IntVar(&cfg.WalletCapCount, "wallet-cap-count", envInt("FACILITATOR_WALLET_CAP_COUNT", "0"), "most settlements per paying wallet, network and asset within the wallet cap window; 0: no cap (FACILITATOR_WALLET_CAP_COUNT)")
	walletCapAmount := fs.String("wallet-cap-amount", env("FACILITATOR_WALLET_CAP_AMOUNT", "0"), "most token base units settled per paying wallet, network and asset within the wallet cap window; 0: no cap (FACILITATOR_WALLET_CAP_AMOUNT)")
	walletCapWindow := fs.String("wallet-cap-window", env("FACILITATOR_WALLET_CAP_WINDOW", "24h"), "the rolling window of the wallet caps (FACILITATOR_WALLET_CAP_WINDOW)")
	keyGasBudget := fs.String("key-gas-budget-wei", env("FACILITATOR_KEY_GAS_BUDGET_WEI", "0"), "gas budget in wei per rolling 24 hours of an API key without its own (keys create --gas-budget-wei); 0: unlimited (FACILITATOR_KEY_GAS_BUDGET_WEI)")
	minBalance := fs.String("signer-min-balance-wei", env("FACILITATOR_SIGNER_MIN_BALANCE_WEI", "10000000000000000"), "native balance in wei below which a signer takes no new settlement (default 0.01 ether); 0: no minimum (FACILITATOR_SIGNER_MIN_BALANCE_WEI)")
	balanceInterval := fs.String("balance-interval", env("FACILITATOR_BALANCE_INTERVAL", "15s"), "how often the signers' native balances are read and the remote signers' keys probed (FACILITATOR_BALANCE_INTERVAL)")
	claimLease := fs.String("claim-lease", env("FACILITATOR_CLAIM_LEASE", "15s"), "how long a success claimed for a caller is held for its answer to be written; a process that dies first leaves it to the next identical request after this (FACILITATOR_CLAIM_LEASE)")
	return fs, func() (*Config, error) {
		if len(envErrs) > 0 {
			return nil, envErrs[0]
		}
		if err := parseFlagValues(nonNegativeInt, []flagValue[*big.Int]{{"wallet-cap-amount", *walletCapAmount, &cfg.WalletCapAmount}, {"key-gas-budget-wei", *keyGasBudget, &cfg.KeyGasBudget}, {"signer-min-balance-wei", *minBalance, &cfg.SignerMinBalance}}); err != nil {
			return nil, err
		}
		if cfg.Auth != "keys" && cfg.Auth != "open" {
			return nil, fmt.Errorf("auth: %q is neither keys nor open", cfg.Auth)
		}
		if err := parseFlagValues(nonNegativeFloat, []flagValue[float64]{{"rate-per-key", *keyRate, &cfg.KeyRate}, {"rate-per-client", *clientRate, &cfg.ClientRate}, {"rate-public-per-client", *publicRate, &cfg.PublicRate}}); err != nil {
			return nil, err
		}

		raw, source := *networksJSON, "networks JSON (--networks or FACILITATOR_NETWORKS)"
		if *networksFile != "" {
			b, err := os.ReadFile(*networksFile)
			if err != nil {
				return nil, fmt.Errorf("reading the networks file: %w", err)
			}
			raw, source = string(b), *networksFile
		}
		if raw != "" {
			networks, err := decodeNetworks([]byte(raw), source)
			if err != nil {
				return nil, err
			}
			cfg.Networks = networks
			// Presets are filled in here, once, so that everything after reads one complete entry.
			for i, nc := range cfg.Networks {
				resolved, err := nc.resolve()
				if err != nil {
					return nil, fmt.Errorf("networks[%d]: %w", i, err)
				}
				cfg.Networks[i] = resolved
			}
		}

		keys, err := readSignerKeys(getenv("FACILITATOR_SIGNER_KEYS"), *keysFile)
		if err != nil {
			return nil, err
		}
		cfg.SignerKeys = keys
		if cfg.RemoteAddresses, err = addressList(*remoteAddrs, "signer address"); err != nil {
			return nil, err
		}
		if cfg.RetireSigners, err = addressList(*retire, "retire-signers address"); err != nil {
			return nil, err
		}
		if cfg.Factories, err = addressList(*factories, "eip6492 factory"); err != nil {
			return nil, err
		}
		if cfg.TrustedProxies, err = prefixList(*trustedProxies); err != nil {
			return nil, fmt.Errorf("trusted-proxies: %w", err)
		}
		if err := parseFlagValues(time.ParseDuration, []flagValue[time.Duration]{{"rpc-timeout", *rpcTimeout, &cfg.RPCTimeout}, {"verify-timeout", *verifyTimeout, &cfg.VerifyTimeout}, {"settle-timeout", *settleTimeout, &cfg.SettleTimeout}, {"poll-interval", *pollInterval, &cfg.PollInterval}, {"bump-after", *bumpAfter, &cfg.BumpAfter}, {"payment-id-window", *idWindow, &cfg.PaymentIDWindow}, {"reconcile-stale", *reconcileStale, &cfg.ReconcileStale}, {"wallet-cap-window", *walletCapWindow, &cfg.WalletCapWindow}, {"balance-interval", *balanceInterval, &cfg.BalanceInterval}, {"claim-lease", *claimLease, &cfg.ClaimLease}}); err != nil {
			return nil, err
		}
		cfg.MaxInFlight = *maxInFlight
		if cfg.ReadyMaxIndexLag, err = strconv.ParseUint(*readyLag, 10, 64); err != nil {
			return nil, fmt.Errorf("ready-max-index-lag: %q is not a block count", *readyLag)
		}
		if err := parseFlagValues(positiveDuration, []flagValue[time.Duration]{{"status-timeout", *statusTimeout, &cfg.StatusTimeout}, {"ready-timeout", *readyTimeout, &cfg.ReadyTimeout}}); err != nil {
			return nil, err
		}
		if *maxFeeGwei != "" {
			f, ok := new(big.Float).SetString(*maxFeeGwei)
			if !ok || f.Sign() <= 0 {
				return nil, fmt.Errorf("max-fee-gwei: %q is not a positive number", *maxFeeGwei)
			}
			cfg.MaxFeeCap, _ = new(big.Float).Mul(f, big.NewFloat(1e9)).Int(nil)
		}
		if err := parseFlagValues(positiveDuration, []flagValue[time.Duration]{{"webhook-poll-interval", *webhookPoll, &cfg.WebhookPollInterval}, {"webhook-delivery-retention", *deliveryRetention, &cfg.WebhookDeliveryRetention}, {"console-session-ttl", *sessionTTL, &cfg.ConsoleSessionTTL}}); err != nil {
			return nil, err
		}
		cfg.Fault = getenv("FACILITATOR_TEST_FAULT")
		return cfg, nil
	}
}

// flagValue is a flag's text and the field its parsed value goes to.
type flagValue[T any] struct {
	name, in string
	out      *T
}

// parseFlagValues parses each flag's text into its field, in order: the first that parse refuses
// is the error, under the flag's name.
func parseFlagValues[T any](parse func(string) (T, error), values []flagValue[T]) error {
	for _, v := range values {
		x, err := parse(v.in)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		*v.out = x
	}
	return nil
}

// nonNegativeInt parses a whole number of any size; zero, which turns what it sets off, is nil.
func nonNegativeInt(s string) (*big.Int, error) {
	v, ok := new(big.Int).SetString(strings.TrimSpace(s), 10)
	if !ok || v.Sign() < 0 {
		return nil, fmt.Errorf("%q is not a non-negative integer", s)
	}
	if v.Sign() == 0 {
		return nil, nil
	}
	return v, nil
}

func nonNegativeFloat(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a non-negative number", s)
	}
	return v, nil
}

func positiveDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration", s)
	}
	return d, nil
}

// addressList parses comma-separated addresses; what names them in the error.
func addressList(list, what string) ([]common.Address, error) {
	var out []common.Address
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if !common.IsHexAddress(a) {
			return nil, fmt.Errorf("%s %q is not an address", what, a)
		}
		out = append(out, common.HexToAddress(a))
	}
	return out, nil
}

// prefixList parses comma-separated CIDRs; a bare address is the prefix of itself alone.
func prefixList(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			if p != p.Masked() {
				return nil, fmt.Errorf("%q has host bits set: did you mean %s?", s, p.Masked())
			}
			out = append(out, p)
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR (10.0.0.0/8) or an address", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// readSignerKeys reads keys from FACILITATOR_SIGNER_KEYS (comma-separated) and a file (one per
// line, # comments). Errors name the key's position, never its text.
func readSignerKeys(fromEnv, file string) ([]*ecdsa.PrivateKey, error) {
	var texts []string
	for _, k := range strings.Split(fromEnv, ",") {
		if k = strings.TrimSpace(k); k != "" {
			texts = append(texts, k)
		}
	}
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("reading the signer keys file: %w", err)
		}
		defer f.Close()
		if err := checkKeyFileMode(f); err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line != "" && !strings.HasPrefix(line, "#") {
				texts = append(texts, line)
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("reading the signer keys file: %w", err)
		}
	}
	keys := make([]*ecdsa.PrivateKey, 0, len(texts))
	seen := map[common.Address]bool{}
	for i, t := range texts {
		k, err := crypto.HexToECDSA(strings.TrimPrefix(t, "0x"))
		if err != nil {
			return nil, fmt.Errorf("signer key #%d is not a valid hex secp256k1 private key", i+1)
		}
		addr := crypto.PubkeyToAddress(k.PublicKey)
		if seen[addr] {
			return nil, fmt.Errorf("signer key #%d repeats an earlier key (%s)", i+1, addr.Hex())
		}
		seen[addr] = true
		keys = append(keys, k)
	}
	return keys, nil
}

// checkKeyFileMode refuses a key file that anyone but its owner may read or write: whoever can
// read it can spend the signers' gas and settle as the facilitator. It checks the open file, so
// the mode judged is the file's that is read.
func checkKeyFileMode(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading the signer keys file: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("signer keys file %s has mode %#o, open to group or others: it must be 0600 or stricter (chmod 600 %s)", f.Name(), perm, f.Name())
	}
	return nil
}
