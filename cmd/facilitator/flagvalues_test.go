package main

import (
	"testing"
	"time"
)

// TestFlagValues: the duration and number flags parse, and refuse what is not one (the positive
// durations also zero, the numbers also negatives), naming themselves in the error.
func TestFlagValues(t *testing.T) {
	none := func(string) string { return "" }
	cfg, err := parseServeFlags([]string{"--rpc-timeout", "3s", "--verify-timeout", "4s", "--claim-lease", "5s",
		"--status-timeout", "6s", "--webhook-delivery-retention", "7h", "--console-session-ttl", "8m",
		"--key-gas-budget-wei", "0", "--wallet-cap-amount", "12", "--rate-per-key", "2.5"}, none)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RPCTimeout != 3*time.Second || cfg.VerifyTimeout != 4*time.Second || cfg.ClaimLease != 5*time.Second ||
		cfg.StatusTimeout != 6*time.Second || cfg.WebhookDeliveryRetention != 7*time.Hour || cfg.ConsoleSessionTTL != 8*time.Minute ||
		cfg.KeyGasBudget != nil || cfg.WalletCapAmount.Int64() != 12 || cfg.KeyRate != 2.5 {
		t.Fatalf("parsed: %+v", cfg)
	}
	for _, c := range []struct{ flag, value, want string }{
		{"--rpc-timeout", "soon", `rpc-timeout: time: invalid duration "soon"`},
		{"--verify-timeout", "soon", `verify-timeout: time: invalid duration "soon"`},
		{"--settle-timeout", "soon", `settle-timeout: time: invalid duration "soon"`},
		{"--claim-lease", "soon", `claim-lease: time: invalid duration "soon"`},
		{"--status-timeout", "0s", `status-timeout: "0s" is not a positive duration`},
		{"--ready-timeout", "soon", `ready-timeout: "soon" is not a positive duration`},
		{"--webhook-poll-interval", "-1s", `webhook-poll-interval: "-1s" is not a positive duration`},
		{"--webhook-delivery-retention", "0", `webhook-delivery-retention: "0" is not a positive duration`},
		{"--console-session-ttl", "soon", `console-session-ttl: "soon" is not a positive duration`},
		{"--wallet-cap-amount", "-1", `wallet-cap-amount: "-1" is not a non-negative integer`},
		{"--signer-min-balance-wei", "lots", `signer-min-balance-wei: "lots" is not a non-negative integer`},
		{"--rate-per-key", "-2", `rate-per-key: "-2" is not a non-negative number`},
		{"--rate-per-client", "many", `rate-per-client: "many" is not a non-negative number`},
	} {
		_, err := parseServeFlags([]string{c.flag, c.value}, none)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s %s: error %v, want %s", c.flag, c.value, err, c.want)
		}
	}
}
