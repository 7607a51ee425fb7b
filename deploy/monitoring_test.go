package deploy

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"

	"github.com/x402-facilitator/x402-facilitator/indexer"
	"github.com/x402-facilitator/x402-facilitator/metrics"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

const (
	alertsFile    = "prometheus/alerts.yml"
	alertsTest    = "prometheus/alerts_test.yml"
	dashboardFile = "grafana/facilitator.json"
)

// promtool finds Prometheus's promtool (Debian's prometheus package ships it). Under CI=true a
// missing promtool fails the test, so that the rules are never left untested there.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed (scripts/promtool.sh installs it); under CI=true the alerting rules must be tested")
		}
		t.Skip("promtool is not installed (scripts/promtool.sh installs it): alerting rules not checked")
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRulesPromtool: the rules parse, and every rule's unit tests (a case that fires and one
// that does not) pass.
func TestAlertRulesPromtool(t *testing.T) {
	runPromtool(t, ".", "check", "rules", alertsFile)
	runPromtool(t, "prometheus", "test", "rules", filepath.Base(alertsTest))
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertRules: every rule waits (for:), has a severity an on-call rota routes on, a summary and
// a runbook, names only metrics and loops the facilitator exports, and is tested both firing and
// not firing.
func TestAlertRules(t *testing.T) {
	var rules ruleFile
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/"+alertsFile)), &rules); err != nil {
		t.Fatal(err)
	}
	var tests ruleTests
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "deploy/"+alertsTest)), &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	exported, loops := exportedMetrics(t), beatingLoops(t)
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert (recording rules belong elsewhere)", g.Name)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("%s: for %q; every alert waits a while before it pages", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || !strings.Contains(r.Annotations["description"], "Runbook:") {
				t.Errorf("%s: needs a summary and a description with a Runbook", r.Alert)
			}
			checkExpr(t, "alert "+r.Alert, r.Expr, exported, loops)
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: %s has no case where it fires (%v) or none where it does not (%v)", r.Alert, alertsTest, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	// What the issue asks to be alerted on, by name, so that none is dropped unnoticed.
	for _, want := range []string{"FacilitatorSignerBalanceLow", "FacilitatorSignerBalanceDraining", "FacilitatorLoopStalled",
		"FacilitatorIndexerStalled", "FacilitatorRPCErrors", "FacilitatorRPCDisagreements",
		"FacilitatorSettlementPendingTooLong", "FacilitatorWebhookGaveUp",
		// The service gone, /settle answering 503 or failing, a remote signer that cannot sign,
		// and a max fee below what the chain needs: each makes every /settle fail, and pages.
		"FacilitatorDown", "FacilitatorAbsent", "FacilitatorSettleUnavailable", "FacilitatorSettleFailing",
		"FacilitatorRemoteSignerDown", "FacilitatorRemoteSignerRefusing", "FacilitatorNetworkFeesAboveMaxFee"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

type dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// grafanaVars are the dashboard's variables as Prometheus would see them once Grafana
// substituted them (for promtool, which does not know them).
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$network", ".*")

// TestDashboard: the dashboard is Grafana JSON whose every panel queries the dashboard's
// Prometheus data source, and whose every expression parses and names only metrics the
// facilitator exports; it shows what an operator watches.
func TestDashboard(t *testing.T) {
	var d dashboard
	if err := json.Unmarshal([]byte(readRepoFile(t, "deploy/"+dashboardFile)), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard title %q uid %q: both are needed to import it", d.Title, d.UID)
	}
	exported, loops := exportedMetrics(t), beatingLoops(t)
	var exprs []string
	used := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Title == "" || len(p.Targets) == 0 {
				t.Errorf("panel %q (%s) needs a title and a query", p.Title, p.Type)
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: its data source must be the dashboard's ${datasource} variable", p.Title)
			}
			for _, tg := range p.Targets {
				checkExpr(t, "panel "+p.Title, tg.Expr, exported, loops)
				for _, m := range metricNames(tg.Expr) {
					used[m] = true
				}
				exprs = append(exprs, grafanaVars.Replace(tg.Expr))
			}
		}
	}
	walk(d.Panels)
	for _, want := range []string{"facilitator_settle_requests_total", "facilitator_settle_duration_seconds_bucket",
		"facilitator_verify_requests_total", "facilitator_signer_balance_wei", "facilitator_signer_in_flight",
		"facilitator_indexer_lag_blocks", "facilitator_rpc_endpoint_up", "facilitator_rpc_disagreements_total",
		"facilitator_loop_last_run_timestamp_seconds", "facilitator_webhook_deliveries_total", "facilitator_settlements_open"} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
	// promtool parses PromQL the way Prometheus does: every expression as a recording rule.
	if _, err := exec.LookPath("promtool"); err != nil && os.Getenv("CI") != "true" {
		t.Log("promtool is not installed: the dashboard's expressions were not parsed")
		return
	}
	type record struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	type group struct {
		Name  string   `yaml:"name"`
		Rules []record `yaml:"rules"`
	}
	var g group
	g.Name = "dashboard"
	for i, e := range exprs {
		g.Rules = append(g.Rules, record{Record: "dashboard:expr" + string(rune('a'+i/26)) + string(rune('a'+i%26)), Expr: e})
	}
	out, err := yaml.Marshal(map[string][]group{"groups": {g}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yml"), out, 0o600); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "dashboard.yml")
}

// checkExpr fails when expr names a metric the facilitator does not export or a loop nothing
// beats (a typo, or a rename the rules did not follow, would leave an alert that never fires).
func checkExpr(t *testing.T, where, expr string, exported, loops map[string]bool) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: %q names no metric", where, expr)
	}
	for _, n := range names {
		if !exported[n] && !prometheusOwn[n] {
			t.Errorf("%s: %s is not a metric the facilitator exports (expr %q)", where, n, expr)
		}
	}
	for _, m := range regexp.MustCompile(`loop=~?"([^"]*)"`).FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], "|") {
			if !loops[l] {
				t.Errorf("%s: loop %q beats nowhere (expr %q)", where, l, expr)
			}
		}
	}
}

