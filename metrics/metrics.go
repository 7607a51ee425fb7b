// Package metrics exposes the facilitator's Prometheus metrics. It owns one registry (never the
// global default one, so that two facilitators in one test process do not collide) and every
// collector. The components do not import Prometheus: each declares a small observer interface
// where it observes something, and *Metrics implements them all; what is state rather than an
// event (signers in flight, indexer lag, payment-identifier counts) is read at scrape time
// through plain functions, so the hot paths take no extra lock.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "facilitator"

// Metrics holds the registry and the collectors events are recorded in.
type Metrics struct {
	reg *prometheus.Registry

	verifyDuration *prometheus.HistogramVec
	verifyTotal    *prometheus.CounterVec
	settleDuration *prometheus.HistogramVec
	settleTotal    *prometheus.CounterVec

	nonceGaps *prometheus.CounterVec
	feeBumps  *prometheus.CounterVec
	// adopted counts transactions of our keys the ledger had lost and recorded again from the chain.
	adopted *prometheus.CounterVec
	// disagreements counts corroborated reads two RPC endpoints answered differently.
	disagreements *prometheus.CounterVec
	endpoints     *prometheus.CounterVec
	// rpcCalls counts JSON-RPC method calls by the component that made them (a batch element
	// counts as one call of its method): what a settlement costs the node, and who spends it.
	rpcCalls *prometheus.CounterVec

	reorgs     *prometheus.CounterVec
	reorgDepth *prometheus.HistogramVec

	webhooks *prometheus.CounterVec

	// loops holds each loop's last beat, in Unix seconds: a gauge a stuck loop stops moving.
	loops *prometheus.GaugeVec
}

// New builds the registry with the event collectors and the Go runtime and process collectors.
// The scrape-time sources are added with WatchSigners, WatchIndexers, WatchEndpoints,
// WatchSettlements and WatchPaymentIDs once
// what they read exists.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.verifyDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "verify_duration_seconds",
		Help:    "Time to answer POST /verify, by network.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"network"})
	m.verifyTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "verify_requests_total",
		Help: `POST /verify answers by network and reason: "valid", or the x402 invalidReason.`,
	}, []string{"network", "reason"})
	// A settlement waits for its receipt, up to the settle deadline (30 s by default).
	m.settleDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "settle_duration_seconds",
		Help:    "Time to answer POST /settle, by network.",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60},
	}, []string{"network"})
	m.settleTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "settle_requests_total",
		Help: `POST /settle answers by network and reason: "ok" for success, or the x402 errorReason.`,
	}, []string{"network", "reason"})
	m.nonceGaps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "nonce_gaps_total",
		Help: "Times a signer's nonce was not what its nonce owner expected, by kind: resync (the node's pending " +
			"nonce or the ledger moved it), nonce_used (a node refused a send as nonce too low), nonce_taken " +
			"(the ledger already had the nonce).",
	}, []string{"network", "signer", "kind"})
	m.adopted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "adopted_transactions_total",
		Help: "Mined transactions of a signer key that the ledger lacked (it lost its newest commits: a failover to an asynchronous " +
			"standby, a restore from a backup), recorded again from the chain as the settlements of the authorizations they used.",
	}, []string{"network", "signer"})
	m.feeBumps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "fee_bumps_total",
		Help: "Settlement transactions replaced with higher fees (same nonce).",
	}, []string{"network"})
	m.disagreements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "rpc_disagreements_total",
		Help: "Reads for a settlement's terminal decision that two RPC endpoints of the network answered differently (nothing was decided from them).",
	}, []string{"network"})
	m.endpoints = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "rpc_endpoint_failures_total",
		Help: "Times an RPC endpoint failed (transport, timeout, rate limit) and was left alone for its back-off.",
	}, []string{"network", "endpoint"})
	m.rpcCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "rpc_calls_total",
		Help: "JSON-RPC method calls made, by network, the component that made them (engine, verify, indexer, status, reconcile) and method; a batch element counts as one call.",
	}, []string{"network", "component", "method"})
	m.reorgs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "indexer_reorgs_total",
		Help: "Reorgs the block indexer rolled back and re-indexed.",
	}, []string{"network"})
	m.reorgDepth = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "indexer_reorg_depth_blocks",
		Help:    "Blocks rolled back per reorg.",
		Buckets: []float64{1, 2, 3, 5, 8, 13, 21, 34, 64, 128},
	}, []string{"network"})
	m.webhooks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "webhook_deliveries_total",
		Help: "Webhook delivery attempts by result: delivered, failed_retrying, gave_up.",
	}, []string{"result"})
	// Known from the start, so that rate() sees a delivery result's first increment.
	for _, r := range []string{"delivered", "failed_retrying", "gave_up"} {
		m.webhooks.WithLabelValues(r)
	}
	m.loops = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "loop_last_run_timestamp_seconds",
		Help: "When the loop last finished an iteration (Unix seconds); alert on its age, which grows when the loop is stuck. " +
			"network is empty for loops that are not per network (webhooks, jobs).",
	}, []string{"loop", "network"})
	m.reg.MustRegister(m.loops, m.verifyDuration, m.verifyTotal, m.settleDuration, m.settleTotal, m.nonceGaps, m.feeBumps, m.adopted, m.disagreements, m.endpoints, m.rpcCalls,
		m.reorgs, m.reorgDepth, m.webhooks,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in the Prometheus text (or negotiated) format.
// SetBuildInfo publishes facilitator_build_info{version, revision, go_version} 1: which release a
// replica runs, for joins in queries (`* on (instance) group_left (version) facilitator_build_info`)
// and for spotting replicas of two releases at once. Called once, at start.
func (m *Metrics) SetBuildInfo(version, revision, goVersion string) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help: "Always 1; the labels say which build this process runs: the module version, the VCS revision and the Go version.",
	}, []string{"version", "revision", "go_version"})
	g.WithLabelValues(version, revision, goVersion).Set(1)
	m.reg.MustRegister(g)
}

