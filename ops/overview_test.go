package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/ledgercheck"
	"github.com/x402-facilitator/x402-facilitator/ops"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// ledger opens a database of the test's own (name) and a pool that writes its rows directly.
func ledger(t *testing.T, name string) (*postgres.DB, *pgxpool.Pool) {
	t.Helper()
	u := env.Ledger(t, name)
	db, err := postgres.Open(t.Context(), u, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	pool, err := pgxpool.New(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return db, pool
}

// row inserts a settlement created at created in state, with its mined and final events after
// the given delays (0: none); it returns its id.
func row(t *testing.T, pool *pgxpool.Pool, created time.Time, state facilitator.State, mined, final time.Duration) int64 {
	t.Helper()
	nonce := stacktest.Random32(t)
	addr := stacktest.NewAddress(t)
	var id int64
	err := pool.QueryRow(t.Context(), `INSERT INTO settlements (network, asset, payer, auth_nonce, pay_to, value, valid_after,
			valid_before, x402_version, request, fingerprint, signer, tx_nonce, state, created_at)
		VALUES ($1, $2, $3, $4, $3, 1, 0, 99999999999, 2, '\x7b7d', $4, $2, (SELECT count(*) FROM settlements), $5, $6) RETURNING id`,
		env.Network().ID, addr[:], stacktest.NewAddress(t).Bytes(), nonce[:], string(state), created).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	for ev, after := range map[string]time.Duration{"mined": mined, "final": final} {
		if after == 0 {
			continue
		}
		if _, err := pool.Exec(t.Context(), `INSERT INTO settlement_events (settlement_id, state, at) VALUES ($1, $2, $3)`,
			id, ev, created.Add(after)); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// The ledger's aggregates over rows with known times: per-minute buckets by state, percentiles
// of the times to mined and final (percentile_cont), deliveries by result and status class, and
// only the last hour of each.
func TestLedgerAggregates(t *testing.T) {
	db, pool := ledger(t, "ops_aggregates")
	now := time.Date(2030, 5, 6, 7, 30, 20, 0, time.UTC)
	tenAgo, fiveAgo := now.Add(-10*time.Minute).Truncate(time.Minute).Add(7*time.Second), now.Add(-5*time.Minute).Truncate(time.Minute)
	row(t, pool, tenAgo, facilitator.StateFinal, 1*time.Second, 10*time.Second)
	row(t, pool, tenAgo.Add(20*time.Second), facilitator.StateFinal, 2*time.Second, 20*time.Second)
	row(t, pool, tenAgo.Add(40*time.Second), facilitator.StateMined, 3*time.Second, 0)
	row(t, pool, fiveAgo, facilitator.StateReverted, 0, 0)
	row(t, pool, now.Add(-time.Minute).Truncate(time.Minute).Add(30*time.Second), facilitator.StateMined, 0, 0) // the last whole minute
	row(t, pool, now.Add(-2*time.Hour), facilitator.StateFinal, time.Second, time.Minute)                       // outside the hour

	o := ops.New(ops.Config{Ledger: db, Now: func() time.Time { return now }, CacheFor: time.Nanosecond})
	s := o.Overview(t.Context())
	if !s.Settlements.Available || s.Settlements.Total != 5 {
		t.Fatalf("settlements %+v", s.Settlements)
	}
	at := func(m time.Time) int {
		for i, u := range s.Minutes {
			if u == m.Truncate(time.Minute).Unix() {
				return i
			}
		}
		t.Fatalf("minute %s not in the window", m)
		return -1
	}
	if got := s.Settlements.ByState["final"][at(tenAgo)]; got != 2 {
		t.Errorf("final at -10m: %d, want 2", got)
	}
	if got := s.Settlements.ByState["mined"][at(tenAgo)]; got != 1 {
		t.Errorf("mined at -10m: %d, want 1", got)
	}
	if got := s.Settlements.ByState["reverted"][at(fiveAgo)]; got != 1 {
		t.Errorf("reverted at -5m: %d, want 1", got)
	}
	// Per second: the busiest minute held 3, the last whole minute 1.
	if s.Settlements.PeakPerSecond != 3.0/60 || s.Settlements.LastMinutePerSecond != 1.0/60 {
		t.Errorf("per second: peak %v, last minute %v; want 0.05 and 0.0167", s.Settlements.PeakPerSecond, s.Settlements.LastMinutePerSecond)
	}
	// Mined after 1, 2 and 3 s: percentile_cont interpolates, p50 2 s, p90 2.8 s, p99 2.98 s.
	near := func(what string, got, want float64) {
		if math.Abs(got-want) > 0.5 {
			t.Errorf("%s = %v ms, want %v", what, got, want)
		}
	}
	tm := s.SettlementTimes
	if !tm.Available || tm.ToMined.Count != 3 || tm.ToFinal.Count != 2 {
		t.Fatalf("settlement times %+v", tm)
	}
	near("to mined p50", tm.ToMined.P50, 2000)
	near("to mined p90", tm.ToMined.P90, 2800)
	near("to mined p99", tm.ToMined.P99, 2980)
	near("to final p50", tm.ToFinal.P50, 15000)
	near("to final p99", tm.ToFinal.P99, 19900)

	// Deliveries: one delivered (200), one retrying after a 503, one given up with no answer, and
	// one of two hours ago.
	var ev int64
	if err := pool.QueryRow(t.Context(), `SELECT id FROM settlement_events LIMIT 1`).Scan(&ev); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `INSERT INTO webhooks (id, url, secret, cursor_xid) VALUES ('wh_`+strings.Repeat("ab", 16)+`', 'https://m.example/h', 's', pg_current_xact_id())`); err != nil {
		t.Fatal(err)
	}
	var evs []int64
	rows, err := pool.Query(t.Context(), `SELECT id FROM settlement_events ORDER BY id LIMIT 4`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		_ = rows.Scan(&id)
		evs = append(evs, id)
	}
	rows.Close()
	wh := "wh_" + strings.Repeat("ab", 16)
	for i, q := range []string{
		`INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, delivered_at, last_status, created_at) VALUES ($1, $2, 1, $3, 200, $3)`,
		`INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, next_attempt_at, last_status, created_at) VALUES ($1, $2, 2, $3, 503, $3)`,
		`INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, gave_up_at, created_at) VALUES ($1, $2, 9, $3, $3)`,
		`INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, delivered_at, last_status, created_at) VALUES ($1, $2, 1, $3::timestamptz - interval '2 hours', 200, $3::timestamptz - interval '2 hours')`,
	} {
		if _, err := pool.Exec(t.Context(), q, wh, evs[i], now.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// The clock stands still, so the first overview's reads are still fresh to it: a new one reads.
	o = ops.New(ops.Config{Ledger: db, Now: func() time.Time { return now }})
	s = o.Overview(t.Context())
	w := s.Webhooks
	if !w.Available || w.Delivered != 1 || w.Retrying != 1 || w.GaveUp != 1 || w.ByStatusClass["2xx"] != 1 || w.ByStatusClass["5xx"] != 1 || w.ByStatusClass["none"] != 1 {
		t.Fatalf("webhooks %+v", w)
	}

}

// Reconcile run rows: written, listed newest first, and bounded both by count and by age in the
// same statement.
func TestReconcileRunRetention(t *testing.T) {
	db, _ := ledger(t, "ops_runs")
	base := time.Now().UTC().Truncate(time.Second)
	for i := range 5 {
		r := facilitator.ReconcileRun{Job: "settlements", Started: base.Add(time.Duration(i) * time.Second), Examined: i,
			Changed: map[string]int{"final": i}, Error: "dial tcp: https://key@rpc.example/v2/SECRET failed"}
		r.Finished = r.Started.Add(time.Second)
		if err := db.RecordReconcileRun(t.Context(), r, 3, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := db.ReconcileRuns(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 || runs[0].Examined != 4 || runs[2].Examined != 2 || runs[0].Changed["final"] != 4 {
		t.Fatalf("runs %+v, want the newest 3", runs)
	}
	if strings.Contains(runs[0].Error, "SECRET") || strings.Contains(runs[0].Error, "rpc.example") {
		t.Fatalf("a run's error keeps the URL: %q", runs[0].Error)
	}
	// A run a day later: everything older than the hour kept goes with it.
	late := facilitator.ReconcileRun{Job: "index-health", Started: base.Add(24 * time.Hour), Finished: base.Add(24*time.Hour + time.Second)}
	if err := db.RecordReconcileRun(t.Context(), late, 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	if runs, err = db.ReconcileRuns(t.Context(), 10); err != nil || len(runs) != 1 || runs[0].Job != "index-health" {
		t.Fatalf("after a day: %+v (%v)", runs, err)
	}
	if err := db.RecordReconcileRun(t.Context(), facilitator.ReconcileRun{}, 3, time.Hour); err == nil {
		t.Fatal("a run without a job was recorded")
	}
}

// lagging is a node behind the chain: it forwards to anvil but says its head is block 1 and
// refuses reads pinned at blocks it claims not to have (what a lagging load-balanced backend
// does; anvil cannot be made to lag).
type lagging struct{ c *rpc.Client }

func (l lagging) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	if err := l.c.BatchCallContext(ctx, b); err != nil {
		return err
	}
	for i := range b {
		switch b[i].Method {
		case "eth_blockNumber":
			*(b[i].Result.(*hexutil.Uint64)) = 1
		case "eth_call":
			b[i].Error = errors.New("header not found")
		}
	}
	return nil
}

// The ledger against the chain, on anvil's real USDC: real settlements agree; a row whose
// transaction does not carry its authorization's log disagrees; a node that is down or behind
// makes every row unreadable, never "disagrees".
func TestLedgerCheck(t *testing.T) {
	db, pool := ledger(t, "ops_check")
	e := env.NewEngine(t, stacktest.EngineOptions{DB: db})
	var txs []string
	for range 3 {
		p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 1_000)
		txs = append(txs, e.MustSettle(t, p.Body(t)).Response.Transaction)
	}
	net := env.Network().ID
	o := ops.New(ops.Config{Ledger: db, Engine: e.Engine, Chains: map[string]ops.Chain{net: env.Chain.RPC}, CacheFor: time.Nanosecond})
	c := o.Overview(t.Context()).LedgerCheck
	if !c.Available || c.Agrees != 3 || c.Disagrees != 0 || c.Unreadable != 0 || len(c.Rows) != 3 {
		t.Fatalf("check of three real settlements: %+v", c)
	}
	for _, r := range c.Rows {
		if r.Verdict != ledgercheck.Agrees {
			t.Fatalf("row %+v", r)
		}
	}
	// The signer's next nonce is the one after its three settlements.
	sk := o.Overview(t.Context()).Signers
	if len(sk.Rows) != 1 || sk.Rows[0].NextNonce == nil || *sk.Rows[0].NextNonce != 3 {
		t.Fatalf("signers %+v", sk)
	}

	// Tamper: the first settlement's row names the second's transaction, which used another
	// authorization. Its receipt succeeded, but does not carry this authorization's log.
	tampered := common.HexToHash(txs[0])
	if _, err := pool.Exec(t.Context(), `UPDATE settlements SET tx_hash = $1 WHERE tx_hash = $2`,
		common.HexToHash(txs[1]).Bytes(), tampered.Bytes()); err != nil {
		t.Fatal(err)
	}
	c = o.Overview(t.Context()).LedgerCheck
	if c.Agrees != 2 || c.Disagrees != 1 {
		t.Fatalf("after tampering: %+v", c)
	}
	for _, r := range c.Rows {
		if r.Verdict == ledgercheck.Disagrees && !strings.Contains(strings.Join(r.Problems, " "), "AuthorizationUsed") {
			t.Fatalf("the disagreement does not say why: %+v", r)
		}
	}

	// A node that is behind the receipts: nothing is concluded, the tampered row included.
	behind := ops.New(ops.Config{Ledger: db, Chains: map[string]ops.Chain{net: lagging{env.Chain.RPC}}, CacheFor: time.Nanosecond})
	if c := behind.Overview(t.Context()).LedgerCheck; c.Unreadable != 3 || c.Agrees+c.Disagrees != 0 {
		t.Fatalf("a lagging node: %+v", c)
	}
	// A node that is down: the same, within the RPC bound.
	dead, err := rpc.DialContext(t.Context(), "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	down := ops.New(ops.Config{Ledger: db, Chains: map[string]ops.Chain{net: dead}, RPCTimeout: time.Second, CacheFor: time.Nanosecond})
	if c := down.Overview(t.Context()).LedgerCheck; c.Unreadable != 3 || c.Agrees+c.Disagrees != 0 {
		t.Fatalf("a node that is down: %+v", c)
	}
}

// A ledger that cannot be read makes its sections unavailable, in words that carry no URL, and
// the rest of the overview is still there.
func TestOverviewLedgerDown(t *testing.T) {
	db, _ := ledger(t, "ops_down")
	e := env.NewEngine(t, stacktest.EngineOptions{})
	db.Close()
	o := ops.New(ops.Config{Ledger: db, Engine: e.Engine, Chains: map[string]ops.Chain{env.Network().ID: env.Chain.RPC}})
	s := o.Overview(t.Context())
	for name, sec := range map[string]ops.Section{"settlements": s.Settlements.Section, "times": s.SettlementTimes.Section,
		"webhooks": s.Webhooks.Section, "reconcile": s.Reconcile.Section, "check": s.LedgerCheck.Section} {
		if sec.Available || sec.Error == "" {
			t.Errorf("%s with the ledger down: %+v", name, sec)
		}
	}
	if !s.Signers.Available || len(s.Signers.Rows) != 1 || !s.Answers.Available {
		t.Fatalf("the sections that need no ledger: %+v %+v", s.Signers, s.Answers)
	}
	b, _ := json.Marshal(s)
	if strings.Contains(string(b), "postgres://") || strings.Contains(string(b), "x402:x402") {
		t.Fatalf("the overview carries the database URL: %s", b)
	}
}
