// Package loadgen is the load generator behind `facilitator-dev bench`: against a running local stack
// (anvil with USDC and a facilitator, as `facilitator-dev dev` starts them) it measures /verify and
// /settle under load, the payment-identifier replay path, the chain's own transaction ceiling and
// the facilitator's memory, and runs the same /verify and /settle load against the official
// TypeScript facilitator on the same chain as the reference. Payments are signed before any clock
// starts; settlements are counted on chain, not from the answers.
package loadgen

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/official"
)

// Config is one benchmark run.
type Config struct {
	FacilitatorURL string // our facilitator (open auth)
	RPCURL         string // the chain it settles on
	Asset          common.Address
	// Payers sign the payments (many authorizations each; EIP-3009 nonces are random, so payers
	// never collide). CeilingKey sends the ceiling loop's transactions and pays for them. Neither
	// may be a key a facilitator signs with.
	Payers     []*ecdsa.PrivateKey
	CeilingKey *ecdsa.PrivateKey
	Official   *official.Config // nil: no reference run

	// VerifyRates are the /verify phase's arrival rates per second, run in turn, each for
	// VerifyDuration on VerifyN distinct payments at most (fewer when the rate cannot use them):
	// 0 is a closed loop of VerifyConcurrency callers. The last rate's figures are the table's
	// headline /verify rows.
	VerifyRates       []float64
	VerifyN           int
	VerifyConcurrency int // the most /verify requests outstanding at once
	VerifyDuration    time.Duration
	SettleK, SettleC  int
	RefK              int // payments the reference settles (at SettleC)
	Replays           int
	// WebhookK is how many payments the webhook-dispatch phase settles with a webhook registered
	// (at SettleC); 0 skips it.
	WebhookK     int
	CeilingN     int // transactions per ceiling mode
	CeilingBatch int // transactions per JSON-RPC batch in the batched mode
	// CeilingWindow bounds unconfirmed ceiling transactions (anvil 1.7.1 jams near 1,000 pending);
	// CeilingInFlight is how many send requests are outstanding at once.
	CeilingWindow, CeilingInFlight int
	// PID is our facilitator's process, for its memory: 0 finds the one listening on
	// FacilitatorURL's port, -1 skips memory.
	PID int
	// NodePID is the chain node's process (anvil), for its CPU: 0 finds the one listening on
	// RPCURL's port, -1 skips it.
	NodePID int
	// Postgres lists the backends of our facilitator's database, for their CPU; nil skips it.
	Postgres   BackendLister
	RPCTimeout time.Duration // bound on each JSON-RPC call
	// Backfill, when set, runs the indexer backfill phase last; nil skips it and the table prints
	// IndexNote instead.
	Backfill  *Backfill
	IndexNote string
	Logger    *slog.Logger
}

// Check reports a configuration that cannot run.
func (c *Config) Check() error {
	var errs []error
	if c.FacilitatorURL == "" || c.RPCURL == "" {
		errs = append(errs, errors.New("the facilitator URL and the RPC URL are required"))
	}
	if len(c.Payers) == 0 || c.CeilingKey == nil {
		errs = append(errs, errors.New("payer keys and a ceiling sender key are required"))
	}
	if c.VerifyConcurrency < 1 || c.SettleC < 1 || c.SettleK < 1 || c.VerifyDuration <= 0 || c.WebhookK < 0 || c.VerifyN < 1 {
		errs = append(errs, errors.New("concurrencies, K, the verify payments and the verify duration must be positive"))
	}
	if len(c.VerifyRates) == 0 || slices.ContainsFunc(c.VerifyRates, func(r float64) bool { return r < 0 || math.IsNaN(r) || math.IsInf(r, 0) }) {
		errs = append(errs, errors.New("the /verify load needs at least one arrival rate, each positive or 0 (a closed loop)"))
	}
	if c.CeilingN > 0 && (c.CeilingBatch < 1 || c.CeilingInFlight < 1 || c.CeilingWindow < c.CeilingBatch) {
		errs = append(errs, errors.New("the ceiling needs a batch size >= 1, in-flight >= 1 and a window >= the batch"))
	}
	if c.Backfill != nil && (c.Backfill.DB == nil || c.Backfill.Key == nil || c.Backfill.Events < 1) {
		errs = append(errs, errors.New("the backfill needs a database, a sender key and at least one event"))
	}
	if c.Official != nil && (c.Official.Key == nil || c.Official.Script == "") {
		errs = append(errs, errors.New("the reference needs its script and a signer key"))
	}
	return errors.Join(errs...)
}