func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the registry, for tests and for adding collectors of one's own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Verified records a /verify answer (api.Observer).
func (m *Metrics) Verified(network, reason string, took time.Duration) {
	m.verifyDuration.WithLabelValues(network).Observe(took.Seconds())
	m.verifyTotal.WithLabelValues(network, reason).Inc()
}

// Settled records a /settle answer (api.Observer).
func (m *Metrics) Settled(network, reason string, took time.Duration) {
	m.settleDuration.WithLabelValues(network).Observe(took.Seconds())
	m.settleTotal.WithLabelValues(network, reason).Inc()
}

// FeeBumped records a fee bump (settle.Observer).
func (m *Metrics) FeeBumped(network string) { m.feeBumps.WithLabelValues(network).Inc() }

// NonceGap records a signer nonce that was not what the engine expected (settle.Observer).
func (m *Metrics) NonceGap(network, signer, kind string) {
	m.nonceGaps.WithLabelValues(network, signer, kind).Inc()
}

// Adopted records a transaction of signer's the ledger had lost, recorded again from the chain
// (settle.Observer, reconcile.Observer).
func (m *Metrics) Adopted(network, signer string) { m.adopted.WithLabelValues(network, signer).Inc() }

// Disagreement records a corroborated read two RPC endpoints answered differently
// (settle.Observer).
func (m *Metrics) Disagreement(network string) { m.disagreements.WithLabelValues(network).Inc() }

// EndpointFailed records an RPC endpoint's failure; endpoint is its name, never its URL.
func (m *Metrics) EndpointFailed(network, endpoint string) {
	m.endpoints.WithLabelValues(network, endpoint).Inc()
}

// RPCCall records one JSON-RPC method call a component made (ethrpc.CallObserver).
func (m *Metrics) RPCCall(network, component, method string) {
	m.rpcCalls.WithLabelValues(network, component, method).Inc()
}

// Reorg records a reorg the indexer handled (indexer.Observer).
func (m *Metrics) Reorg(network string, depth uint64) {
	m.reorgs.WithLabelValues(network).Inc()
	m.reorgDepth.WithLabelValues(network).Observe(float64(depth))
}

// WebhookAttempt records a webhook delivery attempt's result (notify.Observer).
func (m *Metrics) WebhookAttempt(result string) { m.webhooks.WithLabelValues(result).Inc() }

