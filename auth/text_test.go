package auth_test

import (
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/auth"
)

func TestGasBudgetText(t *testing.T) {
	for in, want := range map[string]string{"default": "default", " default ": "default", "0": "unlimited", "123": "123"} {
		v, err := auth.ParseGasBudget(in)
		if err != nil {
			t.Fatalf("ParseGasBudget(%q): %v", in, err)
		}
		if got := auth.GasBudgetText(v); got != want {
			t.Errorf("GasBudgetText(ParseGasBudget(%q)) = %q, want %q", in, got, want)
		}
	}
	if v, _ := auth.ParseGasBudget("default"); v != nil {
		t.Errorf("default: want nil (the server's default), got %v", v)
	}
	for _, bad := range []string{"", "-1", "1e18", "unlimited", "0x10"} {
		if _, err := auth.ParseGasBudget(bad); err == nil {
			t.Errorf("ParseGasBudget(%q): want an error", bad)
		}
	}
	if got := auth.GasBudgetText(big.NewInt(0)); got != "unlimited" {
		t.Errorf("0: %q", got)
	}
}

func TestScopesAndPayToText(t *testing.T) {
	sc, err := auth.ParseScopes("settle, verify")
	if err != nil {
		t.Fatal(err)
	}
	if got := auth.ScopesText(sc); got != "settle,verify" {
		t.Errorf("ScopesText = %q", got)
	}
	a, b := common.HexToAddress("0x70997970C51812dc3A010C7d01b50e0d17dc79C8"), common.HexToAddress("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC")
	text := auth.PayToText([]common.Address{a, b})
	if text != a.Hex()+","+b.Hex() {
		t.Errorf("PayToText = %q", text)
	}
	back, err := auth.ParsePayTo(text)
	if err != nil || len(back) != 2 || back[0] != a || back[1] != b {
		t.Errorf("ParsePayTo(PayToText) = %v, %v", back, err)
	}
	if got := auth.PayToText(nil); got != "" {
		t.Errorf("no allow-list: %q", got)
	}
}
