package main

import (
	"math/big"
	"testing"
	"time"
)

// TestLimitFlags: the limit flags parse from flags and env, default to off (the signer minimum to
// 0.01 ether), and nonsense is refused.
func TestLimitFlags(t *testing.T) {
	none := func(string) string { return "" }
	cfg, err := parseServeFlags(nil, none)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WalletCapCount != 0 || cfg.WalletCapAmount != nil || cfg.KeyGasBudget != nil || cfg.WalletCapWindow != 24*time.Hour ||
		cfg.SignerMinBalance.Cmp(big.NewInt(1e16)) != 0 || cfg.BalanceInterval != 15*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
	env := map[string]string{"FACILITATOR_WALLET_CAP_AMOUNT": "5000000", "FACILITATOR_SIGNER_MIN_BALANCE_WEI": "0"}
	cfg, err = parseServeFlags([]string{"--wallet-cap-count", "3", "--wallet-cap-window", "1h", "--key-gas-budget-wei", "1000"},
		func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.WalletCapCount != 3 || cfg.WalletCapAmount.Int64() != 5_000_000 || cfg.WalletCapWindow != time.Hour ||
		cfg.KeyGasBudget.Int64() != 1000 || cfg.SignerMinBalance != nil {
		t.Fatalf("parsed: %+v", cfg)
	}
	for _, args := range [][]string{
		{"--wallet-cap-amount", "-1"},
		{"--key-gas-budget-wei", "1e18"},
		{"--signer-min-balance-wei", "lots"},
		{"--balance-interval", "soon"},
	} {
		if _, err := parseServeFlags(args, none); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	valid := map[string]string{"DATABASE_URL": "postgres://x",
		"FACILITATOR_NETWORKS": `[{"id":"eip155:1","rpc":"http://x","tokens":[{"address":"0x0000000000000000000000000000000000000001","name":"a","version":"1"}]}]`}
	for _, window := range []string{"1h", "0s"} {
		cfg, err = parseServeFlags([]string{"--wallet-cap-count", "2", "--wallet-cap-window", window}, func(k string) string { return valid[k] })
		if err != nil {
			t.Fatal(err)
		}
		cfg.IndexOnly = true // no signer keys needed for Check
		if err := cfg.Check(); (err == nil) != (window == "1h") {
			t.Errorf("window %s: Check says %v", window, err)
		}
	}
}
