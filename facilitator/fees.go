package facilitator

import (
	"fmt"
	"math/big"
	"strings"
)

// FeePolicy is how a network's settlement transactions are priced. The zero value is the
// default policy (EIP-1559, the defaults below); a network preset carries one, and an operator's
// configuration overrides its fields. Amounts are wei.
type FeePolicy struct {
	// Legacy prices type-0 transactions at the node's eth_gasPrice, for a chain that has no
	// EIP-1559 (or whose nodes mishandle it). Tips, multiplier and fee history are then unused.
	Legacy bool
	// TipPercentile is the percentile of each block's priority fees (eth_feeHistory rewards)
	// that the tip follows, in (0, 100]; 0: DefaultTipPercentile.
	TipPercentile float64
	// HistoryBlocks is how many recent blocks the tip is taken over; 0: DefaultHistoryBlocks.
	HistoryBlocks uint64
	// MinTip and MaxTip clamp the tip; nil: the engine's minimum (1 wei), and no maximum.
	MinTip, MaxTip *big.Int
	// FeeCapPercent is the fee cap's share of the next block's base fee, in percent, before the
	// tip is added (200: twice the base fee, which survives six full blocks of base-fee growth);
	// 0: DefaultFeeCapPercent.
	FeeCapPercent uint64
	// MaxFee is the most a transaction may offer per gas (fee cap, or gas price when Legacy): a
	// fee cap is cut down to it, and a settlement the chain's next base fee and the tip do not
	// fit under is refused with ReasonFeesAboveCap, nothing signed; nil: the engine's limit.
	MaxFee *big.Int
	// BumpPercent is how much above the old fees a replacement offers, each of tip and fee cap
	// (or gas price), in percent; at least MinBumpPercent (geth's txpool.pricebump); 0: the
	// minimum.
	BumpPercent uint64
}

// The defaults of a FeePolicy's zero fields.
const (
	DefaultTipPercentile = 50
	DefaultHistoryBlocks = 10
	DefaultFeeCapPercent = 200
	// MinBumpPercent is geth's default replacement rule (txpool.PriceBump); erigon's and bor's
	// pools take the same default. A pool configured stricter needs a higher BumpPercent.
	MinBumpPercent = 10
)

// WithDefaults returns p with its zero fields at their defaults; minTip and maxFee are the
// engine-wide minimum tip and fee limit (nil: none).
func (p FeePolicy) WithDefaults(minTip, maxFee *big.Int) FeePolicy {
	if p.TipPercentile == 0 {
		p.TipPercentile = DefaultTipPercentile
	}
	if p.HistoryBlocks == 0 {
		p.HistoryBlocks = DefaultHistoryBlocks
	}
	if p.FeeCapPercent == 0 {
		p.FeeCapPercent = DefaultFeeCapPercent
	}
	if p.BumpPercent == 0 {
		p.BumpPercent = MinBumpPercent
	}
	if p.MinTip == nil {
		p.MinTip = minTip
	}
	if p.MaxFee == nil {
		p.MaxFee = maxFee
	}
	return p
}

// Check reports a policy that cannot price a transaction the node's pool would take.
func (p FeePolicy) Check() error {
	switch {
	case p.TipPercentile < 0 || p.TipPercentile > 100:
		return fmt.Errorf("tip percentile %v is not in (0, 100]", p.TipPercentile)
	case p.HistoryBlocks > 1024:
		return fmt.Errorf("history of %d blocks: nodes serve at most 1024", p.HistoryBlocks)
	case p.FeeCapPercent != 0 && p.FeeCapPercent < 100:
		return fmt.Errorf("a fee cap multiplier below 1 (%d%%) prices under the next base fee", p.FeeCapPercent)
	case p.BumpPercent != 0 && p.BumpPercent < MinBumpPercent:
		return fmt.Errorf("a bump of %d%% is below the %d%% nodes require of a replacement", p.BumpPercent, MinBumpPercent)
	case p.MinTip != nil && p.MinTip.Sign() < 0, p.MaxTip != nil && p.MaxTip.Sign() < 0, p.MaxFee != nil && p.MaxFee.Sign() <= 0:
		return fmt.Errorf("tips must not be negative and the max fee must be positive")
	case p.MinTip != nil && p.MaxTip != nil && p.MaxTip.Cmp(p.MinTip) < 0:
		return fmt.Errorf("max tip %s wei is below min tip %s wei", p.MaxTip, p.MinTip)
	case p.MaxTip != nil && p.MaxFee != nil && p.MaxFee.Cmp(p.MaxTip) < 0:
		return fmt.Errorf("max fee %s wei is below max tip %s wei", p.MaxFee, p.MaxTip)
	}
	return nil
}

// Gwei is wei in gwei, exact (to the ninth decimal, trailing zeros dropped): how fees are shown
// beside the settings that give them in gwei (--max-fee-gwei, fees.maxFeeGwei). nil is "none".
func Gwei(wei *big.Int) string {
	if wei == nil {
		return "none"
	}
	r := new(big.Rat).SetFrac(wei, big.NewInt(1e9))
	s := strings.TrimRight(strings.TrimRight(r.FloatString(9), "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}
