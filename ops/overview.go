// Package ops is the operations overview: the aggregates an operator watches, assembled from the
// ledger (every replica's settlements, settlement times, webhook deliveries, reconcile runs), this
// replica's answers and latencies (Answers), its signer keys and indexers, and a live check of
// recent settlements against the chain. Each section is read within its own bound and fails on
// its own: a section that cannot be read says so, and the rest is still there.
package ops

import (
	"context"
	"log/slog"
	"maps"
	"math/big"
	"slices"
	"sync"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/ledgercheck"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// Ledger is what the overview reads of the ledger (postgres.DB has it).
type Ledger interface {
	SettlementsPerMinute(ctx context.Context, since time.Time) ([]facilitator.MinuteCount, error)
	SettlementTimes(ctx context.Context, since time.Time) (facilitator.SettlementTimes, error)
	WebhookDeliveryCounts(ctx context.Context, since time.Time) (facilitator.DeliveryCounts, error)
	ReconcileRuns(ctx context.Context, limit int) ([]facilitator.ReconcileRun, error)
	RecentSettled(ctx context.Context, limit int) ([]facilitator.Settlement, error)
}

// Signers are the settlement engine's keys (settle.Engine has it).
type Signers interface {
	Signers() []settle.SignerHealth
}

// Indexer is one network's block indexer (indexer.Indexer has it).
type Indexer interface {
	Health() indexer.Health
}

// Config configures the overview.
type Config struct {
	Ledger  Ledger
	Answers *Answers
	// Engine's keys and Indexers (by network id) are this process's, read at the time of the
	// request; nil: none here.
	Engine   Signers
	Indexers map[string]Indexer
	// Chains are the networks' RPC access for the ledger check, by network id.
	Chains map[string]Chain
	Now    func() time.Time
	Logger *slog.Logger
	// QueryTimeout bounds each ledger read (default 5s); RPCTimeout each chain batch (default 5s).
	QueryTimeout, RPCTimeout time.Duration
	// CheckLast is how many recent settlements the ledger check reads (default 20).
	CheckLast int
	// CacheFor is how long a ledger read or a ledger check is reused (default 3s): a page
	// reloaded often costs the ledger and the node one read per period, whoever asks.
	CacheFor time.Duration
}

// Overview assembles the snapshot.
type Overview struct {
	cfg    Config
	log    *slog.Logger
	ledger cache[ledgerPart]
	check  cache[LedgerCheck]
}

// New builds the overview.
func New(cfg Config) *Overview {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Answers == nil {
		cfg.Answers = NewAnswers(cfg.Now)
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 5 * time.Second
	}
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = 5 * time.Second
	}
	if cfg.CheckLast == 0 {
		cfg.CheckLast = 20
	}
	if cfg.CacheFor == 0 {
		cfg.CacheFor = 3 * time.Second
	}
	o := &Overview{cfg: cfg, log: cfg.Logger}
	o.ledger = newCache(cfg.CacheFor, cfg.Now, o.readLedger)
	o.check = newCache(cfg.CacheFor, cfg.Now, o.checkLedger)
	return o
}

// Section is every section's state: Available false with Error in words when it could not be
// read (never the cause's text, which may carry a URL).
type Section struct {
	Available bool   `json:"available"`
	Error     string `json:"error,omitempty"`
}

// Snapshot is the overview, as GET /v1/ops/overview answers it. Minute series are aligned:
// element i of every series is minute Minutes[i] (Unix seconds, oldest first, the current minute
// last).
type Snapshot struct {
	GeneratedAt     time.Time       `json:"generatedAt"`
	Minutes         []int64         `json:"minutes"`
	Settlements     Settlements     `json:"settlements"`
	Answers         AnswerCounts    `json:"answers"`
	Latency         Latency         `json:"latency"`
	SettlementTimes SettlementTimes `json:"settlementTimes"`
	Signers         SignerKeys      `json:"signers"`
	Indexers        Indexers        `json:"indexers"`
	Webhooks        Webhooks        `json:"webhooks"`
	Reconcile       Reconcile       `json:"reconcile"`
	LedgerCheck     LedgerCheck     `json:"ledgerCheck"`
}

// Settlements are every replica's settlements created per minute, by their state now.
type Settlements struct {
	Section
	Total   int              `json:"total"`
	ByState map[string][]int `json:"byState"`
	// LastMinutePerSecond is the rate over the last whole minute (the current one is still
	// filling); PeakPerSecond the busiest minute's of the hour. Settlements per second, by the
	// minute they were created in.
	LastMinutePerSecond float64 `json:"lastMinutePerSecond"`
	PeakPerSecond       float64 `json:"peakPerSecond"`
}

