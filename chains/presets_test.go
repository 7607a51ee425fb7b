package chains

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/params"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestPresetsWellFormed: every preset's fields are well formed, and the table holds the chains the
// issue asks for.
func TestPresetsWellFormed(t *testing.T) {
	names, titles, chainIDs, v1Names := map[string]bool{}, map[string]bool{}, map[uint64]bool{}, map[string]bool{}
	kebab := regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	for _, e := range table() {
		t.Run(e.name, func(t *testing.T) {
			if !kebab.MatchString(e.name) || names[e.name] {
				t.Errorf("name %q is not lower-case-dashed or not unique", e.name)
			}
			names[e.name] = true
			if e.title == "" || titles[e.title] {
				t.Errorf("title %q is empty or not unique", e.title)
			}
			titles[e.title] = true
			if e.chainID == 0 || chainIDs[e.chainID] {
				t.Errorf("chain id %d is zero or not unique", e.chainID)
			}
			chainIDs[e.chainID] = true
			// The address as written must carry its EIP-55 checksum: a mistyped character fails it.
			if !common.IsHexAddress(e.usdc) || common.HexToAddress(e.usdc).Hex() != e.usdc || common.HexToAddress(e.usdc) == (common.Address{}) {
				t.Errorf("USDC address %q is not a checksummed non-zero address (want %s)", e.usdc, common.HexToAddress(e.usdc).Hex())
			}
			if e.usdcName == "" || e.usdcVersion == "" {
				t.Errorf("EIP-712 domain (%q, %q) has an empty field", e.usdcName, e.usdcVersion)
			}
			// The v1 name is the official table's for this chain id, both ways, and unique.
			if official, _ := facilitator.V1NetworkName(e.chainID); e.v1Name != official {
				t.Errorf("v1 name %q; the official table says %q", e.v1Name, official)
			}
			if e.v1Name != "" {
				if id, ok := facilitator.V1ChainID(e.v1Name); !ok || id != e.chainID || v1Names[e.v1Name] {
					t.Errorf("v1 name %q: chain %d in the official table (want %d), or not unique", e.v1Name, id, e.chainID)
				}
				v1Names[e.v1Name] = true
			}
			if e.finality.Depth == 0 || (e.finality.Tag != "" && e.finality.Tag != "finalized" && e.finality.Tag != "safe") {
				t.Errorf("finality %+v: want a depth of at least 1 and a tag of \"\", finalized or safe", e.finality)
			}
		})
	}
	for _, p := range Presets() {
		if id, err := facilitator.ParseCAIP2(p.CAIP2()); err != nil || id != p.ChainID || p.CAIP2() != "eip155:"+strconv.FormatUint(p.ChainID, 10) {
			t.Errorf("%s: CAIP-2 %q does not name chain %d (%v)", p.Name, p.CAIP2(), p.ChainID, err)
		}
		if got, err := Lookup(p.Name); err != nil || got != p {
			t.Errorf("Lookup(%q) = %+v, %v", p.Name, got, err)
		}
	}
	for _, want := range []string{"base", "base-sepolia", "ethereum", "ethereum-sepolia", "arbitrum", "arbitrum-sepolia",
		"optimism", "optimism-sepolia", "polygon", "polygon-amoy", "avalanche", "avalanche-fuji", "anvil"} {
		if !names[want] {
			t.Errorf("no preset %q", want)
		}
	}
	// go-ethereum's own chain configs agree on Ethereum's chain ids.
	for name, id := range map[string]uint64{"ethereum": params.MainnetChainConfig.ChainID.Uint64(), "ethereum-sepolia": params.SepoliaChainConfig.ChainID.Uint64()} {
		if p, _ := Lookup(name); p.ChainID != id {
			t.Errorf("%s: chain %d, go-ethereum's params say %d", name, p.ChainID, id)
		}
	}
	// The two domains the issue names.
	if p, _ := Lookup("base"); p.USDC.Name != "USD Coin" || p.USDC.Version != "2" {
		t.Errorf("base: USDC domain (%q, %q)", p.USDC.Name, p.USDC.Version)
	}
	if p, _ := Lookup("base-sepolia"); p.USDC.Name != "USDC" || p.USDC.Version != "2" {
		t.Errorf("base-sepolia: USDC domain (%q, %q)", p.USDC.Name, p.USDC.Version)
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := Lookup("base-mainnet")
	if err == nil || !strings.Contains(err.Error(), `"base-mainnet"`) || !strings.Contains(err.Error(), "base-sepolia") {
		t.Fatalf("want an error naming the preset and the known ones, got %v", err)
	}
}

// TestPresetsMatchSources holds the table to the sources it cites, as the pinned npm packages
// ship them: every address is viem's USDC address for the chain; where @x402/evm 2.27's default
// assets (or else x402 1.2's config) list the chain, address and EIP-712 domain are theirs and the
// domain is marked confirmed; where neither does, it is marked unconfirmed.
func TestPresetsMatchSources(t *testing.T) {
	nm := nodeModules(t)
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(nm, rel))
		if err != nil {
			t.Fatalf("a cited source is missing: %v", err)
		}
		return string(b)
	}
	type asset struct{ address, name, version string }
	v2 := map[uint64]asset{} // the first (default) asset per chain
	for _, m := range regexp.MustCompile(`"eip155:(\d+)": \[\s*\{\s*asset: "(0x[0-9a-fA-F]{40})",\s*name: "([^"]*)",\s*version: "([^"]*)"`).
		FindAllStringSubmatch(read("@x402/evm/dist/cjs/index.js"), -1) {
		id, _ := strconv.ParseUint(m[1], 10, 64)
		v2[id] = asset{m[2], m[3], m[4]}
	}
	v1 := map[uint64]asset{}
	for _, m := range regexp.MustCompile(`"(\d+)": \{\s*usdcAddress: "(0x[0-9a-fA-F]{40})",\s*usdcName: "([^"]*)"`).
		FindAllStringSubmatch(read("x402/dist/cjs/types/index.js"), -1) {
		id, _ := strconv.ParseUint(m[1], 10, 64)
		v1[id] = asset{m[2], m[3], "2"} // getDefaultAsset signs every chain's USDC with version "2"
	}
	if !strings.Contains(read("x402/dist/cjs/shared/index.js"), "name: usdc.usdcName,\n      version: \"2\"") {
		t.Error("x402 1.2's getDefaultAsset no longer says version \"2\"")
	}
	viem := map[uint64]string{}
	for _, m := range regexp.MustCompile(`(\d+): '(0x[0-9a-fA-F]{40})'`).FindAllStringSubmatch(read("viem/tokens/definitions/usdc.ts"), -1) {
		id, _ := strconv.ParseUint(m[1], 10, 64)
		viem[id] = m[2]
	}
	if len(v2) < 10 || len(v1) < 10 || len(viem) < 20 {
		t.Fatalf("the sources did not parse: %d, %d, %d entries", len(v2), len(v1), len(viem))
	}
	for _, p := range Presets() {
		if p.Name == "anvil" {
			continue // the local stack's; TestAnvilPresetDomain deploys it
		}
		if a, ok := viem[p.ChainID]; !ok || !strings.EqualFold(a, p.USDC.Address.Hex()) {
			t.Errorf("%s: USDC %s, viem's is %q", p.Name, p.USDC.Address.Hex(), a)
		}
		src, ok := v2[p.ChainID]
		if !ok {
			src, ok = v1[p.ChainID]
		}
		switch {
		case ok && (!strings.EqualFold(src.address, p.USDC.Address.Hex()) || src.name != p.USDC.Name || src.version != p.USDC.Version):
			t.Errorf("%s: USDC (%s, %q, %q), the x402 packages say (%s, %q, %q)", p.Name, p.USDC.Address.Hex(), p.USDC.Name, p.USDC.Version, src.address, src.name, src.version)
		case ok != p.DomainConfirmed:
			t.Errorf("%s: domain confirmed %v, but the x402 packages list it: %v", p.Name, p.DomainConfirmed, ok)
		}
	}
}

