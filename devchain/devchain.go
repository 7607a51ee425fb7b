// Package devchain runs a throwaway anvil node with Circle's real USDC
// (FiatTokenV2_2 behind FiatTokenProxy), Multicall3 at its canonical address and
// funded dev accounts, for tests and for the local stack.
//
// Everything is built at run time from the pinned npm packages in node_modules
// (package.json at the module root), so no bytecode lives in this repository.
package devchain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/ethereum/go-ethereum/rpc"
)

// DefaultChainID is anvil's own default, which wallets and tools assume for localhost.
const DefaultChainID = 31337

// Options for Start. The zero value is usable.
type Options struct {
	// NodeModules is the node_modules directory; "" walks up from the working
	// directory to the first node_modules containing @foundry-rs/anvil-linux-amd64.
	NodeModules string
	ChainID     uint64        // 0 means DefaultChainID
	Port        int           // 0 picks a free loopback port
	BlockTime   time.Duration // 0 mines a block per transaction
	Logger      *slog.Logger  // anvil output goes here at debug level; nil discards
	// Host is the address anvil binds; "" is 127.0.0.1. A container publishing anvil's port needs
	// 0.0.0.0; RPCURL stays on loopback either way.
	Host string
	// NoMulticall3 leaves Multicall3's canonical address empty, as on a chain nobody deployed it
	// to (batched settlement must not start there).
	NoMulticall3 bool
}

// Chain is a running anvil with USDC deployed and the dev accounts funded.
type Chain struct {
	RPCURL, WSURL string
	ChainID       uint64
	Client        *ethclient.Client
	RPC           *rpc.Client
	USDC          *USDC
	Multicall3    common.Address
	// Accounts are anvil's ten default accounts (mnemonic "test test ... junk"),
	// each with anvil's 10,000 ETH and InitialUSDC atomic units of USDC, so
	// external tools configured with the well-known keys see the same state.
	Accounts []*Account

	nodeModules string
	tmpDir      string
	blockTime   time.Duration
	log         *slog.Logger
	proc        *anvilProc
	roles       *roles
	sendMu      sync.Mutex // serialises nonce lookup + broadcast
	walletMu    sync.Mutex
	wallet      *compiled // SmartWallet build, cached after first use
	closeOnce   sync.Once
	closeErr    error
	stopGuard   context.CancelFunc // ends guardPool (poolguard.go)
	guardDone   chan struct{}
}

// InitialUSDC is what each dev account is minted at start: 1,000,000 USDC.
func InitialUSDC() *big.Int { return big.NewInt(1_000_000_000_000) }

// Start launches anvil, deploys USDC and Multicall3, funds the accounts and
// returns once all of it has been checked. Callers must Close the chain.
func Start(ctx context.Context, opts Options) (*Chain, error) {
	if opts.ChainID == 0 {
		opts.ChainID = DefaultChainID
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nm := opts.NodeModules
	if nm == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		if nm, err = findNodeModules(wd); err != nil {
			return nil, err
		}
	}
	nm, err := filepath.Abs(nm)
	if err != nil {
		return nil, err
	}
	accounts, err := devAccounts()
	if err != nil {
		return nil, err
	}
	rs, err := newRoles()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "devchain-")
	if err != nil {
		return nil, err
	}

	begin := time.Now()
	proc, client, err := startAnvil(ctx, filepath.Join(nm, anvilRel), tmp, opts, log)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	port := strconv.Itoa(proc.port)
	c := &Chain{
		RPCURL:      "http://127.0.0.1:" + port,
		WSURL:       "ws://127.0.0.1:" + port,
		ChainID:     opts.ChainID,
		Client:      ethclient.NewClient(client),
		RPC:         client,
		Accounts:    accounts,
		Multicall3:  common.HexToAddress(Multicall3Address),
		nodeModules: nm,
		tmpDir:      tmp,
		blockTime:   opts.BlockTime,
		log:         log,
		proc:        proc,
		roles:       rs,
	}
	if err := c.setup(ctx, !opts.NoMulticall3); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	gctx, stop := context.WithCancel(context.Background())
	c.stopGuard, c.guardDone = stop, make(chan struct{})
	go func() {
		defer close(c.guardDone)
		c.guardPool(gctx)
	}()
	log.Info("devchain ready", "rpc", c.RPCURL, "chainId", c.ChainID, "usdc", c.USDC.Address,
		"multicall3", c.Multicall3, "took", time.Since(begin).Round(time.Millisecond))
	return c, nil
}

