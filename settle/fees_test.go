package settle

import (
	"errors"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

func gwei(n int64) *big.Int { return new(big.Int).Mul(big.NewInt(n), big.NewInt(1e9)) }

func TestSuggestFees(t *testing.T) {
	f := SuggestFees(gwei(10), gwei(1), big.NewInt(1))
	if f.TipCap.Cmp(gwei(1)) != 0 || f.FeeCap.Cmp(gwei(21)) != 0 {
		t.Fatalf("got tip %s cap %s", f.TipCap, f.FeeCap)
	}
	f = SuggestFees(gwei(10), big.NewInt(0), gwei(2))
	if f.TipCap.Cmp(gwei(2)) != 0 {
		t.Fatalf("the minimum tip is not applied: %s", f.TipCap)
	}
}

// history builds an eth_feeHistory reading: per block its reward (-1: an empty block), and the
// next block's base fee.
func history(next *big.Int, rewards ...int64) *feeHistory {
	h := &feeHistory{}
	for _, r := range rewards {
		h.baseFees = append(h.baseFees, gwei(1))
		if r < 0 {
			h.gasUsedRatio, h.rewards = append(h.gasUsedRatio, 0), append(h.rewards, big.NewInt(0))
			continue
		}
		h.gasUsedRatio, h.rewards = append(h.gasUsedRatio, 0.5), append(h.rewards, big.NewInt(r))
	}
	h.baseFees = append(h.baseFees, next)
	return h
}

func TestPriceFees(t *testing.T) {
	def := facilitator.FeePolicy{}.WithDefaults(big.NewInt(1), nil)
	with := func(edit func(*facilitator.FeePolicy)) facilitator.FeePolicy {
		p := def
		edit(&p)
		return p
	}
	cases := []struct {
		name             string
		policy           facilitator.FeePolicy
		reading          feeReading
		wantTip, wantCap *big.Int
		wantAboveCap     bool
	}{
		{"median of the blocks' percentile tips; twice the next base fee plus the tip",
			def, feeReading{history: history(gwei(10), 5, 1, 3), nodeTip: gwei(99), latestBaseFee: gwei(99)},
			big.NewInt(3), new(big.Int).Add(gwei(20), big.NewInt(3)), false},
		{"an even count takes the lower middle",
			def, feeReading{history: history(gwei(10), 4, 1, 3, 2)}, big.NewInt(2), new(big.Int).Add(gwei(20), big.NewInt(2)), false},
		{"empty blocks say nothing",
			def, feeReading{history: history(gwei(10), -1, 7, -1, -1)}, big.NewInt(7), new(big.Int).Add(gwei(20), big.NewInt(7)), false},
		{"all blocks empty: the node's tip",
			def, feeReading{history: history(gwei(10), -1, -1), nodeTip: gwei(2)}, gwei(2), gwei(22), false},
		{"no fee history: the latest base fee and the node's tip",
			def, feeReading{latestBaseFee: gwei(8), nodeTip: gwei(1)}, gwei(1), gwei(17), false},
		{"no tip anywhere: the minimum tip",
			with(func(p *facilitator.FeePolicy) { p.MinTip = gwei(1) }), feeReading{latestBaseFee: gwei(8)}, gwei(1), gwei(17), false},
		{"tip below the minimum is raised",
			with(func(p *facilitator.FeePolicy) { p.MinTip = gwei(2) }), feeReading{history: history(gwei(10), 1, 1, 1)}, gwei(2), gwei(22), false},
		{"tip above the maximum is cut",
			with(func(p *facilitator.FeePolicy) { p.MaxTip = gwei(3) }), feeReading{history: history(gwei(10), 9e9, 8e9, 7e9)}, gwei(3), gwei(23), false},
		{"multiplier 1.5, rounded up",
			with(func(p *facilitator.FeePolicy) { p.FeeCapPercent = 150 }), feeReading{history: history(big.NewInt(7), 1)}, big.NewInt(1), big.NewInt(11 + 1), false},
		{"fee cap cut to the max fee when the next block still fits",
			with(func(p *facilitator.FeePolicy) { p.MaxFee = gwei(15) }), feeReading{history: history(gwei(10), 1e9)}, gwei(1), gwei(15), false},
		{"next base fee plus tip above the max fee: refused, at the limit",
			with(func(p *facilitator.FeePolicy) { p.MaxFee = gwei(10) }), feeReading{history: history(gwei(10), 1e9)}, gwei(1), gwei(10), true},
		{"exactly at the max fee fits",
			with(func(p *facilitator.FeePolicy) { p.MaxFee = gwei(11) }), feeReading{history: history(gwei(10), 1e9)}, gwei(1), gwei(11), false},
		{"legacy: the node's gas price, tip and cap alike",
			with(func(p *facilitator.FeePolicy) { p.Legacy = true }), feeReading{gasPrice: gwei(30), history: history(gwei(1), 1)}, gwei(30), gwei(30), false},
		{"legacy: at least the minimum",
			with(func(p *facilitator.FeePolicy) { p.Legacy, p.MinTip = true, gwei(40) }), feeReading{gasPrice: gwei(30)}, gwei(40), gwei(40), false},
		{"legacy over the max fee: refused",
			with(func(p *facilitator.FeePolicy) { p.Legacy, p.MaxFee = true, gwei(20) }), feeReading{gasPrice: gwei(30)}, gwei(20), gwei(20), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := priceFees(tc.policy, tc.reading)
			if tc.wantAboveCap != errors.Is(err, errFeesAboveCap) || (!tc.wantAboveCap && err != nil) {
				t.Fatalf("err %v, want above cap %v", err, tc.wantAboveCap)
			}
			if got.TipCap.Cmp(tc.wantTip) != 0 || got.FeeCap.Cmp(tc.wantCap) != 0 {
				t.Fatalf("got tip %s cap %s, want %s %s", got.TipCap, got.FeeCap, tc.wantTip, tc.wantCap)
			}
		})
	}
	if _, err := priceFees(def, feeReading{nodeTip: gwei(1)}); !errors.Is(err, errNoFeeReading) {
		t.Fatalf("no base fee: %v", err)
	}
	if _, err := priceFees(with(func(p *facilitator.FeePolicy) { p.Legacy = true }), feeReading{latestBaseFee: gwei(1)}); !errors.Is(err, errNoFeeReading) {
		t.Fatalf("legacy without a gas price: %v", err)
	}
}