// prometheusOwn are the series Prometheus makes of every scrape itself, whatever it exports.
var prometheusOwn = map[string]bool{"up": true}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promBraces   = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promTokens   = regexp.MustCompile(`[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
)

// metricNames are the metric names a PromQL expression selects: its identifiers that are not a
// function call, a keyword, a label (in matchers or grouping) or a number.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promBraces.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, tok := range promTokens.FindAllString(e, -1) {
		if tok[0] >= '0' && tok[0] <= '9' || strings.HasSuffix(tok, "(") {
			continue
		}
		tok = strings.TrimSpace(tok)
		if !slices.Contains(promKeywords, tok) && !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (reason) (rate(facilitator_settle_requests_total{network=~"$network",reason!="ok"}[5m]))`: {"facilitator_settle_requests_total"},
		`predict_linear(a_wei[1h], 6 * 3600) < b_min and c_low == 0`:                                      {"a_wei", "b_min", "c_low"},
		`max without (endpoint) (h) - ignoring (endpoint) group_right h > 1e3`:                            {"h"},
		`time() - x{loop="a|b"} > 600 or (time() - y > 1.5)`:                                              {"x", "y"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// exportedMetrics are the names a Prometheus scrape of the facilitator holds: its registry, with
// every collector registered and every event recorded once (a vector shows no series before its
// first), histograms as their _bucket, _sum and _count series.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.WatchSigners(func() []metrics.Signer {
		return []metrics.Signer{{Network: "n", Address: "0x1", BalanceKnown: true, BalanceWei: 1, BalanceReadAt: time.Now()}}
	})
	m.WatchIndexers(func() []metrics.Indexer { return []metrics.Indexer{{Network: "n", Leader: true, Lag: 1}} })
	m.WatchEndpoints(func() []metrics.Endpoint { return []metrics.Endpoint{{Network: "n", Name: "rpc0", Up: true, Head: 1}} })
	m.WatchSettlements(func() []metrics.Open {
		return []metrics.Open{{Network: "n", State: "broadcast", Count: 1, Oldest: time.Second}}
	})
	m.WatchPaymentIDs(func() (int64, int64) { return 0, 0 })
	m.WatchRemoteSigners(func() []metrics.RemoteSigner {
		return []metrics.RemoteSigner{{Network: "n", Address: "0x1", Known: true, Up: true, LastSigned: time.Now(), Refusals: map[string]uint64{"refused": 1}}}
	})
	m.WatchNetworkFees(func() []metrics.NetworkFees {
		return []metrics.NetworkFees{{Network: "n", MaxFee: 1, HasMax: true, Needed: 1, ReadAt: time.Now()}}
	})
	m.Verified("n", "valid", time.Millisecond)
	m.Settled("n", "ok", time.Millisecond)
	m.FeeBumped("n")
	m.NonceGap("n", "0x1", settle.NonceResync)
	m.Disagreement("n")
	m.EndpointFailed("n", "rpc0")
	m.Reorg("n", 1)
	m.WebhookAttempt(notify.DeliveryDelivered)
	m.Beat(settle.LoopWatch, "n", time.Now())
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range families {
		out[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+s] = true
			}
		}
	}
	return out
}

// beatingLoops are the loop label values something beats: the services' loops, and the jobs
// cmd/facilitator schedules (named in its source, which a test cannot import).
func beatingLoops(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, l := range []string{settle.LoopWatch, settle.LoopBroadcast, settle.LoopBalance, indexer.LoopIndexer, notify.LoopWebhooks} {
		out[l] = true
	}
	src := readRepoFile(t, "cmd/facilitator/jobs.go")
	jobs := regexp.MustCompile(`(?m)^\s*job\w+\s*=\s*"([^"]+)"`).FindAllStringSubmatch(src, -1)
	if len(jobs) == 0 {
		t.Fatal("found no job names (jobX = \"...\") in cmd/facilitator/jobs.go")
	}
	for _, j := range jobs {
		out[j[1]] = true
	}
	return out
}