// Beat records that loop finished an iteration at at (settle.Observer, indexer.Observer,
// notify.Observer, and the jobs).
func (m *Metrics) Beat(loop, network string, at time.Time) {
	m.loops.WithLabelValues(loop, network).Set(unixSeconds(at))
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Signer is one signer key's state at scrape time.
type Signer struct {
	Network string
	Address string
	// InFlight counts the key's transactions signed and not yet resolved in this process.
	InFlight int
	// BalanceKnown says whether BalanceWei and BalanceLow were read; without it no balance
	// series is exported for the key (absent, rather than a misleading zero).
	BalanceKnown bool
	BalanceWei   float64
	BalanceLow   bool
	// BalanceReadAt is when the balance was read: a reading that stops moving is stale.
	BalanceReadAt time.Time
	// MinBalanceWei is the balance below which the key takes no new settlement (0: none), so
	// that an alert can tell how soon a draining key reaches it.
	MinBalanceWei float64
	// Retiring: the key takes no new settlement (--retire-signers). Held: this process holds the
	// key, and Open, its settlements this process still works, is known (absent elsewhere): a
	// retiring key whose holder reports 0 is drained.
	Retiring bool
	Held     bool
	Open     int
}

// SignerSource lists the signer keys; it is called on every scrape, so it must be cheap.
type SignerSource func() []Signer

// WatchSigners exports the signers src lists: in-flight transactions, and balances when known.
func (m *Metrics) WatchSigners(src SignerSource) {
	m.reg.MustRegister(newListCollector(src, []string{"network", "signer"},
		func(s Signer) []string { return []string{s.Network, s.Address} },
		series[Signer]{"signer_in_flight", "Settlement transactions signed and not yet resolved, per signer key.",
			func(s Signer) (float64, bool) { return float64(s.InFlight), true }},
		series[Signer]{"signer_balance_wei", "The signer key's native balance, in wei (absent when unknown).",
			func(s Signer) (float64, bool) { return s.BalanceWei, s.BalanceKnown }},
		series[Signer]{"signer_balance_low", "1 when the signer key's balance is below its alert threshold (absent when unknown).",
			func(s Signer) (float64, bool) { return boolValue(s.BalanceLow), s.BalanceKnown }},
		series[Signer]{"signer_balance_read_timestamp_seconds", "When the signer key's balance was last read (Unix seconds; absent before the first read).",
			func(s Signer) (float64, bool) { return unixSeconds(s.BalanceReadAt), s.BalanceKnown }},
		series[Signer]{"signer_balance_min_wei", "The balance below which the signer key takes no new settlement, in wei (0: no minimum).",
			func(s Signer) (float64, bool) { return s.MinBalanceWei, true }},
		series[Signer]{"signer_retiring", "1 when the signer key is retiring (--retire-signers): it takes no new settlement and finishes what it has open.",
			func(s Signer) (float64, bool) { return boolValue(s.Retiring), true }},
		series[Signer]{"signer_open_settlements", "Settlements of the signer key this process still works (signed, broadcast, or mined and not yet final); absent where another process holds the key. A retiring key at 0 is drained.",
			func(s Signer) (float64, bool) { return float64(s.Open), s.Held }},
	))
}

// RemoteSigner is one key of a remote signer at scrape time.
type RemoteSigner struct {
	Network, Address string
	// Known: the key was contacted (probed or asked to sign); up is absent before.
	Known, Up bool
	// LastSigned is when it last signed a transaction in this process (zero: absent).
	LastSigned time.Time
	// Refusals counts the transactions it did not sign, by reason (each reason listed, 0 too).
	Refusals map[string]uint64
}

// RemoteSignerSource lists the remote signers' keys; called on every scrape.
type RemoteSignerSource func() []RemoteSigner

// WatchRemoteSigners exports each remote key's state: up, its last signature's time, and the
// transactions it did not sign by reason.
func (m *Metrics) WatchRemoteSigners(src RemoteSignerSource) {
	m.reg.MustRegister(newListCollector(src, []string{"network", "signer"},
		func(s RemoteSigner) []string { return []string{s.Network, s.Address} },
		series[RemoteSigner]{"remote_signer_up", "1 when the remote signer's last answer (a probe every --balance-interval, or a signature) was for this key and the network's chain; 0 when it is unreachable, times out, wants a password, signs for another chain or lacks the key (absent before the first contact).",
			func(s RemoteSigner) (float64, bool) { return boolValue(s.Up), s.Known }},
		series[RemoteSigner]{"remote_signer_last_signature_timestamp_seconds", "When the remote signer last signed a transaction of this key for this process (Unix seconds; absent before the first).",
			func(s RemoteSigner) (float64, bool) { return unixSeconds(s.LastSigned), !s.LastSigned.IsZero() }},
	), refusalCollector{src, prometheus.NewDesc(namespace+"_remote_signer_refusals_total",
		"Transactions the remote signer did not sign for this process (settlements, batches, bumps, re-signs; not probes), by reason: unreachable, timeout, unauthorized, wrong_chain, unknown_key, refused (its policy), bad_answer.",
		[]string{"network", "signer", "reason"}, nil)})
}

// refusalCollector exports each remote key's refusals by reason, as counters.
type refusalCollector struct {
	src  RemoteSignerSource
	desc *prometheus.Desc
}

func (c refusalCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c refusalCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.src() {
		for reason, n := range s.Refusals {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), s.Network, s.Address, reason)
		}
	}
}