func TestBumpFees(t *testing.T) {
	cases := []struct {
		name             string
		old, suggested   Fees
		percent          uint64
		limit            *big.Int
		wantTip, wantCap *big.Int
		wantOK           bool
	}{
		{"ten percent, rounded up", Fees{big.NewInt(100), big.NewInt(1001)}, Fees{big.NewInt(1), big.NewInt(1)}, 10, nil, big.NewInt(110), big.NewInt(1102), true},
		{"suggestion above ten percent wins", Fees{gwei(1), gwei(10)}, Fees{gwei(3), gwei(30)}, 10, nil, gwei(3), gwei(30), true},
		{"one wei still moves", Fees{big.NewInt(1), big.NewInt(1)}, Fees{big.NewInt(0), big.NewInt(0)}, 10, nil, big.NewInt(2), big.NewInt(2), true},
		{"cap never below tip", Fees{gwei(5), gwei(5)}, Fees{gwei(9), gwei(1)}, 10, nil, gwei(9), gwei(9), true},
		{"a stricter pool's 25 percent", Fees{big.NewInt(1000), big.NewInt(2001)}, Fees{big.NewInt(1), big.NewInt(1)}, 25, nil, big.NewInt(1250), big.NewInt(2502), true},
		{"legacy: one gas price in both", Fees{gwei(30), gwei(30)}, Fees{gwei(31), gwei(31)}, 10, nil, gwei(33), gwei(33), true},
		{"the limit cuts a suggestion above the bump", Fees{gwei(1), gwei(10)}, Fees{gwei(2), gwei(30)}, 10, gwei(12), gwei(2), gwei(12), true},
		{"the limit cuts the tip with the cap", Fees{gwei(10), gwei(10)}, Fees{gwei(20), gwei(20)}, 10, gwei(11), gwei(11), gwei(11), true},
		{"no replacement fits under the limit", Fees{gwei(1), gwei(10)}, Fees{gwei(1), gwei(10)}, 10, gwei(10), nil, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := BumpFees(tc.old, tc.suggested, tc.percent, tc.limit)
			if ok != tc.wantOK {
				t.Fatalf("ok %v, want %v (%v)", ok, tc.wantOK, got)
			}
			if !ok {
				return
			}
			if got.TipCap.Cmp(tc.wantTip) != 0 || got.FeeCap.Cmp(tc.wantCap) != 0 {
				t.Fatalf("got tip %s cap %s, want %s %s", got.TipCap, got.FeeCap, tc.wantTip, tc.wantCap)
			}
			// geth's replacement rule (txpool/legacypool list.go): both at least
			// old*(100+PriceBump)/100, in integers.
			bump := new(big.Int).SetUint64(100 + tc.percent)
			minTip := new(big.Int).Div(new(big.Int).Mul(tc.old.TipCap, bump), big.NewInt(100))
			minCap := new(big.Int).Div(new(big.Int).Mul(tc.old.FeeCap, bump), big.NewInt(100))
			if got.TipCap.Cmp(minTip) < 0 || got.FeeCap.Cmp(minCap) < 0 || got.FeeCap.Cmp(got.TipCap) < 0 {
				t.Fatalf("bump %v breaks the %d%% rule over %v", got, tc.percent, tc.old)
			}
			if tc.limit != nil && got.FeeCap.Cmp(tc.limit) > 0 {
				t.Fatalf("bump %v is above the limit %s", got, tc.limit)
			}
		})
	}
}

