// Package chains knows the chains USDC is issued on natively that x402 merchants use, by name
// (presets: chain id, CAIP-2 id, x402 v1 name, USDC's address and EIP-712 domain, and the finality
// rule), and checks at start that a configured network's node serves that chain and that each of
// its tokens signs under the configured domain.
//
// It is its own package rather than part of the domain root: the table is deployment data taken
// from outside sources (each entry cites its own), not a rule of the facilitator, and the start-up
// check reads the chain, which the domain root never does.
package chains

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Preset is one known chain: what an operator gets by naming it in a network's "preset".
type Preset struct {
	// Name is what an operator writes, e.g. "base-sepolia".
	Name string
	// Title is the chain's own name, e.g. "Base Sepolia".
	Title   string
	ChainID uint64
	// V1Name is the chain's x402 v1 network name, "" where x402 v1 has none.
	V1Name string
	// USDC is Circle's native USDC there and the EIP-712 domain it signs under.
	USDC facilitator.Token
	// Finality is when the chain's blocks are final: the tag where its nodes serve it, and the
	// depth used where (or while) the tag cannot be read.
	Finality facilitator.Finality
	// DomainConfirmed is false where none of the sources this table was built from states USDC's
	// EIP-712 name and version on that chain: the domain is then the one Circle's deployments
	// usually carry, and the start-up check (which reads it from the contract and refuses to start
	// on a mismatch) is what stands behind it.
	DomainConfirmed bool
	// Explorer is the chain's block explorer (no trailing slash), where a transaction is at
	// Explorer+"/tx/<hash>" and a block at Explorer+"/block/<number>"; "" where there is none (the
	// local devchain) or none is listed.
	Explorer string
	// Genesis is the hash of the chain's block 0, zero where no source this table was built from
	// states it: then a node is known to serve the chain by its chain id only.
	Genesis common.Hash
}

// CAIP2 is the preset's CAIP-2 network id.
func (p Preset) CAIP2() string { return facilitator.CAIP2(p.ChainID) }

// entry is one row of the table as written: the address as its source spells it (EIP-55
// checksummed, which a test holds, so that a mistyped character cannot pass unnoticed).
type entry struct {
	name, title     string
	chainID         uint64
	v1Name          string
	usdc            string
	usdcName        string
	usdcVersion     string
	finality        facilitator.Finality
	domainConfirmed bool
	genesis         string // "": not known
}