func (c *Chain) setup(ctx context.Context, multicall bool) error {
	var onNode []string
	if err := c.RPC.CallContext(ctx, &onNode, "eth_accounts"); err != nil {
		return fmt.Errorf("devchain: eth_accounts: %w", err)
	}
	if len(onNode) < len(c.Accounts) {
		return fmt.Errorf("devchain: anvil has %d accounts, want %d", len(onNode), len(c.Accounts))
	}
	for i, a := range c.Accounts {
		if common.HexToAddress(onNode[i]) != a.Address {
			return fmt.Errorf("devchain: anvil account %d is %s, expected the default-mnemonic key %s", i, onNode[i], a.Address)
		}
	}
	thousandETH := new(big.Int).Mul(big.NewInt(1000), big.NewInt(1e18))
	for _, r := range c.roles.all() {
		if err := c.SetBalance(ctx, r.Address, thousandETH); err != nil {
			return err
		}
	}
	usdc, err := c.deployUSDC(ctx)
	if err != nil {
		return err
	}
	c.USDC = usdc
	if err := c.fundUSDC(ctx); err != nil {
		return err
	}
	if !multicall {
		return nil
	}
	return c.deployMulticall3(ctx)
}

// fundUSDC mints to all accounts in one go: the mints are independent, so with a
// block time they land in one block instead of ten.
func (c *Chain) fundUSDC(ctx context.Context) error {
	var txs []*types.Transaction
	for _, a := range c.Accounts {
		data, err := c.USDC.ABI.Pack("mint", a.Address, InitialUSDC())
		if err != nil {
			return err
		}
		tx, err := c.submit(ctx, c.roles.minter, &c.USDC.Address, data)
		if err != nil {
			return fmt.Errorf("mint to %s: %w", a.Address, err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		rcpt, err := c.waitReceipt(ctx, tx.Hash())
		if err != nil {
			return err
		}
		if rcpt.Status != types.ReceiptStatusSuccessful {
			return fmt.Errorf("devchain: mint tx %s reverted", tx.Hash())
		}
	}
	return nil
}

// Close kills anvil with its process group, waits for it and removes temporary
// files. It is safe to call more than once.
func (c *Chain) Close() error {
	c.closeOnce.Do(func() {
		if c.stopGuard != nil {
			c.stopGuard()
			<-c.guardDone
		}
		if c.RPC != nil {
			c.RPC.Close()
		}
		if c.proc != nil {
			c.proc.kill()
		}
		c.closeErr = os.RemoveAll(c.tmpDir)
	})
	return c.closeErr
}

// Deployer pays for deployments; it is not one of Accounts, so their nonces stay untouched.
func (c *Chain) Deployer() *Account { return c.roles.deployer }

// PID is anvil's process id (for measuring what it costs).
func (c *Chain) PID() int { return c.proc.cmd.Process.Pid }

// Mine mines one block.
func (c *Chain) Mine(ctx context.Context) error {
	return c.RPC.CallContext(ctx, nil, "evm_mine")
}

// IncreaseTime moves the clock forward and mines a block so the next eth_call
// already sees the new timestamp (validBefore/validAfter checks read block.timestamp).
func (c *Chain) IncreaseTime(ctx context.Context, seconds int64) error {
	if err := c.RPC.CallContext(ctx, nil, "evm_increaseTime", seconds); err != nil {
		return fmt.Errorf("devchain: evm_increaseTime: %w", err)
	}
	return c.Mine(ctx)
}

// SetNextBlockTimestamp fixes the timestamp of the next mined block (without mining it).
func (c *Chain) SetNextBlockTimestamp(ctx context.Context, unix uint64) error {
	return c.RPC.CallContext(ctx, nil, "evm_setNextBlockTimestamp", unix)
}

// SetBalance overwrites an address's ETH balance.
func (c *Chain) SetBalance(ctx context.Context, addr common.Address, wei *big.Int) error {
	if err := c.RPC.CallContext(ctx, nil, "anvil_setBalance", addr, (*hexutil.Big)(wei)); err != nil {
		return fmt.Errorf("devchain: anvil_setBalance %s: %w", addr, err)
	}
	return nil
}

// Snapshot records the chain state; Revert returns to it. Lets tests share one chain.
func (c *Chain) Snapshot(ctx context.Context) (string, error) {
	var id string
	err := c.RPC.CallContext(ctx, &id, "evm_snapshot")
	return id, err
}

// Revert restores a Snapshot; anvil forgets the snapshot afterwards.
func (c *Chain) Revert(ctx context.Context, id string) error {
	var ok bool
	if err := c.RPC.CallContext(ctx, &ok, "evm_revert", id); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("devchain: evm_revert %s: unknown snapshot", id)
	}
	return nil
}