// Side is one facilitator's figures.
type Side struct {
	Name    string
	URL     string
	Signers int // signer keys it settles with
	// VerifyLevels are the /verify phase at each arrival rate, in the order run; Verify and
	// VerifyCPU are the last one's.
	VerifyLevels []VerifyLevel
	// IdleCPU is what each process spent in a moment with no request, right before the first
	// rate: the cost per second a low rate spreads over few verdicts.
	IdleCPU *CPUPhase
	Verify  *VerifyResult
	Settle  *SettleResult
	Memory  *Memory
	// Chain is the RPC URL of the chain this side settled on and HeadAtStart its head before the
	// side's first phase: each side gets a fresh chain, so that neither pays for the other's
	// blocks.
	Chain       string
	HeadAtStart uint64
	// Lookup is the status-lookup phase (ours only: the official facilitator has no status API).
	Lookup *LookupResult
	// VerifyCPU, SettleCPU and LookupCPU are the CPU each process spent in the /verify, /settle
	// and status-lookup phases.
	VerifyCPU, SettleCPU, LookupCPU *CPUPhase
	// Webhook is the webhook-dispatch phase (ours only) and WebhookCPU its CPU, for its
	// delivered events.
	Webhook    *WebhookResult
	WebhookCPU *CPUPhase
}

// VerifyLevel is the /verify load at one arrival rate and the CPU each process spent on it.
type VerifyLevel struct {
	Result VerifyResult
	CPU    *CPUPhase
}

// Report is everything one run measured.
type Report struct {
	Started        time.Time
	Machine        string
	FacilitatorURL string
	RPCURL         string
	Token          token
	HeadAtStart    uint64
	Ours, Ref      Side
	Replay         *ReplayResult
	Ceiling        []CeilingResult
	Backfill       *BackfillResult
	IndexNote      string
	Notes          []string
}

