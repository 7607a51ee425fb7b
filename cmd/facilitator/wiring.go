package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/robfig/cron/v3"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/metrics"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/ops"
	"github.com/x402-facilitator/x402-facilitator/paymentid"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/status"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// Main owns the process's singletons: it builds them from Config in Run and tears them down in
// reverse order in Close.
type Main struct {
	Config *Config
	Logger *slog.Logger

	// Addr is the address actually listened on, known once Run returns (useful with port 0).
	Addr string

	db      *postgres.DB
	clients []*checkedEndpoint // every endpoint's, to close
	// gates say which networks serve: all but those none of whose endpoints answered at start,
	// until one does (startup.go).
	gates    map[string]*netGate
	quit     chan struct{}   // closed by Close: the background start-up of a network ends
	rpcs     []*ethrpc.Pool  // each network's endpoints
	heads    []*ethrpc.Heads // per network, shared by the engine and the indexer
	engine   *settle.Engine
	jobs     *cron.Cron
	indexers []*indexer.Indexer
	server   *http.Server
	serveErr chan error
	notifier *notify.Dispatcher
	metrics  *metrics.Metrics
	pprof    *pprofServer
	signers  []*extsigner.Endpoint // the remote signers, where the keys are there
	// signerNets are the networks of signers, in order.
	signerNets []string
	// stopProbes stops the remote signers' probes (signer.go); nil when none run.
	stopProbes func()
}

// Run starts the facilitator and returns once it is listening. Each step starts what the next
// ones use, in this order; Close stops them in reverse.
func (m *Main) Run(ctx context.Context) error {
	cfg := m.Config
	if err := cfg.Check(); err != nil {
		return err
	}
	networks, err := cfg.Domain()
	if err != nil {
		return err
	}
	log := m.Logger
	if cfg.Pprof != "" {
		if m.pprof, err = startPprof(cfg.Pprof, log); err != nil {
			return err
		}
	}

	m.quit = make(chan struct{})
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.openLedger(startCtx); err != nil {
		return err
	}
	m.metrics = metrics.New()
	if info, ok := debug.ReadBuildInfo(); ok {
		m.metrics.SetBuildInfo(buildLabels(info))
	}
	readers, rpcReaders, err := m.connectNetworks(startCtx, networks)
	if err != nil {
		return err
	}
	if cfg.IndexOnly {
		if err := m.startIndexers(startCtx, networks); err != nil {
			return err
		}
		log.Info("indexing only", "networks", len(networks))
		return nil
	}
	verifier, err := verify.New(verify.Config{
		Networks:         networks,
		Readers:          readers,
		EIP6492Factories: cfg.Factories,
		Logger:           log,
	})
	if err != nil {
		return err
	}
	settleNets, signerAddrs, err := m.settleNetworks(startCtx, networks)
	if err != nil {
		return err
	}
	if err := m.startEngine(startCtx, settleNets, verifier); err != nil {
		return err
	}
	svc, err := m.startServices(startCtx, networks, verifier)
	if err != nil {
		return err
	}
	if cfg.Index {
		if err := m.startIndexers(startCtx, networks); err != nil {
			return err
		}
	}
	srv, err := m.buildAPI(networks, svc, signerAddrs, rpcReaders)
	if err != nil {
		return err
	}
	if err := m.listen(srv); err != nil {
		return err
	}

	ids := make([]string, len(networks))
	for i, n := range networks {
		ids[i] = n.ID
	}
	log.Info("facilitator listening", "addr", m.Addr, "networks", strings.Join(ids, ","), "signers", len(signerAddrs))
	if openToNetwork(cfg.Auth, m.Addr) {
		log.Warn("OPEN AUTH ON A NETWORK ADDRESS: no API key is asked for, so anyone who reaches "+m.Addr+
			" can verify and settle (spending the signers' gas) and read every status; --auth open is for local development: use --auth keys, or listen on 127.0.0.1",
			"addr", m.Addr, "auth", cfg.Auth)
	}
	return nil
}

// openLedger opens the database, and migrates it when asked to. Either way a database migrated
// past what this binary knows refuses the start (postgres.SchemaNewerError).
func (m *Main) openLedger(ctx context.Context) error {
	var err error
	if m.db, err = openDB(ctx, m.Config.DatabaseURL, m.Logger); err != nil {
		return err
	}
	if m.Config.Migrate {
		_, err = m.db.Migrate(ctx)
	} else {
		err = m.db.CheckSchema(ctx)
	}
	return err
}