// NetworkFees is a network's max fee and its last fee reading at scrape time, in wei.
type NetworkFees struct {
	Network string
	// MaxFee is the most a transaction offers per gas; HasMax false: no limit (absent).
	MaxFee float64
	HasMax bool
	// Needed is the least fee cap a transaction could be mined at by the last reading (the next
	// base fee plus the tip, or the gas price), read at ReadAt; ReadAt zero: none yet (absent).
	Needed float64
	ReadAt time.Time
}

// NetworkFeesSource lists the networks' fees; called on every scrape.
type NetworkFeesSource func() []NetworkFees

// WatchNetworkFees exports each network's max fee beside the fee cap its chain needs now: while
// the second is above the first, every /settle answers 503 network_fees_above_cap.
func (m *Metrics) WatchNetworkFees(src NetworkFeesSource) {
	m.reg.MustRegister(newListCollector(src, []string{"network"},
		func(f NetworkFees) []string { return []string{f.Network} },
		series[NetworkFees]{"network_max_fee_wei", "The most a transaction of the network offers per gas, in wei (fees.maxFeeGwei or --max-fee-gwei; absent: no limit).",
			func(f NetworkFees) (float64, bool) { return f.MaxFee, f.HasMax }},
		series[NetworkFees]{"network_needed_fee_cap_wei", "The least fee cap (or gas price) a transaction could be mined at, by the network's last fee reading (the next base fee plus the tip), in wei; absent before the first reading (fees are read when a settlement is priced).",
			func(f NetworkFees) (float64, bool) { return f.Needed, !f.ReadAt.IsZero() }},
		series[NetworkFees]{"network_fee_read_timestamp_seconds", "When the network's fees were last read (Unix seconds; absent before the first reading).",
			func(f NetworkFees) (float64, bool) { return unixSeconds(f.ReadAt), !f.ReadAt.IsZero() }},
	))
}

// Indexer is one network's block indexer at scrape time.
type Indexer struct {
	Network string
	// Leader: this process indexes the network (a replica that does not has no lag of its own).
	Leader bool
	// Stopped: the indexer gave up (a reorg deeper than its window) and needs an operator.
	Stopped bool
	// Lag is head minus the last indexed block, as the leader last saw them.
	Lag uint64
}

// IndexerSource lists the indexers this process runs; called on every scrape.
type IndexerSource func() []Indexer

// WatchIndexers exports the indexers src lists: leadership, stopped, and the leader's lag.
func (m *Metrics) WatchIndexers(src IndexerSource) {
	m.reg.MustRegister(newListCollector(src, []string{"network"},
		func(ix Indexer) []string { return []string{ix.Network} },
		series[Indexer]{"indexer_lag_blocks", "Blocks between the chain head and the last indexed block (only where this process leads the indexer).",
			func(ix Indexer) (float64, bool) { return float64(ix.Lag), ix.Leader }},
		series[Indexer]{"indexer_leader", "1 when this process leads the network's indexer.",
			func(ix Indexer) (float64, bool) { return boolValue(ix.Leader), true }},
		series[Indexer]{"indexer_stopped", "1 when the network's indexer stopped and needs an operator.",
			func(ix Indexer) (float64, bool) { return boolValue(ix.Stopped), true }},
	))
}

// Endpoint is one RPC endpoint of a network at scrape time, named (rpc0, rpc1…), never by URL.
type Endpoint struct {
	Network, Name string
	Up            bool
	// Head is the highest block number it answered (0: none yet: not exported).
	Head uint64
}