// table is every preset, in the order `facilitator networks` prints them. Built on each call:
// nothing in it can be changed from outside.
//
// Sources, as the npm packages pinned in package.json ship them; every address and every domain
// marked confirmed is read from one of them, and the three domains no source states say so:
//   - x402v2: @x402/evm 2.27.0, dist/cjs/index.js, DEFAULT_ASSETS (src/defaultAssets.ts):
//     address, EIP-712 name and version.
//   - x402v1: x402 1.2.0 (the v1 package, pinned through x402-express), dist/cjs/types/index.js,
//     config (src/types/shared/evm/config.ts): address and EIP-712 name; version "2" for every
//     chain in getDefaultAsset (dist/cjs/shared/index.js, src/shared/middleware.ts).
//   - Finality rules: the chains' consensus as described beside each rule below (no local source
//     states them; the anvil one was observed on anvil 1.7.1).
//   - viem: viem 2.57.20, tokens/definitions/usdc.ts (Circle's canonical USDC addresses):
//     address only.
//   - v1 names: facilitator.V1NetworkName (@x402/evm 2.27's table); chain ids of Ethereum and
//     Sepolia also in go-ethereum's params (MainnetChainConfig, SepoliaChainConfig).
//   - Genesis hashes: Ethereum's and Sepolia's from go-ethereum's params (MainnetGenesisHash,
//     SepoliaGenesisHash, which a test holds); Base's, Base Sepolia's and OP Sepolia's from
//     op-reth's chain spec (paradigmxyz/reth, crates/optimism/chainspec/src/constants.rs), Base's
//     and Base Sepolia's also in kona's rollup configs (genesis.l2.hash at block 0). OP Mainnet's
//     block 0 is its pre-Bedrock (OVM) history's, which those sources do not state; the other
//     chains' no source here states: they have none, and are told by chain id only.
func table() []entry {
	// The finality rules. Where a chain's nodes serve the "finalized" tag the tag decides; the depth
	// is the fallback for when it cannot be read, chosen to take about as long as the tag does on
	// that chain, so that falling back never makes a block final sooner than the chain's own word.
	// Ethereum (proof of stake): a block is finalized by Casper FFG after two epochs of 32 slots
	// (about 13 minutes); geth and every other execution client serve the tag since the Merge.
	// A missed slot makes no block, so 64 blocks never come sooner than two epochs.
	ethereumFinality := facilitator.Finality{Tag: "finalized", Depth: 64}
	// OP Stack (Base, OP Mainnet and their Sepolia testnets): op-node marks an L2 block finalized
	// once the L1 block holding its batch is finalized, and op-geth serves the tag; that is
	// about 20 minutes behind the head, 600 blocks at the OP Stack's 2 s block time.
	opStackFinality := facilitator.Finality{Tag: "finalized", Depth: 600}
	// Arbitrum Nitro (Arbitrum One, Arbitrum Sepolia): a block is finalized once the L1 block
	// holding its batch is finalized, and Nitro serves the tag; blocks come up to 4 a second, so
	// 4800 blocks is the same 20 minutes.
	arbitrumFinality := facilitator.Finality{Tag: "finalized", Depth: 4800}
	// Polygon PoS (and Amoy): Bor serves as finalized the last block a Heimdall milestone
	// settled. Before milestones the chain reorganised by up to about 150 blocks; 256 blocks
	// (about 9 minutes at 2 s) stays past that for the fallback.
	polygonFinality := facilitator.Finality{Tag: "finalized", Depth: 256}
	// Avalanche C-Chain (and Fuji): Snowman accepts a block irreversibly within seconds and
	// coreth serves the last accepted block as finalized. The fallback is a few blocks (about
	// half a minute at 2 s) in case a node is run with unaccepted blocks visible
	// (allow-unfinalized-queries).
	avalancheFinality := facilitator.Finality{Tag: "finalized", Depth: 12}
	// anvil (the local stack): blocks are mined on demand and never reorganise. anvil does serve
	// the tags, but as the head minus 64 blocks (safe: minus 32), so by the tag nothing on a
	// quiet dev chain would ever become final: one block it is, as before presets.
	devFinality := facilitator.Finality{Depth: 1}

	return []entry{
		// Base: x402v2 (address, "USD Coin", "2"); address also in x402v1 and viem.
		{"base", "Base", 8453, "base", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "USD Coin", "2", opStackFinality, true, "0xf712aa9241cc24369b143cf6dce85f0902a9731e70d66818a3a5845b296c73dd"},
		// Base Sepolia: x402v2 (address, "USDC", "2"); address also in x402v1 and viem.
		{"base-sepolia", "Base Sepolia", 84532, "base-sepolia", "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "USDC", "2", opStackFinality, true, "0x0dcc9e089e30b90ddfc55be9a37dd15bc551aeee999d2e2b51414c54eaf934e4"},
		// Ethereum: x402v2 (address, "USD Coin", "2"); address also in viem.
		{"ethereum", "Ethereum", 1, "ethereum", "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48", "USD Coin", "2", ethereumFinality, true, "0xd4e56740f876aef8c010b86a40d5f56745a118d0906a34e69aec8c0db1cb8fa3"},
		// Ethereum Sepolia: address from viem. No local source states the EIP-712 domain: "USDC",
		// "2" is what Base Sepolia's and Polygon Amoy's carry, but Arbitrum Sepolia's and Fuji's
		// say "USD Coin": unconfirmed, checked against the contract at start.
		{"ethereum-sepolia", "Ethereum Sepolia", 11155111, "sepolia", "0x1c7D4B196Cb0C7B01d743Fbc6116a902379C7238", "USDC", "2", ethereumFinality, false, "0x25a5cc106eea7138acab33231d7160d69cb777ee0c2c553fcddf5138993e6dd9"},
		// Arbitrum One: x402v2 (address, "USD Coin", "2"); address also in viem. No x402 v1 name.
		{"arbitrum", "Arbitrum One", 42161, "", "0xaf88d065e77c8cC2239327C5EDb3A432268e5831", "USD Coin", "2", arbitrumFinality, true, ""},
		// Arbitrum Sepolia: x402v2 (address, "USD Coin", "2"); address also in viem. No x402 v1
		// name.
		{"arbitrum-sepolia", "Arbitrum Sepolia", 421614, "", "0x75faf114eafb1BDbe2F0316DF893fd58CE46AA4d", "USD Coin", "2", arbitrumFinality, true, ""},
		// OP Mainnet: address from viem. No local source states the EIP-712 domain: "USD Coin",
		// "2" is mainnet FiatToken's (Ethereum, Base, Arbitrum One); unconfirmed, checked at start.
		// No x402 v1 name.
		{"optimism", "OP Mainnet", 10, "", "0x0b2C639c533813f4Aa9D7837CAf62653d097Ff85", "USD Coin", "2", opStackFinality, false, ""},
		// OP Sepolia: address from viem. Domain unconfirmed, as Ethereum Sepolia's ("USDC", "2").
		// No x402 v1 name.
		{"optimism-sepolia", "OP Sepolia", 11155420, "", "0x5fd84259d66Cd46123540766Be93DFE6D43130D7", "USDC", "2", opStackFinality, false, "0x102de6ffb001480cc9b8b548fd05c34cd4f46ae4aa91759393db90ea0409887d"},
		// Polygon PoS: x402v2 (address, "USD Coin", "2"); address also in x402v1 and viem.
		{"polygon", "Polygon PoS", 137, "polygon", "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359", "USD Coin", "2", polygonFinality, true, ""},
		// Polygon Amoy: x402v1 (address, "USDC"; version "2"); address also in viem.
		{"polygon-amoy", "Polygon Amoy", 80002, "polygon-amoy", "0x41E94Eb019C0762f9Bfcf9Fb1E58725BfB0e7582", "USDC", "2", polygonFinality, true, ""},
		// Avalanche C-Chain: x402v2 (address, "USD Coin", "2"); address also in x402v1 and viem.
		{"avalanche", "Avalanche C-Chain", 43114, "avalanche", "0xB97EF9Ef8734C71904D8002F8b6Bc66Dd9c48a6E", "USD Coin", "2", avalancheFinality, true, ""},
		// Avalanche Fuji: x402v1 (address, "USD Coin"; version "2"); address also in viem.
		{"avalanche-fuji", "Avalanche Fuji", 43113, "avalanche-fuji", "0x5425890298aed601595a70AB815c96711a31Bc65", "USD Coin", "2", avalancheFinality, true, ""},
		// The local stack (make run, facilitator-dev dev): anvil's chain id, and Circle's FiatTokenV2_2
		// as devchain deploys it, always at this address (the deployer's first nonces on a fresh
		// anvil), with mainnet's domain; a test deploys it and runs the start-up check against it.
		{"anvil", "anvil (local devchain)", 31337, "", "0x244aE02008762968261615a485542A9c7512c562", "USD Coin", "2", devFinality, true, ""},
	}
}

// explorer is the block explorer of the preset named name, "" where it has none: each is the
// Etherscan-family explorer of its chain (Basescan for Base), whose /tx/<hash> and
// /block/<number> paths the receipt page links to. None for the chains whose explorers use other
// paths, nor for the local devchain.
func explorer(name string) string {
	switch name {
	case "base":
		return "https://basescan.org"
	case "base-sepolia":
		return "https://sepolia.basescan.org"
	case "ethereum":
		return "https://etherscan.io"
	case "ethereum-sepolia":
		return "https://sepolia.etherscan.io"
	case "arbitrum":
		return "https://arbiscan.io"
	case "arbitrum-sepolia":
		return "https://sepolia.arbiscan.io"
	case "optimism":
		return "https://optimistic.etherscan.io"
	case "optimism-sepolia":
		return "https://sepolia-optimism.etherscan.io"
	case "polygon":
		return "https://polygonscan.com"
	case "polygon-amoy":
		return "https://amoy.polygonscan.com"
	}
	return ""
}

// Presets returns every preset, in the order `facilitator networks` prints them.
func Presets() []Preset {
	rows := table()
	out := make([]Preset, len(rows))
	for i, e := range rows {
		out[i] = Preset{Name: e.name, Title: e.title, ChainID: e.chainID, V1Name: e.v1Name,
			USDC:     facilitator.Token{Address: common.HexToAddress(e.usdc), Name: e.usdcName, Version: e.usdcVersion, Decimals: 6},
			Finality: e.finality, DomainConfirmed: e.domainConfirmed, Explorer: explorer(e.name)}
		if e.genesis != "" {
			out[i].Genesis = common.HexToHash(e.genesis)
		}
	}
	return out
}

// Lookup returns the preset of that name; the error lists the names there are.
func Lookup(name string) (Preset, error) {
	all := Presets()
	i := slices.IndexFunc(all, func(p Preset) bool { return p.Name == name })
	if i < 0 {
		names := make([]string, len(all))
		for j, p := range all {
			names[j] = p.Name
		}
		return Preset{}, fmt.Errorf("unknown preset %q (known: %s; `facilitator networks` lists them)", name, strings.Join(names, ", "))
	}
	return all[i], nil
}

// ByChainID returns the preset of that chain id, if there is one: a network claiming the chain is
// held to what the preset knows of it (its genesis), whether or not it names the preset.
func ByChainID(id uint64) (Preset, bool) {
	all := Presets()
	i := slices.IndexFunc(all, func(p Preset) bool { return p.ChainID == id })
	if i < 0 {
		return Preset{}, false
	}
	return all[i], true
}
