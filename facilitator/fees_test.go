package facilitator

import (
	"math/big"
	"testing"
)

func TestGwei(t *testing.T) {
	for wei, want := range map[int64]string{0: "0", 1: "0.000000001", 100: "0.0000001", 1e9: "1", 15e8: "1.5", 100e9: "100", 123456789012: "123.456789012"} {
		if got := Gwei(big.NewInt(wei)); got != want {
			t.Errorf("Gwei(%d) = %q, want %q", wei, got, want)
		}
	}
	if got := Gwei(nil); got != "none" {
		t.Errorf("Gwei(nil) = %q", got)
	}
}