// connectNetworks dials each network's endpoints into its pool, follows its heads, binds the
// ledger to its chain and checks its tokens (and Multicall3, where it batches). It returns the
// readers the verifier and /readyz read each network through. A network none of whose endpoints
// answers does not stop the start: it waits in the background (awaitNetwork).
func (m *Main) connectNetworks(ctx context.Context, networks []facilitator.Network) (map[string]verify.Reader, map[string]*ethrpc.Reader, error) {
	cfg, log := m.Config, m.Logger
	readers := map[string]verify.Reader{}
	rpcReaders := map[string]*ethrpc.Reader{}
	m.gates = map[string]*netGate{}
	for i, n := range networks {
		pool, genesis, _, err := m.dialNetwork(ctx, n, cfg.Networks[i])
		if err != nil {
			return nil, nil, err
		}
		m.rpcs = append(m.rpcs, pool)
		m.heads = append(m.heads, ethrpc.NewHeads(cfg.RPCTimeout, log.With("network", n.ID), cfg.Networks[i].wsURLs()...))
		gate := &netGate{}
		m.gates[n.ID] = gate
		// Each component reads through its own counted view of the pool: the calls metric says
		// who spends the node's requests.
		rpcReaders[n.ID] = &ethrpc.Reader{Chain: m.counted(pool, n.ID, "ready"), Timeout: cfg.RPCTimeout}
		readers[n.ID] = &ethrpc.Reader{Chain: m.counted(pool, n.ID, "verify"), Timeout: cfg.RPCTimeout}
		if _, ok := genesis.known(); !ok {
			gate.wait("no RPC endpoint has answered since start")
			log.Error("no RPC endpoint of the network answered: serving the other networks; this one answers 503 "+facilitator.ReasonNetworkUnavailable+" until one answers",
				"network", n.ID, "endpoints", pool.Endpoints())
			go m.awaitNetwork(n, pool, genesis, gate)
			continue
		}
		if err := m.startChecks(ctx, n, pool, genesis); err != nil {
			return nil, nil, err
		}
		gate.open()
	}
	m.metrics.WatchEndpoints(func() []metrics.Endpoint {
		var out []metrics.Endpoint
		for i, p := range m.rpcs {
			for _, h := range p.Health() {
				out = append(out, metrics.Endpoint{Network: networks[i].ID, Name: h.Name, Up: h.Healthy, Head: h.Head})
			}
		}
		return out
	})
	return readers, rpcReaders, nil
}

// startChecks are a network's checks once an endpoint answered: the ledger bound to its chain,
// its tokens' domains, Multicall3 where it batches. Each call is bounded by --rpc-timeout.
func (m *Main) startChecks(ctx context.Context, n facilitator.Network, pool *ethrpc.Pool, genesis *genesisOf) error {
	cfg, log := m.Config, m.Logger
	g, _ := genesis.known()
	// A ledger written against one chain is never read against another.
	if err := m.db.BindNetwork(ctx, n.ID, n.ChainID, g); err != nil {
		return err
	}
	// Read through the pool itself, not the gated views: the gate opens once these pass.
	var chain ethrpc.Chain = pool
	if m.metrics != nil {
		chain = ethrpc.Counted(pool, n.ID, "ready", m.metrics)
	}
	reader := &ethrpc.Reader{Chain: chain, Timeout: cfg.RPCTimeout}
	for _, t := range n.Tokens {
		log.Info("waiting for the RPC: the token's EIP-712 domain", "network", n.ID, "token", t.Address, "timeout", cfg.RPCTimeout)
		if err := chains.CheckToken(ctx, reader, n, t); err != nil {
			return err
		}
	}
	// Batching on a chain without Multicall3 would send every batch to an empty account,
	// which succeeds transferring nothing: refused, like a token whose domain is wrong.
	if !cfg.IndexOnly && n.Batch.On() {
		log.Info("waiting for the RPC: Multicall3's code", "network", n.ID, "timeout", cfg.RPCTimeout)
		cctx, cancel := context.WithTimeout(ctx, cfg.RPCTimeout)
		err := checkMulticall(cctx, reader.Chain, n.Batch)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: batched settlement is configured (\"batch\"), and %w: deploy Multicall3 there or remove the network's batch entry", n.ID, err)
		}
	}
	return nil
}

