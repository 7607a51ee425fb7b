package devchain

import (
	"context"
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
)

// Multicall3Address is where Multicall3 lives on virtually every EVM chain.
const Multicall3Address = "0xcA11bde05977b3631167028862bE2a173976CA11"

// multicall3ABI is the one method used to prove the copy works.
const multicall3ABI = `[{"inputs":[],"name":"getBlockNumber","outputs":[{"internalType":"uint256","name":"blockNumber","type":"uint256"}],"stateMutability":"view","type":"function"}]`

// deployMulticall3 deploys viem's Multicall3 build normally and copies the
// resulting runtime code to the canonical address, which on real chains was
// reached with a keyless deployment we cannot replay here.
func (c *Chain) deployMulticall3(ctx context.Context) error {
	creation, err := multicall3Creation(c.nodeModules)
	if err != nil {
		return err
	}
	tmp, err := c.deploy(ctx, c.roles.deployer, creation)
	if err != nil {
		return fmt.Errorf("deploy Multicall3: %w", err)
	}
	code, err := c.Client.CodeAt(ctx, tmp, nil)
	if err != nil {
		return fmt.Errorf("devchain: Multicall3 code: %w", err)
	}
	if err := c.RPC.CallContext(ctx, nil, "anvil_setCode", c.Multicall3, "0x"+common.Bytes2Hex(code)); err != nil {
		return fmt.Errorf("devchain: anvil_setCode Multicall3: %w", err)
	}

	a, err := abi.JSON(strings.NewReader(multicall3ABI))
	if err != nil {
		return err
	}
	head, err := c.Client.BlockNumber(ctx)
	if err != nil {
		return err
	}
	out, err := c.call(ctx, c.Multicall3, &a, "getBlockNumber")
	if err != nil {
		return fmt.Errorf("devchain: Multicall3 at %s does not answer: %w", c.Multicall3, err)
	}
	// >= rather than ==: with a block time a block may be mined between the two calls.
	if got := out[0].(*big.Int); got.Cmp(new(big.Int).SetUint64(head)) < 0 {
		return fmt.Errorf("devchain: Multicall3 getBlockNumber = %s, chain is at %d", got, head)
	}
	return nil
}
