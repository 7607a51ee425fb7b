package main

import (
	"math/big"
	"strings"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// networksWithFees is a FACILITATOR_NETWORKS value of one network with the given "fees" entry.
func networksWithFees(fees string) map[string]string {
	n := `{"id":"eip155:8453","rpc":"http://127.0.0.1:1","tokens":[{"address":"0x0000000000000000000000000000000000000001","name":"USD Coin","version":"2"}]`
	if fees != "" {
		n += `,"fees":` + fees
	}
	return map[string]string{"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": "[" + n + "}]"}
}

// TestFeesConfig: a network's "fees" entry parses into its fee policy (gwei exact to the wei, the
// multiplier in hundredths), fields left out keep the defaults, and nonsense is refused with the
// network and the field named.
func TestFeesConfig(t *testing.T) {
	policy := func(t *testing.T, env map[string]string) facilitator.FeePolicy {
		t.Helper()
		cfg := serveConfig(t, env)
		if _, err := cfg.Domain(); err != nil {
			t.Fatal(err)
		}
		p, err := cfg.Networks[0].feePolicy()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := policy(t, networksWithFees("")); p.Legacy || p.TipPercentile != 0 || p.MinTip != nil || p.MaxFee != nil || p.BumpPercent != 0 || p.FeeCapPercent != 0 {
		t.Fatalf("no fees entry: %+v, want the zero policy (its defaults apply in the engine)", p)
	}
	p := policy(t, networksWithFees(`{"legacy":true,"tipPercentile":60,"historyBlocks":20,"minTipGwei":0.000000001,"maxTipGwei":2.5,"feeCapMultiplier":1.25,"maxFeeGwei":150,"bumpPercent":15}`))
	gwei := func(n int64) *big.Int { return new(big.Int).Mul(big.NewInt(n), big.NewInt(1e9)) }
	if !p.Legacy || p.TipPercentile != 60 || p.HistoryBlocks != 20 || p.MinTip.Int64() != 1 || p.MaxTip.Int64() != 2_500_000_000 ||
		p.FeeCapPercent != 125 || p.MaxFee.Cmp(gwei(150)) != 0 || p.BumpPercent != 15 {
		t.Fatalf("parsed %+v", p)
	}
	if p := policy(t, networksWithFees(`{"bumpPercent":30}`)); p.BumpPercent != 30 || p.TipPercentile != 0 || p.Legacy {
		t.Fatalf("one field: %+v", p)
	}

	for name, tc := range map[string]struct{ fees, says string }{
		"bump below 10":         {`{"bumpPercent":5}`, "bumpPercent"},
		"percentile above 100":  {`{"tipPercentile":101}`, "percentile"},
		"percentile zero":       {`{"tipPercentile":0}`, "tipPercentile"},
		"no history":            {`{"historyBlocks":0}`, "historyBlocks"},
		"finer than a wei":      {`{"minTipGwei":0.0000000001}`, "minTipGwei"},
		"negative tip":          {`{"maxTipGwei":-1}`, "maxTipGwei"},
		"multiplier below one":  {`{"feeCapMultiplier":0.5}`, "feeCapMultiplier"},
		"multiplier too fine":   {`{"feeCapMultiplier":1.255}`, "feeCapMultiplier"},
		"max tip under min tip": {`{"minTipGwei":2,"maxTipGwei":1}`, "max tip"},
		"zero max fee":          {`{"maxFeeGwei":0}`, "max fee"},
		"unknown field":         {`{"bumpPercentage":20}`, "unknown field"},
		"gwei as a word":        {`{"maxFeeGwei":"lots"}`, ""},
	} {
		t.Run(name, func(t *testing.T) {
			env := networksWithFees(tc.fees)
			cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
			if err == nil {
				_, err = cfg.Domain()
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not name %q", err, tc.says)
			}
			if err != nil && !strings.Contains(err.Error(), "networks") {
				t.Fatalf("error %q does not say where", err)
			}
		})
	}
}