// awaitNetwork brings up a network none of whose endpoints answered at start: it asks them
// again every few seconds (each endpoint is checked as it first answers) and, once one did and
// the network's start-up checks pass, opens its gate. A check that fails on an answer (a token's
// wrong domain) keeps the network closed with that reason, loudly; serve would have refused
// to start on it.
func (m *Main) awaitNetwork(n facilitator.Network, pool *ethrpc.Pool, genesis *genesisOf, gate *netGate) {
	cfg, log := m.Config, m.Logger
	every := min(max(cfg.RPCTimeout, time.Second), 5*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.RPCTimeout)
		var id hexutil.Uint64
		err := ethrpc.One(ctx, pool, ethrpc.ChainID(&id))
		cancel()
		if _, ok := genesis.known(); ok && err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.RPCTimeout*time.Duration(1+len(n.Tokens)))
			err = m.startChecks(ctx, n, pool, genesis)
			cancel()
			if err == nil {
				gate.open()
				log.Info("network serving: an RPC endpoint answered and its start-up checks passed", "network", n.ID)
				return
			}
			log.Error("network not serving: a start-up check failed", "network", n.ID, "err", err)
			gate.wait(facilitator.StripURLs(err.Error()))
		} else if err != nil {
			gate.wait("no RPC endpoint has answered since start: " + facilitator.StripURLs(err.Error()))
		}
		select {
		case <-m.quit:
			return
		case <-time.After(every):
		}
	}
}

// settleNetworks is each network as the engine settles on it: its signers (the configured keys,
// and the remote signer's where the keys are there) and its fee policy. It also returns every
// signer's address, for /supported.
func (m *Main) settleNetworks(ctx context.Context, networks []facilitator.Network) ([]settle.NetworkConfig, []common.Address, error) {
	cfg := m.Config
	var settleNets []settle.NetworkConfig
	signerAddrs := cfg.SignerAddresses()
	for i, n := range networks {
		var remote []settle.Signer
		if spec, addrs, _ := cfg.remoteSignerOf(cfg.Networks[i]); spec != "" {
			// The keys are the remote signer's; this process holds only their addresses.
			ep, keys, err := remoteSigners(ctx, spec, addrs, n.ChainID, cfg.RPCTimeout)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", n.ID, err)
			}
			m.signers, m.signerNets, remote = append(m.signers, ep), append(m.signerNets, n.ID), keys
			for _, r := range remote {
				signerAddrs = append(signerAddrs, r.Address())
			}
			m.Logger.Info("remote signer", "network", n.ID, "signer", ep.String(), "keys", len(remote))
		}
		fees, err := cfg.Networks[i].feePolicy()
		if err != nil {
			return nil, nil, fmt.Errorf("networks[%d] (%s): fees: %w", i, n.ID, err)
		}
		settleNets = append(settleNets, settle.NetworkConfig{Network: n, Chain: m.counted(m.rpcs[i], n.ID, "engine"), Signers: cfg.SignerKeys, Remote: remote,
			Heads: m.heads[i], Fees: fees, Retiring: retiringOf(cfg.RetireSigners, cfg.SignerAddresses(), remote)})
	}
	// A remote signer's keys are known only once it answered: an address to retire is checked here.
	for _, a := range cfg.RetireSigners {
		if !slices.Contains(signerAddrs, a) {
			return nil, nil, fmt.Errorf("--retire-signers: %s is not a signer key of any network (FACILITATOR_SIGNER_KEYS, the remote signers' keys)", a.Hex())
		}
	}
	return settleNets, signerAddrs, nil
}

// retiringOf is the addresses of retire that are signers of a network with the local keys and
// remote's.
func retiringOf(retire, local []common.Address, remote []settle.Signer) []common.Address {
	var out []common.Address
	for _, a := range retire {
		mine := slices.Contains(local, a) || slices.ContainsFunc(remote, func(r settle.Signer) bool { return r.Address() == a })
		if mine {
			out = append(out, a)
		}
	}
	return out
}

