package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestCheckConfig: serve --check-config reports each check against the real dependencies and
// exits non-zero on any problem, writing nothing: a good configuration passes; a second RPC
// endpoint on another chain, a token domain the contract does not have, and a signer key with no
// gas each fail by name.
func TestCheckConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, chain := requireStack(t)
	other := stacktest.NewChain(t, devchain.Options{ChainID: 4242})
	check := func(edit func(env map[string]string)) (string, int) {
		t.Helper()
		env := serveEnv(t, dbURL, chain, chain.RPCURL, chain.Accounts[0].Key)
		edit(env)
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"serve", "--check-config"}, func(k string) string { return env[k] }, &out, &errOut)
		return out.String() + errOut.String(), code
	}
	editNetwork := func(env map[string]string, f func(n map[string]any)) {
		var nets []map[string]any
		if err := json.Unmarshal([]byte(env["FACILITATOR_NETWORKS"]), &nets); err != nil {
			t.Fatal(err)
		}
		f(nets[0])
		b, _ := json.Marshal(nets)
		env["FACILITATOR_NETWORKS"] = string(b)
	}

	out, code := check(func(map[string]string) {})
	if code != 0 || !strings.Contains(out, "the configuration is ready to serve") || strings.Contains(out, "FAIL") {
		t.Fatalf("a good configuration: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		name, want string
		edit       func(env map[string]string)
	}{
		{"an endpoint on another chain", "RPC endpoint rpc1: eip155:31337: the RPC serves chain 4242", func(env map[string]string) {
			editNetwork(env, func(n map[string]any) { n["rpcs"] = []string{other.RPCURL} })
		}},
		{"a token domain the contract does not have", `name "USD Coin!" is configured`, func(env map[string]string) {
			editNetwork(env, func(n map[string]any) {
				n["tokens"] = []map[string]string{{"address": chain.USDC.Address.Hex(), "name": "USD Coin!", "version": chain.USDC.Version}}
			})
		}},
		{"a signer without gas", "holds no native token", func(env map[string]string) {
			env["FACILITATOR_SIGNER_KEYS"] = "0x" + strings.Repeat("42", 32)
			env["FACILITATOR_SIGNER_MIN_BALANCE_WEI"] = "0"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := check(c.edit)
			if code == 0 || !strings.Contains(out, "FAIL") || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want a failure naming %q:\n%s", code, c.want, out)
			}
			if strings.Contains(out, other.RPCURL) || strings.Contains(out, chain.RPCURL) {
				t.Fatalf("the report carries an RPC URL:\n%s", out)
			}
		})
	}
	// Nothing was written: the check binds no network and applies no migration.
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("the check left %d tables in a fresh database", tables)
	}
}