// nodeModules is the module root's node_modules (skips without it, fails under CI).
func nodeModules(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		nm := filepath.Join(dir, "node_modules")
		if _, err := os.Stat(filepath.Join(nm, "@x402", "evm", "package.json")); err == nil {
			return nm
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			if os.Getenv("CI") == "true" {
				t.Fatal("no node_modules with @x402/evm under CI (run npm ci)")
			}
			t.Skip("no node_modules with @x402/evm (run npm ci in the module root)")
		}
		dir = parent
	}
}

// TestPresetExplorers: Base's and Base Sepolia's receipts link to Basescan; the local devchain has
// no explorer; every explorer is an https origin with no trailing slash (a path is appended).
func TestPresetExplorers(t *testing.T) {
	for name, want := range map[string]string{"base": "https://basescan.org", "base-sepolia": "https://sepolia.basescan.org", "anvil": ""} {
		p, err := Lookup(name)
		if err != nil || p.Explorer != want {
			t.Errorf("%s: explorer %q (%v), want %q", name, p.Explorer, err, want)
		}
	}
	for _, p := range Presets() {
		if p.Explorer == "" {
			continue
		}
		u, err := url.Parse(p.Explorer)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			t.Errorf("%s: explorer %q is not an https origin", p.Name, p.Explorer)
		}
	}
}

// TestPresetGenesis: a preset's genesis, where it has one, is a block hash written in full, and
// the ones go-ethereum also states are its; the local devchain has none (each anvil run makes its
// own).
func TestPresetGenesis(t *testing.T) {
	for _, e := range table() {
		if e.genesis != "" && !regexp.MustCompile(`^0x[0-9a-f]{64}$`).MatchString(e.genesis) {
			t.Errorf("%s: genesis %q is not a 32-byte lower-case hex hash", e.name, e.genesis)
		}
	}
	for name, want := range map[string]common.Hash{"ethereum": params.MainnetGenesisHash, "ethereum-sepolia": params.SepoliaGenesisHash, "anvil": {}} {
		if p, err := Lookup(name); err != nil || p.Genesis != want {
			t.Errorf("%s: genesis %s, want %s (%v)", name, p.Genesis, want, err)
		}
	}
	base, _ := Lookup("base")
	if p, ok := ByChainID(8453); !ok || p.Name != "base" || p.Genesis != base.Genesis || base.Genesis == (common.Hash{}) {
		t.Errorf("ByChainID(8453) = %+v, %v", p, ok)
	}
	if _, ok := ByChainID(4242); ok {
		t.Error("ByChainID(4242): a preset for a chain there is none of")
	}
	n := facilitator.Network{ID: "eip155:8453", ChainID: 8453}
	if err := CheckGenesis(n, base.Genesis); err != nil {
		t.Errorf("Base's own genesis refused: %v", err)
	}
	err := CheckGenesis(n, common.HexToHash("0x01"))
	if !errors.Is(err, ErrWrongChain) || !strings.Contains(err.Error(), "not Base's "+base.Genesis.Hex()) || !strings.Contains(err.Error(), "point the network's RPC at a Base node") {
		t.Errorf("another genesis for Base's chain id: %v", err)
	}
	if err := CheckGenesis(facilitator.Network{ID: "eip155:31337", ChainID: 31337}, common.HexToHash("0x01")); err != nil {
		t.Errorf("a devchain's genesis refused: %v", err)
	}
}