// startEngine builds and starts the settlement engine, and lets the metrics read its signers,
// open settlements and claims.
func (m *Main) startEngine(ctx context.Context, settleNets []settle.NetworkConfig, verifier *verify.Verifier) error {
	cfg, log := m.Config, m.Logger
	var err error
	m.engine, err = settle.New(settle.Config{
		Networks:             settleNets,
		Store:                m.db,
		Verifier:             verifier,
		Deadline:             cfg.SettleTimeout,
		PollInterval:         cfg.PollInterval,
		BumpAfter:            cfg.BumpAfter,
		MaxFeeCap:            cfg.MaxFeeCap,
		MaxInFlightPerSigner: cfg.MaxInFlight,
		RPCTimeout:           cfg.RPCTimeout,
		Logger:               log,
		Fault:                faultInjector(cfg.Fault, log),
		// Replicas on one database share the signer keys by leasing each to one of them at a time.
		Leaser:   m.db,
		Observer: m.metrics,
		Limits: facilitator.Limits{WalletCapCount: cfg.WalletCapCount, WalletCapAmount: cfg.WalletCapAmount,
			WalletWindow: cfg.WalletCapWindow, KeyGasBudget: cfg.KeyGasBudget},
		SignerMinBalance: cfg.SignerMinBalance,
		BalanceInterval:  cfg.BalanceInterval,
		ClaimLease:       cfg.ClaimLease,
	})
	if err != nil {
		return err
	}
	if err := m.engine.Start(ctx); err != nil {
		m.engine = nil
		return err
	}
	m.metrics.WatchSigners(signerSource(m.engine, cfg.SignerMinBalance))
	m.metrics.WatchSettlements(openSource(m.engine))
	m.metrics.WatchClaims(m.engine.LapsedClaims)
	m.metrics.WatchRemoteSigners(m.remoteSignerHealth)
	m.metrics.WatchNetworkFees(feesSource(m.engine))
	m.startSignerProbes(cfg.BalanceInterval, cfg.RPCTimeout)
	return nil
}

// services are what the API serves beside the engine.
type services struct {
	ids    *paymentid.Service
	status *status.Service
}

// startServices builds the services over the engine (payment identifiers, reconcile, status),
// starts the webhook dispatcher, and schedules the jobs.
func (m *Main) startServices(ctx context.Context, networks []facilitator.Network, verifier *verify.Verifier) (services, error) {
	cfg, log := m.Config, m.Logger
	idsvc := paymentid.New(paymentid.Config{
		Store:    m.db,
		Settler:  m.engine,
		Verifier: verifier,
		Window:   cfg.PaymentIDWindow,
		Logger:   log,
	})
	m.metrics.WatchPaymentIDs(idsvc.Counts)
	// Each network's signer keys, held here or by another replica: a transaction one of them
	// signed is ours even when the ledger lost it (a failover, a restore).
	signers := map[string][]common.Address{}
	for _, s := range m.engine.Signers() {
		signers[s.Network] = append(signers[s.Network], s.Address)
	}
	var recNets []reconcile.Network
	for i, n := range networks {
		recNets = append(recNets, reconcile.Network{Network: n, Chain: m.counted(m.rpcs[i], n.ID, "reconcile"), Signers: signers[n.ID]})
	}
	rec := reconcile.New(reconcile.Config{Store: m.db, Networks: recNets, StaleAfter: cfg.ReconcileStale,
		RPCTimeout: cfg.RPCTimeout, Logger: log, Observer: m.metrics})
	var statusNets []status.Network
	for i, n := range networks {
		statusNets = append(statusNets, status.Network{Network: n, Head: m.counted(m.rpcs[i], n.ID, "status"), Timeout: cfg.RPCTimeout,
			Signers: signers[n.ID]})
	}
	statusSvc := status.New(m.db, statusNets, nil)
	ncfg := notify.Config{Store: m.db, Status: statusSvc, PollInterval: cfg.WebhookPollInterval,
		DeliveryRetention: cfg.WebhookDeliveryRetention, AllowPrivateTargets: cfg.WebhookAllowPrivate, Logger: log,
		Observer: m.metrics}
	if cfg.Auth == "open" {
		// One owner, no one to share the delivery slots with.
		ncfg.Concurrency = 16
		ncfg.PerOwner = ncfg.Concurrency
	}
	m.notifier = notify.New(ncfg)
	if err := m.notifier.Start(ctx); err != nil {
		return services{}, err
	}
	var err error
	if m.jobs, err = startJobs(log, cfg, idsvc, rec, m.notifier, m.db, m.metrics); err != nil {
		return services{}, err
	}
	return services{ids: idsvc, status: statusSvc}, nil
}