// AnswerCounts are this replica's /verify and /settle answers per minute, by reason.
type AnswerCounts struct {
	Section
	Scope  string           `json:"scope"` // "this replica"
	Verify map[string][]int `json:"verify"`
	Settle map[string][]int `json:"settle"`
	// Totals are the hour's counts by reason.
	VerifyTotal map[string]int `json:"verifyTotal"`
	SettleTotal map[string]int `json:"settleTotal"`
}

// Quantiles are a distribution's percentiles in milliseconds.
type Quantiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50Ms"`
	P90   float64 `json:"p90Ms"`
	P99   float64 `json:"p99Ms"`
}

// EndpointLatency is one endpoint's latency: over the hour, and per minute (null: no answers).
type EndpointLatency struct {
	Hour Quantiles  `json:"hour"`
	P50  []*float64 `json:"p50Ms"`
	P90  []*float64 `json:"p90Ms"`
	P99  []*float64 `json:"p99Ms"`
}

// Latency is this replica's answer latencies, from a fixed histogram (each value is its bin's
// upper bound: at most 25% high).
type Latency struct {
	Section
	Scope  string          `json:"scope"`
	Verify EndpointLatency `json:"verify"`
	Settle EndpointLatency `json:"settle"`
}

// SettlementTimes are every replica's settlements of the hour, from signed to mined and final.
type SettlementTimes struct {
	Section
	ToMined Quantiles `json:"toMined"`
	ToFinal Quantiles `json:"toFinal"`
}

// SignerRow is one signer key.
type SignerRow struct {
	Network      string     `json:"network"`
	Address      string     `json:"address"`
	InFlight     int        `json:"inFlight"`
	BalanceWei   string     `json:"balanceWei,omitempty"`
	BalanceEther string     `json:"balanceEther,omitempty"`
	ReadAt       *time.Time `json:"balanceReadAt,omitempty"`
	Low          bool       `json:"low"`
	Leased       bool       `json:"leased"`
	NextNonce    *uint64    `json:"nextNonce"`
}

// SignerKeys are this process's signer keys.
type SignerKeys struct {
	Section
	Rows []SignerRow `json:"rows"`
}

// IndexerRow is one network's indexer in this process.
type IndexerRow struct {
	Network    string `json:"network"`
	Head       uint64 `json:"head"`
	Cursor     uint64 `json:"cursor"`
	Lag        uint64 `json:"lag"`
	Leader     bool   `json:"leader"`
	Subscribed bool   `json:"subscribed"`
	Stopped    bool   `json:"stopped"`
}

// Indexers are this process's indexers.
type Indexers struct {
	Section
	Rows []IndexerRow `json:"rows"`
}

// Webhooks are every replica's webhook deliveries of the hour.
type Webhooks struct {
	Section
	Delivered     int            `json:"delivered"`
	Retrying      int            `json:"retrying"`
	GaveUp        int            `json:"gaveUp"`
	ByStatusClass map[string]int `json:"byStatusClass"`
}

// RunRow is one reconcile job run.
type RunRow struct {
	Job        string         `json:"job"`
	Network    string         `json:"network"`
	Started    time.Time      `json:"started"`
	DurationMs float64        `json:"durationMs"`
	Examined   int            `json:"examined"`
	Changed    map[string]int `json:"changed"`
	Error      string         `json:"error,omitempty"`
}

// Reconcile are the last reconcile runs, newest first.
type Reconcile struct {
	Section
	Runs []RunRow `json:"runs"`
}

// LedgerCheck is the recent settlements checked against the chain.
type LedgerCheck struct {
	Section
	CheckedAt  time.Time  `json:"checkedAt"`
	Agrees     int        `json:"agrees"`
	Disagrees  int        `json:"disagrees"`
	Unreadable int        `json:"unreadable"`
	Rows       []CheckRow `json:"rows"`
}

// Runs is how many reconcile runs the overview lists.
const Runs = 20

const (
	ledgerDown = "the ledger (Postgres) could not be read"
	thisOne    = "this replica"
)

