package main

import (
	"encoding/json"
	"fmt"
	"math/big"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// FeesConfig is a network's optional "fees" entry: how its transactions are priced. Every field
// is optional, and a field left out keeps the value beneath it (a network preset's policy, or the
// defaults in facilitator.FeePolicy). Amounts are gwei as JSON numbers, exact to the wei
// (0.000000001 is one wei).
type FeesConfig struct {
	// Legacy prices type-0 transactions at the node's eth_gasPrice.
	Legacy *bool `json:"legacy,omitempty"`
	// TipPercentile is the percentile of recent blocks' priority fees the tip follows (0-100].
	TipPercentile *float64 `json:"tipPercentile,omitempty"`
	// HistoryBlocks is how many recent blocks eth_feeHistory reads.
	HistoryBlocks *uint64 `json:"historyBlocks,omitempty"`
	// MinTipGwei and MaxTipGwei clamp the tip.
	MinTipGwei *json.Number `json:"minTipGwei,omitempty"`
	MaxTipGwei *json.Number `json:"maxTipGwei,omitempty"`
	// FeeCapMultiplier times the next base fee, plus the tip, is the fee cap (at least 1; two
	// decimals at most).
	FeeCapMultiplier *json.Number `json:"feeCapMultiplier,omitempty"`
	// MaxFeeGwei is the most a transaction of the network offers per gas (fee cap or gas price);
	// it overrides --max-fee-gwei for the network.
	MaxFeeGwei *json.Number `json:"maxFeeGwei,omitempty"`
	// BumpPercent is a replacement's raise over the fees it replaces (10 at least).
	BumpPercent *uint64 `json:"bumpPercent,omitempty"`
}

// Apply returns base with the configured fields set, or why a field is unusable. A nil config
// is base itself.
func (fc *FeesConfig) Apply(base facilitator.FeePolicy) (facilitator.FeePolicy, error) {
	p := base
	if fc == nil {
		return p, p.Check()
	}
	if fc.Legacy != nil {
		p.Legacy = *fc.Legacy
	}
	if fc.TipPercentile != nil {
		if *fc.TipPercentile <= 0 {
			return p, fmt.Errorf("tipPercentile %v is not in (0, 100]", *fc.TipPercentile)
		}
		p.TipPercentile = *fc.TipPercentile
	}
	if fc.HistoryBlocks != nil {
		if *fc.HistoryBlocks == 0 {
			return p, fmt.Errorf("historyBlocks must be at least 1")
		}
		p.HistoryBlocks = *fc.HistoryBlocks
	}
	if fc.BumpPercent != nil {
		if *fc.BumpPercent < facilitator.MinBumpPercent {
			return p, fmt.Errorf("bumpPercent %d is below %d, the least a node's pool takes as a replacement", *fc.BumpPercent, facilitator.MinBumpPercent)
		}
		p.BumpPercent = *fc.BumpPercent
	}
	for _, g := range []struct {
		name string
		in   *json.Number
		out  **big.Int
	}{{"minTipGwei", fc.MinTipGwei, &p.MinTip}, {"maxTipGwei", fc.MaxTipGwei, &p.MaxTip}, {"maxFeeGwei", fc.MaxFeeGwei, &p.MaxFee}} {
		if g.in == nil {
			continue
		}
		wei, err := scaled(*g.in, 1e9)
		if err != nil {
			return p, fmt.Errorf("%s: %w", g.name, err)
		}
		*g.out = wei
	}
	if fc.FeeCapMultiplier != nil {
		pct, err := scaled(*fc.FeeCapMultiplier, 100)
		if err != nil || !pct.IsUint64() || pct.Uint64() < 100 {
			return p, fmt.Errorf("feeCapMultiplier %q is not a number of at least 1 with at most two decimals", fc.FeeCapMultiplier.String())
		}
		p.FeeCapPercent = pct.Uint64()
	}
	return p, p.Check()
}

// scaled is n × unit as a non-negative integer, or an error when n is not a number, negative,
// or finer than 1/unit.
func scaled(n json.Number, unit int64) (*big.Int, error) {
	r, ok := new(big.Rat).SetString(n.String())
	if !ok || r.Sign() < 0 {
		return nil, fmt.Errorf("%q is not a non-negative number", n.String())
	}
	r.Mul(r, new(big.Rat).SetInt64(unit))
	if !r.IsInt() {
		return nil, fmt.Errorf("%q is finer than the unit allows (gwei: 9 decimals, one wei)", n.String())
	}
	return new(big.Int).Set(r.Num()), nil
}