// buildAPI builds the HTTP API: the operations overview, the console and the endpoints, over the
// services and the indexers started before it.
func (m *Main) buildAPI(networks []facilitator.Network, svc services, signerAddrs []common.Address, rpcReaders map[string]*ethrpc.Reader) (*api.Server, error) {
	cfg, log := m.Config, m.Logger
	answers := ops.NewAnswers(nil)
	chainsByID := map[string]ops.Chain{}
	for i, n := range networks {
		chainsByID[n.ID] = m.rpcs[i]
	}
	indexers := map[string]ops.Indexer{}
	for i, ix := range m.indexers {
		indexers[networks[i].ID] = ix
	}
	overview := ops.New(ops.Config{Ledger: m.db, Answers: answers, Engine: m.engine, Indexers: indexers, Chains: chainsByID,
		RPCTimeout: cfg.RPCTimeout,
		Logger:     log.With("component", "ops")})
	authCfg := authConfig(cfg, m.db)
	apiGates := map[string]*netGate{}
	for _, n := range networks {
		apiGates[n.ID] = m.gates[n.ID]
		if n.V1Name != "" {
			apiGates[n.V1Name] = m.gates[n.ID]
		}
	}
	// Live pages follow the heads the engine and the indexer follow: no socket of their own.
	liveHeads := map[string]console.Heads{}
	for i, n := range networks {
		liveHeads[n.ID] = m.heads[i]
	}
	con, err := console.New(console.Config{Status: svc.status, HTTPStatus: api.HTTPStatus, QueryTimeout: cfg.StatusTimeout, Networks: networks,
		Logger: log.With("component", "console"), Merchant: m.db, PaymentIDs: m.db, Sessions: api.ConsoleSessions(authCfg), Ops: overview, Heads: liveHeads})
	if err != nil {
		return nil, err
	}
	acfg := api.Config{
		Console:        con,
		Lists:          m.db,
		Redeliver:      m.db,
		Deliveries:     m.db,
		Verifier:       gatedAPI{svc.ids, apiGates},
		Settler:        gatedAPI{svc.ids, apiGates},
		Status:         svc.status,
		Notify:         m.notifier,
		Supported:      facilitator.Supported(networks, signerAddrs, []string{facilitator.PaymentIdentifierKey}),
		VerifyTimeout:  cfg.VerifyTimeout,
		StatusTimeout:  cfg.StatusTimeout,
		Logger:         log,
		Auth:           authCfg,
		Observer:       observers{m.metrics, answers},
		Ops:            overview,
		Metrics:        m.metrics.Handler(),
		Ready:          m.readyChecks(rpcReaders),
		ReadyEndpoints: m.readyEndpoints(networks),
		ReadySigners:   m.readySigners,
		ReadyTimeout:   cfg.ReadyTimeout,
		Limits:         m.engine,
		TrustedProxies: cfg.TrustedProxies,
		PaymentIDs:     m.db,
	}
	if cfg.PublicReceipts {
		acfg.Receipts, acfg.ReceiptPage = svc.status, con
		acfg.PublicPerClient = auth.Limit{Rate: cfg.PublicRate, Burst: cfg.PublicBurst}
	}
	return api.New(acfg), nil
}

// readyEndpoints is what /readyz says of each endpoint: up at its head, or down and why.
func (m *Main) readyEndpoints(networks []facilitator.Network) func() map[string]string {
	return func() map[string]string {
		out := map[string]string{}
		for i, p := range m.rpcs {
			for _, h := range p.Health() {
				state := fmt.Sprintf("ok, head %d", h.Head)
				if !h.Healthy {
					state = "down: " + h.LastError
				}
				out[networks[i].ID+"/"+h.Name] = state
			}
		}
		return out
	}
}