// EndpointSource lists the RPC endpoints; called on every scrape.
type EndpointSource func() []Endpoint

// WatchEndpoints exports each RPC endpoint's health and head.
func (m *Metrics) WatchEndpoints(src EndpointSource) {
	m.reg.MustRegister(newListCollector(src, []string{"network", "endpoint"},
		func(e Endpoint) []string { return []string{e.Network, e.Name} },
		series[Endpoint]{"rpc_endpoint_up", "1 when the RPC endpoint's last call answered; 0 from a failure until it answers again.",
			func(e Endpoint) (float64, bool) { return boolValue(e.Up), true }},
		series[Endpoint]{"rpc_endpoint_head", "The highest block number the RPC endpoint answered.",
			func(e Endpoint) (float64, bool) { return float64(e.Head), e.Head > 0 }},
	))
}

// Open is the settlements this process works on in one network and state at scrape time.
type Open struct {
	Network, State string
	Count          int
	// Oldest is the age of the oldest one's first signature (not exported when Count is 0).
	Oldest time.Duration
}

// OpenSource lists the open settlements by network and state, empty states included; called on
// every scrape.
type OpenSource func() []Open

// WatchSettlements exports how many settlements are open in each state and the oldest one's age,
// so that one pending too long is seen however the engine is stuck.
func (m *Metrics) WatchSettlements(src OpenSource) {
	m.reg.MustRegister(newListCollector(src, []string{"network", "state"},
		func(o Open) []string { return []string{o.Network, o.State} },
		series[Open]{"settlements_open", "Settlements this process works on, by state: signed, broadcast (no receipt yet), mined (waiting for finality).",
			func(o Open) (float64, bool) { return float64(o.Count), true }},
		series[Open]{"settlement_oldest_open_seconds", "Age of the oldest open settlement in the state, from its first signature (absent when none).",
			func(o Open) (float64, bool) { return o.Oldest.Seconds(), o.Count > 0 }},
	))
}

// WatchPaymentIDs exports the payment-identifier conflicts and replays counts reads (the
// payment-identifier service's own counters, which only grow).
func (m *Metrics) WatchPaymentIDs(counts func() (conflicts, replays int64)) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "payment_id_conflicts_total",
			Help: "Requests that reused a payment identifier bound to a different payment."},
			func() float64 { c, _ := counts(); return float64(c) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "payment_id_replays_total",
			Help: "Requests answered from an earlier request under the same payment identifier."},
			func() float64 { _, r := counts(); return float64(r) }),
	)
}

// WatchClaims exports the count lapsed reads: the settle engine's successes answered whose claim's
// lease ended before their confirmation landed (each may have been answered to a second caller).
func (m *Metrics) WatchClaims(lapsed func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "success_claims_lapsed_total",
		Help: "Successes answered whose claim lapsed before its confirmation was recorded: each may have been answered to a second caller."},
		func() float64 { return float64(lapsed()) }))
}

// series is one gauge a listCollector reads off each item its source lists. value's ok false
// leaves the item's series out: a reading not known is absent rather than a misleading zero.
type series[T any] struct {
	name, help string
	value      func(T) (v float64, ok bool)
}

// listCollector exports, on every scrape, each of its series for each item src lists, labelled
// by labels; src is called once per scrape, so the series of one item are one consistent reading.
type listCollector[T any] struct {
	src    func() []T
	labels func(T) []string
	series []series[T]
	descs  []*prometheus.Desc
}

// newListCollector builds the collector; labelNames name what labels returns, in its order.
func newListCollector[T any](src func() []T, labelNames []string, labels func(T) []string, ss ...series[T]) *listCollector[T] {
	c := &listCollector[T]{src: src, labels: labels, series: ss}
	for _, s := range ss {
		c.descs = append(c.descs, prometheus.NewDesc(namespace+"_"+s.name, s.help, labelNames, nil))
	}
	return c
}

func (c *listCollector[T]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *listCollector[T]) Collect(ch chan<- prometheus.Metric) {
	for _, it := range c.src() {
		lv := c.labels(it)
		for i, s := range c.series {
			if v, ok := s.value(it); ok {
				ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.GaugeValue, v, lv...)
			}
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
