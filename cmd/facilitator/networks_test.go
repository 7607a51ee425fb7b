package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestNetworksCommand: `facilitator networks` prints a header and one line per preset, each with
// its name, CAIP-2 id, chain id, v1 name, USDC address, EIP-712 name and version and finality rule.
func TestNetworksCommand(t *testing.T) {
	var out, errOut strings.Builder
	if code := run(context.Background(), []string{"networks"}, func(string) string { return "" }, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(out.String(), "\n")
	cols := regexp.MustCompile(`\s{2,}`)
	header := cols.Split(strings.TrimSpace(lines[0]), -1)
	want := []string{"PRESET", "CAIP-2", "CHAIN ID", "V1 NAME", "USDC", "EIP-712 NAME", "VERSION", "FINALITY", "CHAIN"}
	if strings.Join(header, "|") != strings.Join(want, "|") {
		t.Fatalf("header %q, want %q", header, want)
	}
	presets := chains.Presets()
	rows := map[string][]string{}
	for i, p := range presets {
		f := cols.Split(strings.TrimSpace(lines[1+i]), -1)
		if len(f) != len(want) {
			t.Fatalf("line %q: %d columns", lines[1+i], len(f))
		}
		got := []string{f[0], f[1], f[2], f[4], f[6], f[8]}
		exp := []string{p.Name, p.CAIP2(), strconv.FormatUint(p.ChainID, 10), p.USDC.Address.Hex(), strconv.Quote(p.USDC.Version), p.Title}
		if strings.Join(got, "|") != strings.Join(exp, "|") {
			t.Errorf("line %q\n got %q\nwant %q", lines[1+i], got, exp)
		}
		rows[p.Name] = f
	}
	// The v1 name, EIP-712 name and finality cells, as an operator reads them.
	for name, exp := range map[string][3]string{
		"base-sepolia":     {"base-sepolia", `"USDC"`, "finalized tag, else depth 600 blocks"},
		"ethereum":         {"ethereum", `"USD Coin"`, "finalized tag, else depth 64 blocks"},
		"arbitrum":         {"-", `"USD Coin"`, "finalized tag, else depth 4800 blocks"},
		"ethereum-sepolia": {"sepolia", `"USDC"*`, "finalized tag, else depth 64 blocks"}, // unconfirmed: marked
		"anvil":            {"-", `"USD Coin"`, "depth 1 block"},
	} {
		if f := rows[name]; len(f) == 0 || f[3] != exp[0] || f[5] != exp[1] || f[7] != exp[2] {
			t.Errorf("%s: v1 name, EIP-712 name and finality %q, want %q", name, f, exp)
		}
	}
	if !strings.Contains(out.String(), "\n* EIP-712 domain stated by none of the sources") {
		t.Error("no footnote for the marked domains")
	}
	if strings.TrimSpace(lines[1+len(presets)]) != "" || !strings.Contains(out.String(), `"preset"`) {
		t.Errorf("after the table, want a blank line and how to use a preset:\n%s", out.String())
	}
	if code := run(context.Background(), []string{"networks", "base"}, func(string) string { return "" }, io.Discard, io.Discard); code == 0 {
		t.Error("networks with an argument: exit 0")
	}
}

// TestConfigPresets: a network entry naming a preset gets the preset's id, v1 name, USDC and
// finality rule; whatever the entry gives itself wins; the explicit form is unchanged.
func TestConfigPresets(t *testing.T) {
	domain := func(t *testing.T, networks string) (facilitator.Network, NetworkConfig, error) {
		t.Helper()
		env := map[string]string{"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": networks}
		cfg, err := parseServeFlags(nil, func(k string) string { return env[k] })
		if err != nil {
			return facilitator.Network{}, NetworkConfig{}, err
		}
		ns, err := cfg.Domain()
		if err != nil {
			return facilitator.Network{}, NetworkConfig{}, err
		}
		return ns[0], cfg.Networks[0], nil
	}
	baseSepolia, _ := chains.Lookup("base-sepolia")
	usdc := baseSepolia.USDC

	n, nc, err := domain(t, `[{"preset":"base-sepolia","rpc":"http://x"}]`)
	if err != nil {
		t.Fatal(err)
	}
	want := facilitator.Network{ID: "eip155:84532", ChainID: 84532, V1Name: "base-sepolia", Tokens: []facilitator.Token{usdc},
		Finality: facilitator.Finality{Tag: "finalized", Depth: 600}, Explorer: "https://sepolia.basescan.org"}
	if !sameNetwork(n, want) || usdc.Name != "USDC" || usdc.Version != "2" {
		t.Fatalf("preset alone: %+v, want %+v", n, want)
	}
	// The services that still take a depth get the preset's fallback depth, not the generic 12.
	if nc.ID != "eip155:84532" || nc.finality(n.ChainID) != 600 {
		t.Fatalf("the resolved entry: id %q, finality depth %d", nc.ID, nc.finality(n.ChainID))
	}

	// Overrides: a depth replaces the rule; a token without an address is the preset's USDC with
	// the fields it gives; an explicit empty v1 name drops the v1 kind; the id may be repeated.
	n, _, err = domain(t, `[{"preset":"base-sepolia","id":"eip155:84532","rpc":"http://x","finality":5,"v1Name":"","tokens":[{"version":"3"}]}]`)
	if err != nil {
		t.Fatal(err)
	}
	want = facilitator.Network{ID: "eip155:84532", ChainID: 84532, V1Name: "",
		Tokens:   []facilitator.Token{{Address: usdc.Address, Name: "USDC", Version: "3", Decimals: 6}},
		Finality: facilitator.Finality{Depth: 5}, Explorer: "https://sepolia.basescan.org"}
	if !sameNetwork(n, want) {
		t.Fatalf("overridden: %+v, want %+v", n, want)
	}
	// A second token beside the preset's USDC: the USDC entry (by address, any case) is filled,
	// the other must say its own domain.
	other := "0x00000000000000000000000000000000000000aa"
	n, _, err = domain(t, `[{"preset":"base-sepolia","rpc":"http://x","tokens":[{"address":"`+strings.ToLower(usdc.Address.Hex())+`"},{"address":"`+other+`","name":"Other","version":"1","decimals":18}]}]`)
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Tokens) != 2 || n.Tokens[0] != usdc || n.Tokens[1] != (facilitator.Token{Address: common.HexToAddress(other), Name: "Other", Version: "1", Decimals: 18}) {
		t.Fatalf("two tokens: %+v", n.Tokens)
	}

	// The explicit form, no preset: today's defaults (depth only, 12 off dev chains).
	n, _, err = domain(t, `[{"id":"eip155:8453","rpc":"http://x","tokens":[{"address":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","name":"USD Coin","version":"2"}]}]`)
	if err != nil || n.V1Name != "base" || n.Finality != (facilitator.Finality{Depth: 12}) || len(n.Tokens) != 1 || n.Explorer != "" {
		t.Fatalf("explicit: %+v, %v", n, err)
	}

	for name, c := range map[string]struct{ networks, want string }{
		"unknown preset":        {`[{"preset":"base-mainnet","rpc":"http://x"}]`, `unknown preset "base-mainnet"`},
		"id of another":         {`[{"preset":"base-sepolia","id":"eip155:8453","rpc":"http://x"}]`, "id eip155:8453 is not preset base-sepolia's network (eip155:84532)"},
		"no rpc":                {`[{"preset":"base"}]`, "rpc is required"},
		"other token bare":      {`[{"preset":"base","rpc":"http://x","tokens":[{"address":"` + other + `"}]}]`, "name and version"},
		"neither id nor preset": {`[{"rpc":"http://x","tokens":[{"address":"` + other + `","name":"a","version":"1"}]}]`, "id (or preset) is required"},
		"twice":                 {`[{"preset":"base","rpc":"http://x"},{"id":"eip155:8453","rpc":"http://y","tokens":[{"address":"` + other + `","name":"a","version":"1"}]}]`, "configured twice"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := domain(t, c.networks)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error saying %q, got %v", c.want, err)
			}
		})
	}
}