// openToNetwork reports whether serving in auth mode on the bound address addr (host:port) takes
// requests without a key from beyond this machine: open mode on anything but a loopback address
// (":4021" binds every interface, and an address that does not parse is taken as exposed).
func openToNetwork(auth, addr string) bool {
	if auth != api.AuthOpen {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}

// listen listens on the configured address and serves the API there in the background; Close
// shuts it down.
func (m *Main) listen(srv *api.Server) error {
	ln, err := net.Listen("tcp", m.Config.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", m.Config.Listen, err)
	}
	m.Addr = ln.Addr().String()
	m.server = &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		IdleTimeout:       90 * time.Second,
	}
	m.serveErr = make(chan error, 1)
	go func() { m.serveErr <- m.server.Serve(ln) }()
	return nil
}

// startIndexers runs one block indexer per network in the background. Replicas elect one leader
// per network among themselves; a deep reorg stops that network's indexer, loudly, and nothing else.
func (m *Main) startIndexers(ctx context.Context, networks []facilitator.Network) error {
	for i, n := range networks {
		nc := m.Config.Networks[i]
		logRange := nc.LogRange
		if logRange == 0 {
			logRange = 2000 // what most hosted providers accept
		}
		tokens := make([]common.Address, len(n.Tokens))
		for j, t := range n.Tokens {
			tokens[j] = t.Address
		}
		ix := indexer.New(indexer.Config{
			Network: n.ID, Tokens: tokens, Chain: m.counted(m.rpcs[i], n.ID, "indexer"), Heads: m.heads[i], Store: m.db,
			StartBlock: nc.StartBlock, Finality: n.Finality, MaxRange: logRange,
			PollInterval: m.Config.PollInterval, RPCTimeout: m.Config.RPCTimeout, Logger: m.Logger,
			Observer: m.metrics,
		})
		if err := ix.Start(ctx); err != nil {
			return err
		}
		m.indexers = append(m.indexers, ix)
	}
	m.metrics.WatchIndexers(indexerSource(networks, m.indexers))
	return nil
}

// readyChecks are what /readyz asks: Postgres, each network's RPC, and each indexer this process
// runs. Each check lives with its state; this only names them.
func (m *Main) readyChecks(rpcs map[string]*ethrpc.Reader) map[string]api.ReadyChecker {
	checks := map[string]api.ReadyChecker{"postgres": api.ReadyFunc(m.db.Ping)}
	for id, r := range rpcs {
		checks["rpc:"+id] = r
	}
	for i, ix := range m.indexers {
		maxLag := m.Config.ReadyMaxIndexLag
		checks["indexer:"+m.Config.Networks[i].ID] = api.ReadyFunc(func(context.Context) error { return ix.Ready(maxLag) })
	}
	return checks
}

// observers hands every /verify and /settle answer to each of them (metrics, the overview's ring).
type observers []api.Observer

func (os observers) Verified(network, reason string, took time.Duration) {
	for _, o := range os {
		o.Verified(network, reason, took)
	}
}

func (os observers) Settled(network, reason string, took time.Duration) {
	for _, o := range os {
		o.Settled(network, reason, took)
	}
}

// signerSource reads the engine's signer keys at scrape time: in-flight counts, and balances once
// the balance guard has read them (absent before, rather than a misleading zero) while this
// process holds the key.
func signerSource(e *settle.Engine, minBalance *big.Int) metrics.SignerSource {
	var minWei float64
	if minBalance != nil {
		minWei, _ = new(big.Float).SetInt(minBalance).Float64()
	}
	return func() []metrics.Signer {
		var out []metrics.Signer
		for _, st := range e.Signers() {
			sig := metrics.Signer{Network: st.Network, Address: st.Address.Hex(), InFlight: st.InFlight, BalanceLow: st.BalanceLow,
				MinBalanceWei: minWei, Retiring: st.Retiring, Held: st.Leased, Open: st.Open}
			// A key another replica holds is that replica's to report: the balance this process
			// read before losing it only ages.
			if st.Balance != nil && st.Leased {
				sig.BalanceKnown = true
				sig.BalanceWei, _ = new(big.Float).SetInt(st.Balance).Float64()
				sig.BalanceReadAt = st.BalanceReadAt
			}
			out = append(out, sig)
		}
		return out
	}
}

