package facilitator

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ethereum/go-ethereum/common"
)

// SchemeExact is the only scheme this facilitator serves.
const SchemeExact = "exact"

// Network is one EVM chain the facilitator serves: its CAIP-2 id (v2), its v1 name where one
// exists, and the EIP-3009 tokens it accepts there.
type Network struct {
	ID      string // CAIP-2, e.g. "eip155:84532"
	ChainID uint64
	V1Name  string // e.g. "base-sepolia"; empty when the chain has no v1 name
	Tokens  []Token
	// Finality is when the network's blocks are final.
	Finality Finality
	// Batch batches the network's settlements through Multicall3 (batch.go); zero: off.
	Batch BatchPolicy
	// Explorer is the chain's block explorer, from its preset (chains.Preset.Explorer): a
	// transaction is at Explorer+"/tx/<hash>"; "" for none.
	Explorer string
}

// Finality is how a network's blocks become final: by the chain's own word where its nodes serve
// a finality block tag (a block at or below the block the tag names is final), by depth
// elsewhere.
type Finality struct {
	// Tag is "finalized" or "safe", or "" to count confirmations.
	Tag string
	// Depth is the confirmations (the block itself counts as one) at which a block is final when
	// there is no tag, and while the tag cannot be read.
	Depth uint64
}

// Token is an accepted EIP-3009 asset and the EIP-712 domain it signs under.
type Token struct {
	Address common.Address
	Name    string
	Version string
	// Decimals is how many of the token's base units make one whole token (USDC: 6). Amounts on
	// the wire stay in base units; this is only how they are shown to people.
	Decimals uint8
}

// FormatUnits writes an amount in base units (a decimal string) as whole tokens: 250000 with 6
// decimals is "0.25". Anything that is not a non-negative decimal integer is returned as it is.
func FormatUnits(value string, decimals uint8) string {
	if value == "" || strings.TrimLeft(value, "0123456789") != "" {
		return value
	}
	value = strings.TrimLeft(value, "0")
	d := int(decimals)
	if len(value) <= d {
		value = strings.Repeat("0", d-len(value)+1) + value
	}
	whole, frac := value[:len(value)-d], strings.TrimRight(value[len(value)-d:], "0")
	if frac == "" {
		return whole
	}
	return whole + "." + frac
}

// Token returns the accepted token at addr.
func (n Network) Token(addr common.Address) (Token, bool) {
	for _, t := range n.Tokens {
		if t.Address == addr {
			return t, true
		}
	}
	return Token{}, false
}

// ParseCAIP2 returns the chain id of an "eip155:<id>" network.
func ParseCAIP2(id string) (uint64, error) {
	rest, ok := strings.CutPrefix(id, "eip155:")
	if !ok || rest == "" || strings.TrimLeft(rest, "0123456789") != "" {
		return 0, fmt.Errorf("network %q is not of the form eip155:<chain id>", id)
	}
	n, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("network %q: chain id: %w", id, err)
	}
	return n, nil
}

// CAIP2 returns the CAIP-2 id of an EVM chain.
func CAIP2(chainID uint64) string { return "eip155:" + strconv.FormatUint(chainID, 10) }

// v1Networks is the v1 name table of the official EVM exact scheme (@x402/evm 2.27), which
// registers v1 for every name in it. It is read-only.
var v1Networks = map[string]uint64{
	"ethereum": 1, "sepolia": 11155111, "abstract": 2741, "abstract-testnet": 11124,
	"base-sepolia": 84532, "base": 8453, "avalanche-fuji": 43113, "avalanche": 43114,
	"iotex": 4689, "sei": 1329, "sei-testnet": 1328, "polygon": 137, "polygon-amoy": 80002,
	"peaq": 3338, "story": 1514, "educhain": 41923, "skale-base-sepolia": 324705682,
	"megaeth": 4326, "monad": 143, "stable": 988, "stable-testnet": 2201, "celo": 42220,
	"flare": 14,
}

// V1NetworkName returns the v1 name of a chain, if the official table has one.
func V1NetworkName(chainID uint64) (string, bool) {
	for name, id := range v1Networks {
		if id == chainID {
			return name, true
		}
	}
	return "", false
}

// V1ChainID returns the chain id of a v1 network name.
func V1ChainID(name string) (uint64, bool) {
	id, ok := v1Networks[name]
	return id, ok
}

// Supported describes what a facilitator serving networks with the given signer addresses
// answers on GET /supported: one concrete v2 kind per network (the official resource server
// matches networks by string equality, so no wildcards), the v1 name where the chain has one, and
// the signers under the eip155 family.
func Supported(networks []Network, signers []common.Address, extensions []string) SupportedResponse {
	res := SupportedResponse{Kinds: []SupportedKind{}, Extensions: extensions, Signers: map[string][]string{}}
	if res.Extensions == nil {
		res.Extensions = []string{}
	}
	for _, n := range networks {
		res.Kinds = append(res.Kinds, SupportedKind{X402Version: 2, Scheme: SchemeExact, Network: n.ID})
	}
	for _, n := range networks {
		if n.V1Name != "" {
			res.Kinds = append(res.Kinds, SupportedKind{X402Version: 1, Scheme: SchemeExact, Network: n.V1Name})
		}
	}
	addrs := make([]string, 0, len(signers))
	for _, s := range signers {
		addrs = append(addrs, s.Hex())
	}
	res.Signers["eip155:*"] = addrs
	return res
}
