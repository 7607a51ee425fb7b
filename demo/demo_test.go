package demo

import (
	"math/big"
	"testing"
)

func TestUSDC(t *testing.T) {
	for in, want := range map[int64]string{
		0: "0.00 USDC", 10_000: "0.01 USDC", 1_500_000: "1.50 USDC", 123_456: "0.123456 USDC",
		1_000_000_000_000: "1,000,000.00 USDC", 999_999_990_000: "999,999.99 USDC", -10_000: "-0.01 USDC",
	} {
		if got := usdc(big.NewInt(in), false); got != want {
			t.Errorf("usdc(%d) = %q, want %q", in, got, want)
		}
	}
	if got := usdc(big.NewInt(10_000), true); got != "+0.01 USDC" {
		t.Errorf("signed: %q", got)
	}
}
