package devchain

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
)

// Both files are embedded (as strings, so nothing can modify them) and written to
// the chain's temp dir when compiling, so a built binary such as the local stack
// needs only node and node_modules, not this source tree.
var (
	//go:embed solc.mjs
	solcScript string
	//go:embed testdata/SmartWallet.sol
	smartWalletSource string
	//go:embed testdata/Emitter.sol
	emitterSource string
	//go:embed testdata/GreedyWallet.sol
	greedyWalletSource string
)

// ERC1271Magic is what isValidSignature returns for a valid signature.
const ERC1271Magic = 0x1626ba7e

// compiled is solc's output for one contract.
type compiled struct {
	ABI      abi.ABI
	Bytecode []byte
}

// DeploySmartWallet deploys an ERC-1271 wallet (testdata/SmartWallet.sol) that
// accepts 65-byte ECDSA signatures by owner over the exact hash it is given.
func (c *Chain) DeploySmartWallet(ctx context.Context, owner common.Address) (common.Address, error) {
	w, err := c.smartWallet(ctx)
	if err != nil {
		return common.Address{}, err
	}
	args, err := w.ABI.Pack("", owner)
	if err != nil {
		return common.Address{}, err
	}
	addr, err := c.deploy(ctx, c.roles.deployer, append(bytes.Clone(w.Bytecode), args...))
	if err != nil {
		return common.Address{}, fmt.Errorf("deploy SmartWallet: %w", err)
	}
	return addr, nil
}

// SetGreedyCode gives addr the code of testdata/GreedyWallet.sol, whose isValidSignature burns
// all but a little of the gas it is given: an account that had no code when its payment was
// verified (an EOA that delegates with EIP-7702 meanwhile) and now makes the token's signature
// check of it sink the transaction it is in. Nothing is mined: it works with mining off.
func (c *Chain) SetGreedyCode(ctx context.Context, addr common.Address) error {
	w, err := c.compile(ctx, "GreedyWallet.sol", greedyWalletSource)
	if err != nil {
		return err
	}
	return c.setCode(ctx, addr, w.Bytecode)
}

// SetSmartWalletCode gives the EOA addr the code of testdata/SmartWallet.sol owned by addr
// itself, as an EOA delegating to such a wallet with EIP-7702 has: its payments stay signed by
// its key, and the token asks its code about them (ERC-1271).
func (c *Chain) SetSmartWalletCode(ctx context.Context, addr common.Address) error {
	w, err := c.smartWallet(ctx)
	if err != nil {
		return err
	}
	args, err := w.ABI.Pack("", addr)
	if err != nil {
		return err
	}
	return c.setCode(ctx, addr, append(bytes.Clone(w.Bytecode), args...))
}

// setCode puts at addr the runtime code that creation returns, without mining anything: the
// creation code's answer to a call is its runtime code.
func (c *Chain) setCode(ctx context.Context, addr common.Address, creation []byte) error {
	var code hexutil.Bytes
	if err := c.RPC.CallContext(ctx, &code, "eth_call", map[string]any{"from": c.roles.deployer.Address, "input": hexutil.Bytes(creation)}, "latest"); err != nil || len(code) == 0 {
		return fmt.Errorf("devchain: runtime code for %s (%d bytes): %v", addr, len(code), err)
	}
	if err := c.RPC.CallContext(ctx, nil, "anvil_setCode", addr, code); err != nil {
		return fmt.Errorf("devchain: anvil_setCode %s: %w", addr, err)
	}
	return nil
}

// IsValidSignature calls ERC-1271 isValidSignature on wallet and returns the
// 4-byte answer (ERC1271Magic when valid).
func (c *Chain) IsValidSignature(ctx context.Context, wallet common.Address, hash common.Hash, sig []byte) (uint32, error) {
	w, err := c.smartWallet(ctx)
	if err != nil {
		return 0, err
	}
	out, err := c.call(ctx, wallet, &w.ABI, "isValidSignature", [32]byte(hash), sig)
	if err != nil {
		return 0, err
	}
	b := out[0].([4]byte)
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]), nil
}

// smartWallet compiles SmartWallet.sol once per chain; solc-js takes about a second.
func (c *Chain) smartWallet(ctx context.Context) (*compiled, error) {
	c.walletMu.Lock()
	defer c.walletMu.Unlock()
	if c.wallet != nil {
		return c.wallet, nil
	}
	w, err := c.compile(ctx, "SmartWallet.sol", smartWalletSource)
	if err != nil {
		return nil, err
	}
	c.wallet = w
	return w, nil
}

func (c *Chain) compile(ctx context.Context, name, source string) (*compiled, error) {
	return compileSolidity(ctx, c.tmpDir, c.nodeModules, name, source)
}

// CompileEmitter compiles testdata/Emitter.sol (emitMany(n): n Transfer and n AuthorizationUsed
// events) for the indexer's backfill benchmarks, which run against an anvil they did not start:
// solc-js is found in the node_modules above the working directory, as anvil is.
func CompileEmitter(ctx context.Context) (abi.ABI, []byte, error) {
	nm, err := findNodeModules(".")
	if err != nil {
		return abi.ABI{}, nil, err
	}
	tmp, err := os.MkdirTemp("", "x402-solc-")
	if err != nil {
		return abi.ABI{}, nil, err
	}
	defer os.RemoveAll(tmp)
	c, err := compileSolidity(ctx, tmp, nm, "Emitter.sol", emitterSource)
	if err != nil {
		return abi.ABI{}, nil, err
	}
	return c.ABI, c.Bytecode, nil
}

// compileSolidity compiles one source file with solc-js under tmpDir; node runs the embedded
// solc.mjs, so a built binary needs no source tree.
func compileSolidity(ctx context.Context, tmpDir, nodeModules, name, source string) (*compiled, error) {
	dir, err := os.MkdirTemp(tmpDir, "solc-")
	if err != nil {
		return nil, err
	}
	script, src := filepath.Join(dir, "solc.mjs"), filepath.Join(dir, name)
	if err := os.WriteFile(script, []byte(solcScript), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(src, []byte(source), 0o600); err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("devchain: node is needed to compile %s: %w", name, err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, node, script, src, nodeModules)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("devchain: compile %s with solc-js: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	var out struct {
		ABI      json.RawMessage `json:"abi"`
		Bytecode string          `json:"bytecode"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("devchain: solc.mjs output for %s: %w", name, err)
	}
	a, err := abi.JSON(bytes.NewReader(out.ABI))
	if err != nil {
		return nil, fmt.Errorf("devchain: abi of %s: %w", name, err)
	}
	code, err := hexutil.Decode(out.Bytecode)
	if err != nil || len(code) == 0 {
		return nil, fmt.Errorf("devchain: bytecode of %s: %v", name, err)
	}
	return &compiled{ABI: a, Bytecode: code}, nil
}