// Run runs every phase in turn and returns what it measured. Phases that grow the chain run in a
// fixed order (ours, the reference, the ceiling, then the indexer backfill), because anvil slows
// down as its chain grows: the report gives the head at the start and the blocks each phase
// mined, so that this can be judged. The backfill goes last because it grows the chain most
// (100,000 events and 200 empty blocks) and its timing is the indexer's, not the chain's writes.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rc, err := rpc.DialContext(ctx, cfg.RPCURL)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", cfg.RPCURL, err)
	}
	defer rc.Close()
	n := &node{c: rc, timeout: cfg.RPCTimeout}
	tok, err := readToken(ctx, n, cfg.Asset)
	if err != nil {
		return nil, err
	}
	// Enough idle connections for every worker: the default (2 per host) would measure TCP
	// handshakes rather than the facilitator.
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
	defer hc.CloseIdleConnections()
	ours := &poster{base: strings.TrimRight(cfg.FacilitatorURL, "/"), hc: hc}
	signers, err := supportedSigners(ctx, ours, tok)
	if err != nil {
		return nil, err
	}
	rep := &Report{Started: time.Now(), Machine: machine(), FacilitatorURL: cfg.FacilitatorURL, RPCURL: cfg.RPCURL,
		Token: tok, IndexNote: cfg.IndexNote,
		Ours: Side{Name: "ours", URL: cfg.FacilitatorURL, Signers: len(signers)}}
	if rep.HeadAtStart, err = n.head(ctx); err != nil {
		return nil, err
	}

	rep.Ours.Chain, rep.Ours.HeadAtStart = cfg.RPCURL, rep.HeadAtStart

	var ourMem *sampler
	facPID, facErr := facilitatorPID(cfg)
	if facErr != nil {
		rep.Notes = append(rep.Notes, "our memory not sampled: "+facErr.Error())
	} else if facPID > 0 {
		ourMem = startSampler(ctx, facPID, 100*time.Millisecond)
	}
	nodePID, nodeErr := chainNodePID(cfg)
	pg := cpuSource{role: RolePostgres, err: "not measured (no --facilitator-database-url)"}
	if cfg.Postgres != nil {
		pg = cpuSource{role: RolePostgres, list: cfg.Postgres.BackendPIDs}
	}
	ourCPU := []cpuSource{fixedSource(RoleFacilitator, facPID, facErr), fixedSource(RoleNode, nodePID, nodeErr), pg,
		fixedSource(RoleLoadgen, os.Getpid(), nil)}

	if err := verifyPhase(ctx, cfg, tok, ours, ourCPU, &rep.Ours, log); err != nil {
		return nil, err
	}

	pays, err := signPayments(tok, cfg.Payers, cfg.SettleK, time.Hour)
	if err != nil {
		return nil, err
	}
	log.Info("settle load", "side", "ours", "k", cfg.SettleK, "c", cfg.SettleC)
	if rep.Ours.Settle, rep.Ours.SettleCPU, err = settlePhase(ctx, n, ours, tok, pays, cfg.SettleC, signers, ourCPU); err != nil {
		return nil, err
	}
	rep.Ours.Settle.Signers = len(signers)

	// Status lookups of the payments just settled, at the verify phase's concurrency and length.
	log.Info("status lookups", "side", "ours", "c", cfg.VerifyConcurrency, "for", cfg.VerifyDuration)
	cpu := startCPU(ctx, ourCPU, cpuEvery)
	l := runLookups(ctx, ours, tok, pays, cfg.VerifyConcurrency, cfg.VerifyDuration)
	rep.Ours.Lookup, rep.Ours.LookupCPU = &l, cpu.finish(ctx, l.Requests)

	if cfg.WebhookK > 0 {
		hookPays, err := signPayments(tok, cfg.Payers, cfg.WebhookK, time.Hour)
		if err != nil {
			return nil, err
		}
		log.Info("webhook dispatch", "side", "ours", "k", cfg.WebhookK, "c", cfg.SettleC)
		if rep.Ours.Webhook, rep.Ours.WebhookCPU, err = runWebhookPhase(ctx, ours, n, hookPays, cfg.SettleC, ourCPU); err != nil {
			return nil, fmt.Errorf("webhook dispatch: %w", err)
		}
	}

	if cfg.Replays > 0 {
		id, err := newPaymentID()
		if err != nil {
			return nil, err
		}
		p, err := signPayment(tok, cfg.Payers[0], time.Hour, id)
		if err != nil {
			return nil, err
		}
		log.Info("payment-identifier replays", "n", cfg.Replays)
		r, err := runReplay(ctx, ours, n, p, cfg.Replays)
		if err != nil {
			return nil, err
		}
		rep.Replay = &r
	}
	if ourMem != nil {
		m := ourMem.finish()
		rep.Ours.Memory = &m
	}

	if cfg.Official != nil {
		if err := runReference(ctx, cfg, tok, rep, log); err != nil {
			return nil, fmt.Errorf("reference: %w", err)
		}
	}

	if cfg.CeilingN > 0 {
		for _, batch := range []int{1, cfg.CeilingBatch} {
			log.Info("chain ceiling", "n", cfg.CeilingN, "batch", batch)
			c, err := ceilingPhase(ctx, cfg, n, tok, batch)
			if err != nil {
				return nil, fmt.Errorf("ceiling (batch %d): %w", batch, err)
			}
			rep.Ceiling = append(rep.Ceiling, c)
		}
	}

	if b := cfg.Backfill; b != nil {
		log.Info("indexer backfill: emitting", "events", b.Events)
		e, err := EmitEvents(ctx, rc, cfg.RPCTimeout, b.Key, b.Events)
		if err != nil {
			return nil, fmt.Errorf("backfill: %w", err)
		}
		// A network id of the run's own: the rows never mix with a facilitator's index, even in
		// its database, and a second run on the same database starts from an empty cursor.
		network := fmt.Sprintf("%s#bench-%d", facilitator.CAIP2(tok.ChainID), time.Now().Unix())
		log.Info("indexer backfill: indexing", "network", network, "events", e.Events, "from", e.DeployBlock, "to", e.Head)
		r, err := TimeBackfill(ctx, rc, cfg.RPCTimeout, b.DB, network, e, log)
		if err != nil {
			return nil, fmt.Errorf("backfill: %w", err)
		}
		rep.Backfill = &r
	}
	return rep, nil
}

