package devchain

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// send signs and submits an EIP-1559 transaction from `from` and waits for its
// receipt; a reverted transaction is an error. to == nil deploys data as code.
func (c *Chain) send(ctx context.Context, from *Account, to *common.Address, data []byte) (*types.Receipt, error) {
	tx, err := c.submit(ctx, from, to, data)
	if err != nil {
		return nil, err
	}
	rcpt, err := c.waitReceipt(ctx, tx.Hash())
	if err != nil {
		return nil, err
	}
	if rcpt.Status != types.ReceiptStatusSuccessful {
		return rcpt, fmt.Errorf("devchain: tx %s from %s reverted (gas used %d)", tx.Hash(), from.Address, rcpt.GasUsed)
	}
	return rcpt, nil
}

// submit holds sendMu from nonce lookup to broadcast so that concurrent senders
// from one account never reuse a nonce.
func (c *Chain) submit(ctx context.Context, from *Account, to *common.Address, data []byte) (*types.Transaction, error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()

	msg := ethereum.CallMsg{From: from.Address, To: to, Data: data}
	gas, err := c.Client.EstimateGas(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("devchain: estimate gas from %s: %w", from.Address, withRevertReason(err))
	}
	nonce, err := c.Client.PendingNonceAt(ctx, from.Address)
	if err != nil {
		return nil, fmt.Errorf("devchain: nonce of %s: %w", from.Address, err)
	}
	head, err := c.Client.HeaderByNumber(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("devchain: latest header: %w", err)
	}
	tip := big.NewInt(1_000_000_000)
	feeCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip)
	// Headroom on the gas: estimates are exact only for the state they ran on.
	tx, err := ethrpc.NewSigner(c.ChainID, from.Key).Sign(nonce, to, data, gas+gas/5, tip, feeCap)
	if err != nil {
		return nil, fmt.Errorf("devchain: sign tx: %w", err)
	}
	if err := c.Client.SendTransaction(ctx, tx); err != nil {
		return nil, fmt.Errorf("devchain: send tx from %s: %w", from.Address, withRevertReason(err))
	}
	return tx, nil
}

// waitReceipt polls for a receipt. The bound covers a few intervals when blocks
// are mined on a timer; with auto-mine the first poll normally succeeds.
func (c *Chain) waitReceipt(ctx context.Context, hash common.Hash) (*types.Receipt, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+3*c.blockTime)
	defer cancel()
	for {
		rcpt, err := c.Client.TransactionReceipt(ctx, hash)
		if err == nil {
			return rcpt, nil
		}
		if !errors.Is(err, ethereum.NotFound) {
			return nil, fmt.Errorf("devchain: receipt of %s: %w", hash, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("devchain: no receipt for %s: %w", hash, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// deploy sends creation code and returns the new contract's address.
func (c *Chain) deploy(ctx context.Context, from *Account, code []byte) (common.Address, error) {
	rcpt, err := c.send(ctx, from, nil, code)
	if err != nil {
		return common.Address{}, err
	}
	return rcpt.ContractAddress, nil
}

// call runs a read-only method on the latest block and unpacks its outputs.
func (c *Chain) call(ctx context.Context, to common.Address, a *abi.ABI, method string, args ...any) ([]any, error) {
	data, err := a.Pack(method, args...)
	if err != nil {
		return nil, fmt.Errorf("devchain: pack %s: %w", method, err)
	}
	out, err := c.Client.CallContract(ctx, ethereum.CallMsg{To: &to, Data: data}, nil)
	if err != nil {
		return nil, fmt.Errorf("devchain: call %s on %s: %w", method, to, withRevertReason(err))
	}
	res, err := a.Unpack(method, out)
	if err != nil {
		return nil, fmt.Errorf("devchain: unpack %s from %s: %w", method, to, err)
	}
	return res, nil
}

// transact packs a method call and sends it.
func (c *Chain) transact(ctx context.Context, from *Account, to common.Address, a *abi.ABI, method string, args ...any) (*types.Receipt, error) {
	data, err := a.Pack(method, args...)
	if err != nil {
		return nil, fmt.Errorf("devchain: pack %s: %w", method, err)
	}
	rcpt, err := c.send(ctx, from, &to, data)
	if err != nil {
		return rcpt, fmt.Errorf("%s: %w", a.Methods[method].RawName, err)
	}
	return rcpt, nil
}

// withRevertReason appends the decoded Error(string) when the node returned revert
// data but did not already put the reason in its message.
func withRevertReason(err error) error {
	var de rpc.DataError
	if !errors.As(err, &de) {
		return err
	}
	s, ok := de.ErrorData().(string)
	if !ok {
		return err
	}
	data, derr := hexutil.Decode(s)
	if derr != nil {
		return err
	}
	if reason, uerr := abi.UnpackRevert(data); uerr == nil && !strings.Contains(err.Error(), reason) {
		return fmt.Errorf("%w (reason: %q)", err, reason)
	}
	return err
}