// feesSource reads each network's max fee and last fee reading at scrape time.
func feesSource(e *settle.Engine) metrics.NetworkFeesSource {
	wei := func(v *big.Int) float64 { f, _ := new(big.Float).SetInt(v).Float64(); return f }
	return func() []metrics.NetworkFees {
		var out []metrics.NetworkFees
		for _, f := range e.Fees() {
			nf := metrics.NetworkFees{Network: f.Network, HasMax: f.MaxFee != nil, ReadAt: f.At}
			if f.MaxFee != nil {
				nf.MaxFee = wei(f.MaxFee)
			}
			if f.Least != nil {
				nf.Needed = wei(f.Least)
			} else {
				nf.ReadAt = time.Time{}
			}
			out = append(out, nf)
		}
		return out
	}
}

// openSource reads the engine's open settlements at scrape time.
func openSource(e *settle.Engine) metrics.OpenSource {
	return func() []metrics.Open {
		var out []metrics.Open
		for _, o := range e.Open() {
			out = append(out, metrics.Open{Network: o.Network, State: string(o.State), Count: o.Count, Oldest: o.Oldest})
		}
		return out
	}
}

// indexerSource reads the indexers' status at scrape time.
func indexerSource(networks []facilitator.Network, ixs []*indexer.Indexer) metrics.IndexerSource {
	return func() []metrics.Indexer {
		out := make([]metrics.Indexer, len(ixs))
		for i, ix := range ixs {
			st := ix.Health()
			out[i] = metrics.Indexer{Network: networks[i].ID, Leader: st.Leader, Stopped: st.Stopped, Lag: st.Lag}
		}
		return out
	}
}

// Close stops serving (letting requests in flight finish) and closes everything Run opened.
func (m *Main) Close() error {
	var errs []error
	if m.quit != nil {
		close(m.quit)
	}
	// Event streams only end on their own after their lifetime: end them (and the webhook loop)
	// first, so that the server's shutdown does not wait on them.
	if m.notifier != nil {
		m.notifier.Stop()
	}
	if m.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, m.server.Shutdown(ctx))
		cancel()
		if err := <-m.serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	for i, ix := range m.indexers {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := ix.Stop(ctx); err != nil {
			m.Logger.Error("block indexer stopped", "network", m.Config.Networks[i].ID, "err", err)
		}
		cancel()
	}
	if m.jobs != nil {
		<-m.jobs.Stop().Done()
	}
	if m.engine != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, m.engine.Stop(ctx))
		cancel()
	}
	for _, c := range m.clients {
		c.Close()
	}
	if m.stopProbes != nil {
		m.stopProbes()
	}
	for _, s := range m.signers {
		s.Close()
	}
	if m.db != nil {
		m.db.Close()
	}
	if m.pprof != nil {
		m.pprof.Close()
	}
	return errors.Join(errs...)
}

// endpointDown is an endpoint that did not answer at start, and why.
type endpointDown struct {
	name string
	err  error
}