// runReference starts the official facilitator and runs the same verify and settle load on it.
func runReference(ctx context.Context, cfg Config, tok token, rep *Report, log *slog.Logger) error {
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// A fresh anvil of its own, set up as the dev stack sets up ours (the same deployments, so
	// the same token address and head), so that the reference neither pays for our blocks nor
	// meets a chain we grew.
	chain, err := devchain.Start(startCtx, devchain.Options{ChainID: tok.ChainID, Logger: log})
	if err != nil {
		return fmt.Errorf("a fresh chain for the reference: %w", err)
	}
	defer chain.Close()
	rn := &node{c: chain.RPC, timeout: cfg.RPCTimeout}
	rtok, err := readToken(ctx, rn, tok.Address)
	if err != nil {
		return err
	}
	if rtok != tok {
		return fmt.Errorf("the reference's chain has a different token (%+v) from ours (%+v)", rtok, tok)
	}
	head, err := rn.head(ctx)
	if err != nil {
		return err
	}
	proc, err := official.Start(startCtx, *cfg.Official, chain.RPCURL, tok.ChainID)
	if err != nil {
		return err
	}
	defer proc.Stop()
	mem := startSampler(ctx, proc.Pid(), 100*time.Millisecond)
	hc := &http.Client{Timeout: 4 * time.Minute, Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512}}
	defer hc.CloseIdleConnections()
	ref := &poster{base: proc.URL, hc: hc}
	rep.Ref = Side{Name: "official", URL: proc.URL, Signers: 1, Chain: chain.RPCURL, HeadAtStart: head}
	refCPU := []cpuSource{fixedSource(RoleFacilitator, proc.Pid(), nil), fixedSource(RoleNode, chain.PID(), nil),
		{role: RolePostgres, err: "n/a (no database)"}, fixedSource(RoleLoadgen, os.Getpid(), nil)}

	if err := verifyPhase(ctx, cfg, tok, ref, refCPU, &rep.Ref, log); err != nil {
		return err
	}
	if cfg.RefK > 0 {
		pays, err := signPayments(tok, cfg.Payers, cfg.RefK, time.Hour)
		if err != nil {
			return err
		}
		log.Info("settle load", "side", "official", "k", cfg.RefK, "c", cfg.SettleC)
		signer := crypto.PubkeyToAddress(cfg.Official.Key.PublicKey)
		if rep.Ref.Settle, rep.Ref.SettleCPU, err = settlePhase(ctx, rn, ref, tok, pays, cfg.SettleC, []common.Address{signer}, refCPU); err != nil {
			return err
		}
		rep.Ref.Settle.Signers = 1
	}
	m := mem.finish()
	rep.Ref.Memory = &m
	return nil
}

// verifyPhase runs the /verify load at each of cfg.VerifyRates in turn, measuring the CPU of the
// sources' processes over each, and records the levels in side. Each level's payments are signed
// before its clock starts, and none is sent twice.
func verifyPhase(ctx context.Context, cfg Config, tok token, p *poster, sources []cpuSource, side *Side, log *slog.Logger) error {
	log.Info("idle", "side", side.Name, "for", idleWindow)
	idle := startCPU(ctx, sources, cpuEvery)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(idleWindow):
	}
	side.IdleCPU = idle.finish(ctx, 0)
	for _, offered := range cfg.VerifyRates {
		n := cfg.VerifyN
		if offered > 0 {
			// What the rate can send in the phase's time, and one more for the request at its start.
			n = min(n, int(math.Ceil(offered*cfg.VerifyDuration.Seconds()))+1)
		}
		pays, err := signPayments(tok, cfg.Payers, n, time.Hour)
		if err != nil {
			return err
		}
		log.Info("verify load", "side", side.Name, "rate", offered, "c", cfg.VerifyConcurrency, "payments", n, "for", cfg.VerifyDuration)
		cpu := startCPU(ctx, sources, cpuEvery)
		v := runVerify(ctx, p, pays, offered, cfg.VerifyConcurrency, cfg.VerifyDuration)
		side.VerifyLevels = append(side.VerifyLevels, VerifyLevel{Result: v, CPU: cpu.finish(ctx, v.Requests)})
	}
	last := &side.VerifyLevels[len(side.VerifyLevels)-1]
	side.Verify, side.VerifyCPU = &last.Result, last.CPU
	return nil
}

// idleWindow is how long each side's processes are measured with no request before the /verify
// rates: long enough for 20 clock ticks at 1 % of a core.
const idleWindow = 2 * time.Second

// settlePhase runs the settle load, measuring the CPU of the sources' processes over it, and then
// counts, on chain, what the blocks it spanned hold.
func settlePhase(ctx context.Context, n *node, p *poster, tok token, pays []*payment, c int, signers []common.Address, sources []cpuSource) (*SettleResult, *CPUPhase, error) {
	from, err := n.head(ctx)
	if err != nil {
		return nil, nil, err
	}
	cpu := startCPU(ctx, sources, cpuEvery)
	r := runSettle(ctx, p, n, pays, c)
	phase := cpu.finish(ctx, r.Confirmed)
	to, err := n.head(ctx)
	if err != nil {
		return nil, nil, err
	}
	if r.Chain, err = countOnChain(ctx, n, tok.Address, from+1, to, pays, signers); err != nil {
		return nil, nil, fmt.Errorf("counting transfers on chain: %w", err)
	}
	return &r, phase, nil
}

