package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestServeMetricsAndReadiness runs the real wiring, verifies and settles one payment on anvil
// with the real USDC, and reads /metrics and /readyz the way Prometheus and Kubernetes would.
func TestServeMetricsAndReadiness(t *testing.T) {
	dbURL, chain := requireStack(t)
	signer := chain.Accounts[0]
	cfg, err := configFor(t, dbURL, chain, signer.Key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m := startMain(ctx, t, cfg, newLogger(io.Discard, "error", "text"))
	defer m.Close()
	base := "http://" + m.Addr
	network := facilitator.CAIP2(chain.ChainID)

	// Ready once the indexer has had its first look at the chain: poll, bounded.
	var ready readyBody
	var status int
	for deadline := time.Now().Add(30 * time.Second); ; {
		status, ready = getReady(t, base)
		if status == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != http.StatusOK || ready.Status != "ready" {
		t.Fatalf("/readyz with everything up: %d %+v", status, ready)
	}
	for _, check := range []string{"postgres", "rpc:" + network, "indexer:" + network} {
		if ready.Checks[check] != "ok" {
			t.Errorf("/readyz check %s: %q, want ok (%+v)", check, ready.Checks[check], ready.Checks)
		}
	}

	body := paymentBody(t, chain, chain.Accounts[2].Address, [32]byte{0x4d, 0x45, 0x54})
	if res := post(t, base+"/verify", body); !strings.Contains(res, `"isValid":true`) {
		t.Fatalf("verify: %s", res)
	}
	if res := post(t, base+"/settle", body); !strings.Contains(res, `"success":true`) {
		t.Fatalf("settle: %s", res)
	}

	families := scrape(t, base)
	// The build is named (go test stamps no VCS revision: the test binary's labels).
	if info, ok := debug.ReadBuildInfo(); ok {
		v, r, g := buildLabels(info)
		if got := find(t, families, "facilitator_build_info", map[string]string{"version": v, "revision": r, "go_version": g}).GetGauge().GetValue(); got != 1 {
			t.Errorf("facilitator_build_info %v, want 1", got)
		}
	}
	if got := counter(t, families, "facilitator_settle_requests_total", map[string]string{"network": network, "reason": "ok"}); got != 1 {
		t.Errorf("settle ok count %v, want 1", got)
	}
	if got := counter(t, families, "facilitator_verify_requests_total", map[string]string{"network": network, "reason": "valid"}); got != 1 {
		t.Errorf("verify valid count %v, want 1", got)
	}
	for _, name := range []string{"facilitator_verify_duration_seconds", "facilitator_settle_duration_seconds"} {
		h := find(t, families, name, map[string]string{"network": network}).GetHistogram()
		if h.GetSampleCount() < 1 || h.GetSampleSum() <= 0 {
			t.Errorf("%s: count %d sum %v, want one observation", name, h.GetSampleCount(), h.GetSampleSum())
		}
	}
	// The settlement is resolved: the signer's gauge is there, and back at 0.
	if g := find(t, families, "facilitator_signer_in_flight", map[string]string{"network": network, "signer": signer.Address.Hex()}).GetGauge(); g.GetValue() != 0 {
		t.Errorf("in flight after the settlement resolved: %v", g.GetValue())
	}
	// The balance guard read the signer's balance at start: a funded key, not low.
	signerLabels := map[string]string{"network": network, "signer": signer.Address.Hex()}
	if g := find(t, families, "facilitator_signer_balance_wei", signerLabels).GetGauge(); g.GetValue() <= 0 {
		t.Errorf("signer balance %v, want the funded key's balance", g.GetValue())
	}
	if g := find(t, families, "facilitator_signer_balance_low", signerLabels).GetGauge(); g.GetValue() != 0 {
		t.Errorf("signer balance low = %v for a funded key", g.GetValue())
	}
	if g := find(t, families, "facilitator_signer_balance_read_timestamp_seconds", signerLabels).GetGauge(); time.Since(time.Unix(int64(g.GetValue()), 0)) > time.Minute {
		t.Errorf("signer balance read at %v, want within the last minute", g.GetValue())
	}
	find(t, families, "facilitator_signer_balance_min_wei", signerLabels)
	// The settlement's fee reading: the fee cap the chain needed, and when (no max fee: absent).
	if g := find(t, families, "facilitator_network_needed_fee_cap_wei", map[string]string{"network": network}).GetGauge(); g.GetValue() <= 0 {
		t.Errorf("needed fee cap %v, want the chain's", g.GetValue())
	}
	find(t, families, "facilitator_network_fee_read_timestamp_seconds", map[string]string{"network": network})
	if _, ok := families["facilitator_network_max_fee_wei"]; ok {
		t.Error("a max fee exported where none is configured")
	}
	// Every loop of the process has beaten, lately: the engine's, the leader's indexer, the
	// webhook dispatcher.
	for _, l := range []map[string]string{
		{"loop": "settle_watch", "network": network}, {"loop": "settle_broadcast", "network": network},
		{"loop": "settle_balance", "network": network}, {"loop": "indexer", "network": network},
		{"loop": "webhooks", "network": ""},
	} {
		// The balance loop beats every --balance-interval: wait for its first.
		var age time.Duration
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			const beat = "facilitator_loop_last_run_timestamp_seconds"
			if fs := scrape(t, base); fs[beat] != nil && hasSeries(fs[beat], l) {
				age = time.Since(time.Unix(0, int64(find(t, fs, beat, l).GetGauge().GetValue()*1e9)))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("loop %v never beat", l)
			}
		}
		if age > time.Minute || age < -time.Second {
			t.Errorf("loop %v last beat %v ago", l, age)
		}
	}
	// Once the settlement is final (depth 1, read twice) nothing is open, and no age is exported.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		fs := scrape(t, base)
		open := 0.0
		for _, st := range []string{"signed", "broadcast", "mined"} {
			open += find(t, fs, "facilitator_settlements_open", map[string]string{"network": network, "state": st}).GetGauge().GetValue()
		}
		_, aged := fs["facilitator_settlement_oldest_open_seconds"]
		if open == 0 && !aged {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the settlement is still open %v (an age exported: %v)", open, aged)
		}
	}
	find(t, families, "facilitator_indexer_leader", map[string]string{"network": network})
	find(t, families, "facilitator_indexer_stopped", map[string]string{"network": network})
	if got := counter(t, families, "facilitator_payment_id_conflicts_total", nil); got != 0 {
		t.Errorf("payment id conflicts %v", got)
	}
	if _, ok := families["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}

	// A second, identical /settle is answered from the ledger: its own reason, counted apart.
	if res := post(t, base+"/settle", body); !strings.Contains(res, facilitator.ReasonAlreadySettled) {
		t.Fatalf("second settle: %s", res)
	}
	families = scrape(t, base)
	if got := counter(t, families, "facilitator_settle_requests_total", map[string]string{"network": network, "reason": facilitator.ReasonAlreadySettled}); got != 1 {
		t.Errorf("settle %s count %v, want 1", facilitator.ReasonAlreadySettled, got)
	}
	if got := counter(t, families, "facilitator_settle_requests_total", map[string]string{"network": network, "reason": "ok"}); got != 1 {
		t.Errorf("settle ok count %v after a repeat, want still 1", got)
	}
}

type readyBody struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

func getReady(t *testing.T, base string) (int, readyBody) {
	t.Helper()
	res, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b readyBody
	if err := json.NewDecoder(res.Body).Decode(&b); err != nil {
		t.Fatalf("/readyz body: %v", err)
	}
	return res.StatusCode, b
}

// paymentBody is a v2 /verify and /settle body for 0.01 USDC from account 1 to payee.
func paymentBody(t *testing.T, chain *devchain.Chain, payee common.Address, nonce [32]byte) []byte {
	t.Helper()
	payer := chain.Accounts[1]
	a := devchain.TransferAuthorization{From: payer.Address, To: payee, Value: bigInt(10000),
		ValidAfter: bigInt(0), ValidBefore: bigInt(time.Now().Unix() + 300), Nonce: nonce}
	sig, err := chain.USDC.SignTransferAuthorization(payer.Key, a)
	if err != nil {
		t.Fatal(err)
	}
	reqs := map[string]any{"scheme": "exact", "network": facilitator.CAIP2(chain.ChainID), "amount": "10000", "asset": chain.USDC.Address.Hex(),
		"payTo": a.To.Hex(), "maxTimeoutSeconds": 60, "extra": map[string]any{"name": "USD Coin", "version": "2"}}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentRequirements": reqs, "paymentPayload": map[string]any{
		"x402Version": 2, "accepted": reqs, "resource": map[string]any{"url": "http://merchant.test/x"},
		"payload": map[string]any{"signature": "0x" + hex.EncodeToString(sig), "authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": "10000", "validAfter": "0",
			"validBefore": a.ValidBefore.String(), "nonce": "0x" + hex.EncodeToString(a.Nonce[:])}}}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func post(t *testing.T, url string, body []byte) string {
	t.Helper()
	res, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, res.StatusCode, b)
	}
	return string(b)
}

// scrape reads /metrics with Prometheus's own text parser.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", res.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("/metrics is not the Prometheus text format: %v", err)
	}
	return families
}

// find returns the series of name whose labels include labels, failing when there is none.
func find(t *testing.T, families map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	f, ok := families[name]
	if !ok {
		t.Fatalf("%s is not exported", name)
	}
	for _, m := range f.GetMetric() {
		if labelled(m, labels) {
			return m
		}
	}
	t.Fatalf("%s has no series with labels %v", name, labels)
	return nil
}

// hasSeries reports whether f has a series whose labels include labels.
func hasSeries(f *dto.MetricFamily, labels map[string]string) bool {
	return slices.ContainsFunc(f.GetMetric(), func(m *dto.Metric) bool { return labelled(m, labels) })
}

// labelled reports whether m's labels include labels (an absent label reads as "").
func labelled(m *dto.Metric, labels map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range labels {
		if have[k] != v {
			return false
		}
	}
	return true
}

func counter(t *testing.T, families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	return find(t, families, name, labels).GetCounter().GetValue()
}
