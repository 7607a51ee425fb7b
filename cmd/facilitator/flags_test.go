package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestFlagBooleans: a boolean flag or environment variable takes strconv.ParseBool's spellings and
// refuses anything else under its own name (once, "no" read as true and "False" as true); a
// boolean flag given alone is true and leaves the next flag alone.
func TestFlagBooleans(t *testing.T) {
	type bools struct{ migrate, index, private bool }
	for _, c := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    bools
		wantErr string // a part of the error; "" for none
	}{
		{name: "defaults", want: bools{true, true, false}},
		{name: "flags false", args: []string{"--migrate=false", "--index=0", "--webhook-allow-private=F"}, want: bools{false, false, false}},
		{name: "flags true", args: []string{"--migrate=1", "--index=TRUE", "--webhook-allow-private=True"}, want: bools{true, true, true}},
		{name: "flag alone is true", args: []string{"--webhook-allow-private"}, want: bools{true, true, true}},
		{name: "flag alone leaves the next flag", args: []string{"--migrate", "--listen", "10.0.0.1:9"}, want: bools{true, true, false}},
		{name: "migrate=no", args: []string{"--migrate=no"}, wantErr: `invalid boolean value "no" for -migrate: "no" is not a boolean: want one of ` + boolSpellings},
		{name: "index=yes", args: []string{"--index=yes"}, wantErr: `for -index`},
		{name: "index false, spaced", args: []string{"--index", "false"}, wantErr: `serve: unexpected argument "false"`},
		{name: "env False", env: map[string]string{"FACILITATOR_INDEX": "False", "FACILITATOR_MIGRATE": "f", "FACILITATOR_WEBHOOK_ALLOW_PRIVATE": "T"}, want: bools{false, false, true}},
		{name: "env 0", env: map[string]string{"FACILITATOR_INDEX": "0", "FACILITATOR_MIGRATE": "0"}, want: bools{false, false, false}},
		{name: "env no", env: map[string]string{"FACILITATOR_MIGRATE": "no"}, wantErr: `FACILITATOR_MIGRATE: "no" is not a boolean`},
		{name: "env off", env: map[string]string{"FACILITATOR_INDEX": "off"}, wantErr: `FACILITATOR_INDEX: "off" is not a boolean`},
		{name: "env yes", env: map[string]string{"FACILITATOR_WEBHOOK_ALLOW_PRIVATE": "yes"}, wantErr: `FACILITATOR_WEBHOOK_ALLOW_PRIVATE: "yes" is not a boolean`},
		{name: "flag over env", args: []string{"--index=true"}, env: map[string]string{"FACILITATOR_INDEX": "false"}, want: bools{true, true, false}},
		{name: "a bad env is refused under a flag too", args: []string{"--index=true"}, env: map[string]string{"FACILITATOR_INDEX": "yes"}, wantErr: `FACILITATOR_INDEX: "yes" is not a boolean`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseCommandFlags("serve", c.args, func(k string) string { return c.env[k] }, &stderr)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %s", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := (bools{cfg.Migrate, cfg.Index, cfg.WebhookAllowPrivate}); got != c.want {
				t.Errorf("migrate, index, webhook-allow-private = %v, want %v", got, c.want)
			}
			if c.name == "flag alone leaves the next flag" && cfg.Listen != "10.0.0.1:9" {
				t.Errorf("listen %q: the flag after --migrate was eaten", cfg.Listen)
			}
		})
	}
}

// TestFlagEnvNumbers: a whole-number environment variable that is no number is refused under its
// own name (it used to become -1 and be refused as "max-in-flight must be positive").
func TestFlagEnvNumbers(t *testing.T) {
	for key, flagName := range map[string]string{"FACILITATOR_MAX_IN_FLIGHT": "max-in-flight", "FACILITATOR_BURST_PER_KEY": "burst-per-key",
		"FACILITATOR_BURST_PER_CLIENT": "burst-per-client", "FACILITATOR_WALLET_CAP_COUNT": "wallet-cap-count",
		"FACILITATOR_BURST_PUBLIC_PER_CLIENT": "burst-public-per-client"} {
		_, err := parseCommandFlags("serve", nil, func(k string) string { return map[string]string{key: "12x"}[k] }, io.Discard)
		if want := key + `="12x" is not a whole number`; err == nil || err.Error() != want {
			t.Errorf("%s=12x: error %v, want %q", key, err, want)
		}
		// The flag itself still wins over the variable.
		cfg, err := parseCommandFlags("serve", []string{"--" + flagName + "=7"}, func(k string) string { return map[string]string{key: "12"}[k] }, io.Discard)
		if err != nil || (cfg.MaxInFlight != 7 && cfg.KeyBurst != 7 && cfg.ClientBurst != 7 && cfg.WalletCapCount != 7 && cfg.PublicBurst != 7) {
			t.Errorf("--%s=7 over %s=12: %v", flagName, key, err)
		}
	}
}