// Overview reads everything, each section within its bound; ctx bounds the whole.
func (o *Overview) Overview(ctx context.Context) Snapshot {
	now := o.cfg.Now()
	s := Snapshot{GeneratedAt: now.UTC()}
	win := o.cfg.Answers.Window()
	s.Minutes = make([]int64, len(win))
	for i, m := range win {
		s.Minutes[i] = m.Start.Unix()
	}
	var wg sync.WaitGroup
	var lp ledgerPart
	wg.Go(func() { lp = o.ledger.get(ctx) })
	wg.Go(func() { s.LedgerCheck = o.check.get(ctx) })
	s.Answers, s.Latency = answersOf(win)
	s.Signers = o.signers()
	s.Indexers = o.indexers()
	wg.Wait()
	s.Settlements = lp.settlements(s.Minutes)
	s.SettlementTimes, s.Webhooks, s.Reconcile = lp.times, lp.webhooks, lp.runs
	// A request that ended while another read for it (the cache's single flight) has nothing.
	for _, sec := range []*Section{&s.Settlements.Section, &s.SettlementTimes.Section, &s.Webhooks.Section, &s.Reconcile.Section, &s.LedgerCheck.Section} {
		if !sec.Available && sec.Error == "" {
			sec.Error = "not read in time"
		}
	}
	return s
}

// ledgerPart is what one round of ledger reads found.
type ledgerPart struct {
	perMinute   []facilitator.MinuteCount
	perMinuteOK bool
	times       SettlementTimes
	webhooks    Webhooks
	runs        Reconcile
}

func (o *Overview) readLedger(ctx context.Context) ledgerPart {
	since := o.cfg.Now().Add(-Minutes * time.Minute).Truncate(time.Minute)
	var p ledgerPart
	read := func(what string, f func(context.Context) error) bool {
		ctx, cancel := context.WithTimeout(ctx, o.cfg.QueryTimeout)
		defer cancel()
		if err := f(ctx); err != nil {
			o.log.WarnContext(ctx, "ops: reading the ledger", "what", what, "err", err)
			return false
		}
		return true
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		p.perMinuteOK = read("settlements per minute", func(ctx context.Context) (err error) {
			p.perMinute, err = o.cfg.Ledger.SettlementsPerMinute(ctx, since)
			return err
		})
	})
	wg.Go(func() {
		var t facilitator.SettlementTimes
		if read("settlement times", func(ctx context.Context) (err error) { t, err = o.cfg.Ledger.SettlementTimes(ctx, since); return err }) {
			p.times = SettlementTimes{Section: Section{Available: true}, ToMined: quantiles(t.ToMined), ToFinal: quantiles(t.ToFinal)}
		} else {
			p.times.Error = ledgerDown
		}
	})
	wg.Go(func() {
		var d facilitator.DeliveryCounts
		if read("webhook deliveries", func(ctx context.Context) (err error) {
			d, err = o.cfg.Ledger.WebhookDeliveryCounts(ctx, since)
			return err
		}) {
			p.webhooks = Webhooks{Section: Section{Available: true}, Delivered: d.Delivered, Retrying: d.Retrying, GaveUp: d.GaveUp,
				ByStatusClass: d.ByStatusClass}
		} else {
			p.webhooks.Error = ledgerDown
		}
	})
	wg.Go(func() {
		var runs []facilitator.ReconcileRun
		if read("reconcile runs", func(ctx context.Context) (err error) { runs, err = o.cfg.Ledger.ReconcileRuns(ctx, Runs); return err }) {
			p.runs = Reconcile{Section: Section{Available: true}, Runs: []RunRow{}}
			for _, r := range runs {
				p.runs.Runs = append(p.runs.Runs, RunRow{Job: r.Job, Network: r.Network, Started: r.Started.UTC(),
					DurationMs: ms(r.Finished.Sub(r.Started)), Examined: r.Examined, Changed: r.Changed, Error: r.Error})
			}
		} else {
			p.runs.Error = ledgerDown
		}
	})
	wg.Wait()
	return p
}

// settlements lays the per-minute counts on the snapshot's minutes.
func (p ledgerPart) settlements(minutes []int64) Settlements {
	if !p.perMinuteOK {
		return Settlements{Section: Section{Error: ledgerDown}}
	}
	s := Settlements{Section: Section{Available: true}, ByState: map[string][]int{}}
	at := make(map[int64]int, len(minutes))
	for i, m := range minutes {
		at[m] = i
	}
	for _, c := range p.perMinute {
		i, ok := at[c.Minute.Unix()]
		if !ok {
			continue // a minute just before the window
		}
		row := s.ByState[string(c.State)]
		if row == nil {
			row = make([]int, len(minutes))
			s.ByState[string(c.State)] = row
		}
		row[i] += c.Count
		s.Total += c.Count
	}
	perMinute := make([]int, len(minutes))
	for _, row := range s.ByState {
		for i, n := range row {
			perMinute[i] += n
		}
	}
	for i, n := range perMinute {
		s.PeakPerSecond = max(s.PeakPerSecond, float64(n)/60)
		if i == len(perMinute)-2 {
			s.LastMinutePerSecond = float64(n) / 60
		}
	}
	return s
}

