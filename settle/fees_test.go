package settle

import (
	"errors"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/rpc"
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

func TestBumpFees(t *testing.T) {
	cases := []struct {
		name             string
		old, suggested   Fees
		wantTip, wantCap *big.Int
	}{
		{"ten percent, rounded up", Fees{big.NewInt(100), big.NewInt(1001)}, Fees{big.NewInt(1), big.NewInt(1)}, big.NewInt(110), big.NewInt(1102)},
		{"suggestion above ten percent wins", Fees{gwei(1), gwei(10)}, Fees{gwei(3), gwei(30)}, gwei(3), gwei(30)},
		{"one wei still moves", Fees{big.NewInt(1), big.NewInt(1)}, Fees{big.NewInt(0), big.NewInt(0)}, big.NewInt(2), big.NewInt(2)},
		{"cap never below tip", Fees{gwei(5), gwei(5)}, Fees{gwei(9), gwei(1)}, gwei(9), gwei(9)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := BumpFees(tc.old, tc.suggested)
			if got.TipCap.Cmp(tc.wantTip) != 0 || got.FeeCap.Cmp(tc.wantCap) != 0 {
				t.Fatalf("got tip %s cap %s, want %s %s", got.TipCap, got.FeeCap, tc.wantTip, tc.wantCap)
			}
			// The mempool's replacement rule: both at least 10% above the old.
			minTip := new(big.Int).Div(new(big.Int).Mul(tc.old.TipCap, big.NewInt(110)), big.NewInt(100))
			minCap := new(big.Int).Div(new(big.Int).Mul(tc.old.FeeCap, big.NewInt(110)), big.NewInt(100))
			if got.TipCap.Cmp(minTip) < 0 || got.FeeCap.Cmp(minCap) < 0 {
				t.Fatalf("bump %v breaks the 10%% rule over %v", got, tc.old)
			}
		})
	}
	if !WithinLimit(Fees{gwei(1), gwei(5)}, gwei(5)) || WithinLimit(Fees{gwei(1), gwei(6)}, gwei(5)) || !WithinLimit(Fees{gwei(1), gwei(6)}, nil) {
		t.Fatal("WithinLimit")
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