// TestFlagStrayArgument: a word that is no flag is an error naming it, in every command that takes
// flags only (the flag package stops at it, and used to drop every flag after it unread).
func TestFlagStrayArgument(t *testing.T) {
	cfg, err := parseServeFlags([]string{"--listen", "10.0.0.1:9", "stray", "--migrate=false"}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), `unexpected argument "stray"`) {
		t.Fatalf("serve: config %+v, error %v; want the stray argument named", cfg, err)
	}
	for _, args := range [][]string{
		{"serve", "stray", "--migrate=false"},
		{"index", "stray"},
		{"migrate", "--database-url", "postgres://nowhere", "stray"},
		{"migrate", "status", "--database-url", "postgres://nowhere", "stray"},
		{"settlements", "stuck", "stray"},
		{"version", "stray"},
		{"healthcheck", "stray"},
		{"keys", "list", "stray"},
		{"signer", "stray"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
		if code == 0 || !strings.Contains(stderr.String(), `unexpected argument "stray"`) {
			t.Errorf("%v: exit %d, stderr %q; want an error naming the stray argument", args, code, stderr.String())
		}
	}
}

// TestFlagHelp: each command's -h is its own usage, and exits 0 (index shares serve's flags, and
// printed "Usage of serve").
func TestFlagHelp(t *testing.T) {
	for _, c := range []struct{ command, want string }{
		{"serve", "usage: facilitator serve [flags]"},
		{"index", "usage: facilitator index [flags]"},
		{"migrate", "usage: facilitator migrate"},
		{"settlements", "usage: facilitator settlements stuck"},
		{"webhooks", "usage: facilitator webhooks redeliver"},
		{"status", "usage: facilitator status"},
		{"healthcheck", "Usage of healthcheck"},
		{"version", "Usage of version"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{c.command, "-h"}, func(string) string { return "" }, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("%s -h: exit %d, output %q; want %q", c.command, code, out, c.want)
		}
		if c.command != "serve" && (strings.Contains(out, "Usage of serve") || strings.Contains(out, "facilitator serve")) {
			t.Errorf("%s -h printed serve's usage", c.command)
		}
	}
}

// TestFlagTrustedProxies: --trusted-proxies takes CIDRs and bare addresses, and refuses what is
// neither, or a CIDR with host bits (10.0.0.1/8 is most likely a typo for an address or a net).
func TestFlagTrustedProxies(t *testing.T) {
	for _, c := range []struct {
		in, want, wantErr string
	}{
		{in: "", want: "[]"},
		{in: "10.0.0.0/8, 192.0.2.7 ,fd00::/8", want: "[10.0.0.0/8 192.0.2.7/32 fd00::/8]"},
		{in: "2001:db8::1", want: "[2001:db8::1/128]"},
		{in: "::ffff:10.1.2.3", want: "[10.1.2.3/32]"},
		{in: "10.0.0.1/8", wantErr: `trusted-proxies: "10.0.0.1/8" has host bits set: did you mean 10.0.0.0/8?`},
		{in: "proxy.internal", wantErr: `trusted-proxies: "proxy.internal" is not a CIDR (10.0.0.0/8) or an address`},
	} {
		for _, src := range []string{"flag", "env"} {
			args, env := []string{"--trusted-proxies", c.in}, map[string]string{}
			if src == "env" {
				args, env = nil, map[string]string{"FACILITATOR_TRUSTED_PROXIES": c.in}
			}
			cfg, err := parseServeFlags(args, func(k string) string { return env[k] })
			switch {
			case c.wantErr != "":
				if err == nil || err.Error() != c.wantErr {
					t.Errorf("%s %q: error %v, want %s", src, c.in, err, c.wantErr)
				}
			case err != nil:
				t.Errorf("%s %q: %v", src, c.in, err)
			case fmt.Sprint(cfg.TrustedProxies) != c.want:
				t.Errorf("%s %q: %v, want %s", src, c.in, cfg.TrustedProxies, c.want)
			}
		}
	}
}