func TestFeePolicyCheck(t *testing.T) {
	bad := map[string]facilitator.FeePolicy{
		"percentile above 100":  {TipPercentile: 101},
		"negative percentile":   {TipPercentile: -1},
		"bump under 10%":        {BumpPercent: 5},
		"multiplier under 1":    {FeeCapPercent: 90},
		"max tip under min tip": {MinTip: gwei(2), MaxTip: gwei(1)},
		"max fee under max tip": {MaxTip: gwei(2), MaxFee: gwei(1)},
		"zero max fee":          {MaxFee: new(big.Int)},
		"history over 1024":     {HistoryBlocks: 2000},
		"negative minimum tip":  {MinTip: big.NewInt(-1)},
	}
	for name, p := range bad {
		if p.Check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	good := facilitator.FeePolicy{TipPercentile: 60, BumpPercent: 12, FeeCapPercent: 100, MinTip: gwei(1), MaxTip: gwei(1), MaxFee: gwei(1)}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	d := facilitator.FeePolicy{}.WithDefaults(big.NewInt(7), gwei(100))
	if d.TipPercentile != 50 || d.HistoryBlocks != 10 || d.FeeCapPercent != 200 || d.BumpPercent != 10 || d.MinTip.Int64() != 7 || d.MaxFee.Cmp(gwei(100)) != 0 || d.Legacy {
		t.Fatalf("defaults %+v", d)
	}
}

type jsonErr struct {
	code int
	msg  string
}

func (e jsonErr) Error() string  { return e.msg }
func (e jsonErr) ErrorCode() int { return e.code }

var _ rpc.Error = jsonErr{}

func TestClassifySend(t *testing.T) {
	cases := []struct {
		err  error
		want sendResult
	}{
		{nil, sentOK},
		{jsonErr{-32000, "already known"}, sentOK},
		{jsonErr{-32003, "transaction already imported"}, sentOK},
		{jsonErr{-32000, "nonce too low: next nonce 5, tx nonce 3"}, sendNonceUsed},
		{jsonErr{-32000, "replacement transaction underpriced"}, sendUnderpriced},
		{jsonErr{-32000, "transaction underpriced"}, sendUnderpriced},
		{jsonErr{-32000, "max fee per gas less than block base fee"}, sendUnderpriced},
		{jsonErr{-32003, "insufficient funds for gas * price + value"}, sendNoFunds},
		{jsonErr{-32000, "intrinsic gas too low"}, sendRetry},
		{errors.New("dial tcp 127.0.0.1:8545: connection refused"), sendRetry},
	}
	for _, tc := range cases {
		if got := classifySend(tc.err); got != tc.want {
			t.Errorf("%v: got %d, want %d", tc.err, got, tc.want)
		}
	}
}