func (o *Overview) checkLedger(ctx context.Context) LedgerCheck {
	c := LedgerCheck{CheckedAt: o.cfg.Now().UTC(), Rows: []CheckRow{}}
	qctx, cancel := context.WithTimeout(ctx, o.cfg.QueryTimeout)
	rows, err := o.cfg.Ledger.RecentSettled(qctx, o.cfg.CheckLast)
	cancel()
	if err != nil {
		o.log.WarnContext(ctx, "ops: reading recent settlements", "err", err)
		c.Error = ledgerDown
		return c
	}
	c.Available = true
	c.Rows = checkChain(ctx, o.cfg.Chains, rows, o.cfg.RPCTimeout)
	for _, r := range c.Rows {
		switch r.Verdict {
		case ledgercheck.Agrees:
			c.Agrees++
		case ledgercheck.Disagrees:
			c.Disagrees++
		default:
			c.Unreadable++
		}
	}
	return c
}

func (o *Overview) signers() SignerKeys {
	s := SignerKeys{Section: Section{Available: true}, Rows: []SignerRow{}}
	if o.cfg.Engine == nil {
		return s
	}
	for _, k := range o.cfg.Engine.Signers() {
		r := SignerRow{Network: k.Network, Address: k.Address.Hex(), InFlight: k.InFlight, Low: k.BalanceLow, Leased: k.Leased,
			NextNonce: k.NextNonce}
		if k.Balance != nil {
			r.BalanceWei, r.BalanceEther = k.Balance.String(), ether(k.Balance)
			at := k.BalanceReadAt.UTC()
			r.ReadAt = &at
		}
		s.Rows = append(s.Rows, r)
	}
	return s
}

func (o *Overview) indexers() Indexers {
	s := Indexers{Section: Section{Available: true}, Rows: []IndexerRow{}}
	for _, id := range slices.Sorted(maps.Keys(o.cfg.Indexers)) {
		h := o.cfg.Indexers[id].Health()
		s.Rows = append(s.Rows, IndexerRow{Network: id, Head: h.Head, Cursor: h.Cursor, Lag: h.Lag, Leader: h.Leader,
			Subscribed: h.Subscribed, Stopped: h.Stopped})
	}
	return s
}

// answersOf turns the ring's window into the answer counts and latencies.
func answersOf(win []Minute) (AnswerCounts, Latency) {
	a := AnswerCounts{Section: Section{Available: true}, Scope: thisOne, Verify: map[string][]int{}, Settle: map[string][]int{},
		VerifyTotal: map[string]int{}, SettleTotal: map[string]int{}}
	l := Latency{Section: Section{Available: true}, Scope: thisOne}
	series := [2]map[string][]int{a.Verify, a.Settle}
	totals := [2]map[string]int{a.VerifyTotal, a.SettleTotal}
	lat := [2]*EndpointLatency{&l.Verify, &l.Settle}
	var hour [2]histogram
	for e := range 2 {
		lat[e].P50, lat[e].P90, lat[e].P99 = make([]*float64, len(win)), make([]*float64, len(win)), make([]*float64, len(win))
	}
	for i, m := range win {
		for e := range 2 {
			for reason, n := range m.Reasons[e] {
				if series[e][reason] == nil {
					series[e][reason] = make([]int, len(win))
				}
				series[e][reason][i] += n
				totals[e][reason] += n
			}
			h := m.Latency[e]
			hour[e].merge(h)
			lat[e].P50[i], lat[e].P90[i], lat[e].P99[i] = quantilePtr(&h, .5), quantilePtr(&h, .9), quantilePtr(&h, .99)
		}
	}
	for e := range 2 {
		lat[e].Hour = histQuantiles(&hour[e])
	}
	return a, l
}

func quantilePtr(h *histogram, q float64) *float64 {
	d, ok := h.quantile(q)
	if !ok {
		return nil
	}
	v := ms(d)
	return &v
}

func histQuantiles(h *histogram) Quantiles {
	q := Quantiles{Count: h.count()}
	if q.Count > 0 {
		p50, _ := h.quantile(.5)
		p90, _ := h.quantile(.9)
		p99, _ := h.quantile(.99)
		q.P50, q.P90, q.P99 = ms(p50), ms(p90), ms(p99)
	}
	return q
}

func quantiles(p facilitator.Percentiles) Quantiles {
	return Quantiles{Count: p.Count, P50: ms(p.P50), P90: ms(p.P90), P99: ms(p.P99)}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ether is wei in ether, to 6 decimals (rounded down).
func ether(wei *big.Int) string {
	f := new(big.Rat).SetFrac(wei, big.NewInt(1e18))
	return f.FloatString(6)
}