// dialNetwork puts every RPC endpoint of a network into one pool, after checking, within
// --rpc-timeout each, that it serves the network's chain: an endpoint of another chain (a
// copy-pasted URL) must never answer for this one, and stops the start. One that does not answer
// joins the pool as down, and is checked when it first answers. Endpoints are named rpc0,
// rpc1… in configured order, never by URL. The genesis is known once an endpoint answered;
// downs are the endpoints that did not.
func (m *Main) dialNetwork(ctx context.Context, n facilitator.Network, nc NetworkConfig) (*ethrpc.Pool, *genesisOf, []endpointDown, error) {
	timeout := m.Config.RPCTimeout
	genesis := &genesisOf{}
	urls := nc.urls()
	checked := make([]*checkedEndpoint, len(urls))
	errs := make([]error, len(urls))
	for j, u := range urls {
		checked[j] = &checkedEndpoint{name: fmt.Sprintf("rpc%d", j), net: n, url: u, genesis: genesis}
		m.clients = append(m.clients, checked[j])
	}
	// At once: a network waits --rpc-timeout at most, however many of its endpoints are silent.
	ethrpc.Each(false, len(checked), func(j int) {
		m.Logger.Info("waiting for an RPC endpoint: its chain id and genesis block", "network", n.ID, "endpoint", checked[j].name, "timeout", timeout)
		cctx, cancel := context.WithTimeout(ctx, timeout)
		_, errs[j] = checked[j].check(cctx)
		cancel()
	})
	var eps []ethrpc.Endpoint
	var downs []endpointDown
	for j, ep := range checked {
		err := errs[j]
		if errors.Is(err, chains.ErrWrongChain) {
			return nil, nil, nil, err
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, nil, fmt.Errorf("%s: %w", n.ID, err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("RPC endpoint %s: no answer within --rpc-timeout (%s)", ep.name, timeout)
			}
			m.Logger.Warn("RPC endpoint did not answer: serving without it, and trying it again in the background", "network", n.ID, "endpoint", ep.name, "err", err)
			downs = append(downs, endpointDown{ep.name, err})
		}
		ep.log = m.Logger
		eps = append(eps, ethrpc.Endpoint{Name: ep.name, Chain: ep, Rate: nc.RPCRate, Burst: nc.RPCBurst, Down: err})
	}
	pool, err := ethrpc.NewPool(eps, endpointObserver{m.metrics, n.ID}, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := pool.SetQuorum(nc.quorum()); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", n.ID, err)
	}
	return pool, genesis, downs, nil
}

// counted is the network's pool as one component sees it: its calls counted under its name,
// and refused while the network is not serving (its gate).
func (m *Main) counted(pool *ethrpc.Pool, network, component string) ethrpc.Chain {
	var c ethrpc.Chain = pool
	if g := m.gates[network]; g != nil {
		c = gatedPool{Pool: pool, gate: g, network: network}
	}
	if m.metrics != nil {
		c = ethrpc.Counted(c, network, component, m.metrics)
	}
	return c
}

// endpointObserver counts a network's endpoint failures in metrics.
type endpointObserver struct {
	m       *metrics.Metrics
	network string
}

func (o endpointObserver) EndpointDown(endpoint string) {
	if o.m != nil { // nil: a configuration check, which exports nothing
		o.m.EndpointFailed(o.network, endpoint)
	}
}
func (o endpointObserver) EndpointUp(string) {}

// dialRPC dials a node. Over HTTP, the client keeps as many idle connections as the busiest
// moment used: go-ethereum's default HTTP client keeps 2 per host, so under load (dozens of
// concurrent simulations, broadcasts and receipt reads) every other request opened a fresh TCP
// connection and closed it, which cost this process and the node more CPU than the requests.
func dialRPC(ctx context.Context, url string) (*rpc.Client, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 256, 256
	return rpc.DialOptions(ctx, url, rpc.WithHTTPClient(&http.Client{Transport: t}))
}

// faultInjector kills the process with SIGKILL at the named settle step: the crash tests' way
// of stopping the real binary between two writes. Empty means never.
func faultInjector(point string, log *slog.Logger) func(settle.FaultPoint) {
	if point == "" {
		return nil
	}
	log.Warn("test fault injection is on: the process will kill itself", "at", point)
	return func(p settle.FaultPoint) {
		if string(p) == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL is not delivered synchronously; never run past the fault point
		}
	}
}

func openDB(ctx context.Context, url string, log *slog.Logger) (*postgres.DB, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return postgres.Open(ctx, url, log)
}

func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// authConfig is the API's key and rate-limit guard.
func authConfig(cfg *Config, db *postgres.DB) *api.AuthConfig {
	// Open only when asked for by name: anything else requires keys.
	mode := api.AuthKeys
	if cfg.Auth == api.AuthOpen {
		mode = api.AuthOpen
	}
	// Logging in is a person typing a key: five tries at once, then one every 12 s, per client
	// address and per key id; the form must not be a faster way to guess keys than the API.
	login := auth.Limit{Rate: 5.0 / 60, Burst: 5}
	return &api.AuthConfig{Mode: mode, Keys: db,
		PerKey:    auth.Limit{Rate: cfg.KeyRate, Burst: cfg.KeyBurst},
		PerClient: auth.Limit{Rate: cfg.ClientRate, Burst: cfg.ClientBurst},
		Sessions:  db, SessionTTL: cfg.ConsoleSessionTTL, LoginPerClient: login, LoginPerKey: login}
}