// cpuEvery is how often a phase's processes are sampled: only Postgres backends that a pool
// closes mid-phase need it (the CPU since their last sample is lost).
const cpuEvery = 100 * time.Millisecond

// fixedSource is one process of a role; a negative pid or an error leaves the role unmeasured.
func fixedSource(role string, pid int, err error) cpuSource {
	switch {
	case err != nil:
		return cpuSource{role: role, err: err.Error()}
	case pid <= 0:
		return cpuSource{role: role, err: "skipped"}
	}
	return cpuSource{role: role, pid: pid}
}

func ceilingPhase(ctx context.Context, cfg Config, n *node, tok token, batch int) (CeilingResult, error) {
	r := CeilingResult{Mode: "one per request", N: cfg.CeilingN}
	if batch > 1 {
		r.Mode = fmt.Sprintf("batches of %d", batch)
	}
	raws, pays, err := ceilingTxs(ctx, n, tok, cfg.CeilingKey, cfg.CeilingN)
	if err != nil {
		return r, err
	}
	from, err := n.head(ctx)
	if err != nil {
		return r, err
	}
	sender := crypto.PubkeyToAddress(cfg.CeilingKey.PublicKey)
	inFlight := cfg.CeilingInFlight
	if batch > 1 {
		inFlight = max(1, cfg.CeilingWindow/batch)
	}
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if r.Elapsed, r.Nudges, err = runCeiling(runCtx, n, sender, raws, batch, cfg.CeilingWindow, inFlight); err != nil {
		return r, err
	}
	to, err := n.head(ctx)
	if err != nil {
		return r, err
	}
	r.Chain, err = countOnChain(ctx, n, tok.Address, from+1, to, pays, []common.Address{sender})
	return r, err
}

// readToken reads the token's EIP-712 name and version from the chain: what a payer's wallet
// would put in the domain.
func readToken(ctx context.Context, n *node, addr common.Address) (token, error) {
	id, err := n.uint(ctx, "eth_chainId")
	if err != nil {
		return token{}, err
	}
	name, err := n.callString(ctx, addr, "name()")
	if err != nil {
		return token{}, fmt.Errorf("reading the token at %s: %w", addr, err)
	}
	version, err := n.callString(ctx, addr, "version()")
	if err != nil {
		return token{}, fmt.Errorf("reading the token at %s: %w", addr, err)
	}
	return newToken(addr, name, version, id), nil
}

// supportedSigners asks /supported which keys the facilitator settles with, and checks that it
// supports the chain at all.
func supportedSigners(ctx context.Context, p *poster, tok token) ([]common.Address, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/supported", nil)
	if err != nil {
		return nil, err
	}
	res, err := p.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("is the stack up ('make run')? %w", err)
	}
	defer res.Body.Close()
	var sup facilitator.SupportedResponse
	if err := decodeJSON(res, &sup); err != nil {
		return nil, fmt.Errorf("GET /supported: %w", err)
	}
	network := facilitator.CAIP2(tok.ChainID)
	found := false
	for _, k := range sup.Kinds {
		found = found || (k.Network == network && k.X402Version == 2)
	}
	if !found {
		return nil, fmt.Errorf("the facilitator at %s does not support %s (v2)", p.base, network)
	}
	var out []common.Address
	for _, s := range sup.Signers["eip155:*"] {
		out = append(out, common.HexToAddress(s))
	}
	return out, nil
}

func facilitatorPID(cfg Config) (int, error) {
	if cfg.PID != 0 {
		return cfg.PID, nil
	}
	return urlPID(cfg.FacilitatorURL)
}

func chainNodePID(cfg Config) (int, error) {
	if cfg.NodePID != 0 {
		return cfg.NodePID, nil
	}
	return urlPID(cfg.RPCURL)
}

// urlPID is the local process listening on a URL's port.
func urlPID(raw string) (int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0, fmt.Errorf("no port in %s", u.Redacted())
	}
	return listeningPID(port)
}

// machine is the core count and CPU model, for the report's header.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtime.NumCPU(), model)
}
