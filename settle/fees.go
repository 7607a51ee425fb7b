package settle

import "math/big"

// Fees are an EIP-1559 transaction's tip and fee cap.
type Fees struct {
	TipCap *big.Int
	FeeCap *big.Int
}

// SuggestFees prices a new transaction: the node's tip, and a fee cap of twice the base fee plus
// the tip, which survives six full blocks of base-fee growth.
func SuggestFees(baseFee, tip, minTip *big.Int) Fees {
	if minTip != nil && tip.Cmp(minTip) < 0 {
		tip = minTip
	}
	feeCap := new(big.Int).Mul(baseFee, big.NewInt(2))
	feeCap.Add(feeCap, tip)
	return Fees{TipCap: new(big.Int).Set(tip), FeeCap: feeCap}
}

// BumpFees prices a replacement: each of tip and fee cap at least 10% above the old one (the
// mempool's replacement rule, rounded up) and at least the current suggestion.
func BumpFees(old, suggested Fees) Fees {
	tip := maxBig(plusTenPercent(old.TipCap), suggested.TipCap)
	feeCap := maxBig(plusTenPercent(old.FeeCap), suggested.FeeCap)
	if feeCap.Cmp(tip) < 0 {
		feeCap = new(big.Int).Set(tip)
	}
	return Fees{TipCap: tip, FeeCap: feeCap}
}

// WithinLimit reports whether f's fee cap is at most limit (nil: no limit).
func WithinLimit(f Fees, limit *big.Int) bool {
	return limit == nil || f.FeeCap.Cmp(limit) <= 0
}

func plusTenPercent(n *big.Int) *big.Int {
	// ceil(n * 11 / 10)
	out := new(big.Int).Mul(n, big.NewInt(11))
	out.Add(out, big.NewInt(9))
	return out.Div(out, big.NewInt(10))
}

func maxBig(a, b *big.Int) *big.Int {
	if a.Cmp(b) >= 0 {
		return new(big.Int).Set(a)
	}
	return new(big.Int).Set(b)
}