func sameNetwork(a, b facilitator.Network) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestServeChecksTokenDomain runs the real start-up against Circle's USDC on anvil: the anvil
// preset with its RPC alone starts; the same preset with a wrong EIP-712 name refuses to start,
// saying which network, which token and what differs, before anything listens.
func TestServeChecksTokenDomain(t *testing.T) {
	dbURL, chain := requireStack(t)
	start := func(t *testing.T, network map[string]any) (*Main, error) {
		t.Helper()
		network["rpc"] = chain.RPCURL
		networks, _ := json.Marshal([]any{network})
		env := map[string]string{
			"DATABASE_URL":            dbURL,
			"FACILITATOR_NETWORKS":    string(networks),
			"FACILITATOR_SIGNER_KEYS": "0x" + hex.EncodeToString(crypto.FromECDSA(chain.Accounts[0].Key)),
			"FACILITATOR_LISTEN":      "127.0.0.1:0",
			"FACILITATOR_AUTH":        "open",
			"FACILITATOR_INDEX":       "false",
		}
		cfg := serveConfig(t, env)
		m := &Main{Config: cfg, Logger: newLogger(io.Discard, "error", "text")}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := m.Run(ctx)
		// Close once: a failed Run is closed as runUntilDone does, a started one when the test ends.
		if err != nil {
			m.Close()
		} else {
			t.Cleanup(func() { m.Close() })
		}
		return m, err
	}

	m, err := start(t, map[string]any{"preset": "anvil"})
	if err != nil {
		t.Fatalf("the anvil preset with its RPC: %v", err)
	}
	if m.Addr == "" {
		t.Fatal("started but not listening")
	}

	for name, c := range map[string]struct {
		token map[string]string
		want  string
	}{
		"name":    {map[string]string{"name": "USDC"}, `name "USDC" is configured, the contract's is "USD Coin"`},
		"version": {map[string]string{"version": "1"}, `version "1" is configured, the contract's is "2"`},
	} {
		t.Run("wrong "+name, func(t *testing.T) {
			m, err := start(t, map[string]any{"preset": "anvil", "tokens": []any{c.token}})
			if err == nil {
				t.Fatal("started with a token domain the contract does not have")
			}
			for _, w := range []string{"eip155:31337", chain.USDC.Address.Hex(), c.want} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
			if m.Addr != "" || m.server != nil {
				t.Error("refused to start, yet listening")
			}
			t.Log(err)
		})
	}
}
