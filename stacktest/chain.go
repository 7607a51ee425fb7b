package stacktest

import (
	"context"
	"crypto/ecdsa"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
)

// ManualMining switches auto-mine off until the test ends (the function ManualMining).
func (e *Env) ManualMining(t testing.TB) { ManualMining(t, e.Chain) }

// SetAutomine switches anvil's auto-mine on or off.
func (e *Env) SetAutomine(t testing.TB, on bool) {
	t.Helper()
	if err := e.Chain.RPC.CallContext(context.Background(), nil, "anvil_setAutomine", on); err != nil {
		t.Fatal(err)
	}
}

// Mine mines one block.
func (e *Env) Mine(t testing.TB) {
	t.Helper()
	if err := e.Chain.Mine(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// DropPool drops every transaction in anvil's pool, as a node that restarted would have.
func (e *Env) DropPool(t testing.TB) {
	t.Helper()
	if err := e.Chain.RPC.CallContext(context.Background(), nil, "anvil_dropAllTransactions"); err != nil {
		t.Fatalf("anvil_dropAllTransactions: %v", err)
	}
	if n, err := PoolSize(context.Background(), e.Chain); err != nil || n != 0 {
		t.Fatalf("pool after dropping all: %d transactions, %v", n, err)
	}
}

// Block is a block header's fields the tests read.
type Block struct {
	Number hexutil.Uint64 `json:"number"`
	Hash   common.Hash    `json:"hash"`
	Time   hexutil.Uint64 `json:"timestamp"`
}

// BlockAt is the block at tag ("latest", or a hex number); the test fails if there is none.
func (e *Env) BlockAt(t testing.TB, tag string) Block {
	t.Helper()
	b, ok := e.BlockIf(t, tag)
	if !ok {
		t.Fatalf("eth_getBlockByNumber %s: no such block", tag)
	}
	return b
}

// BlockIf is the block at tag, if the chain has one.
func (e *Env) BlockIf(t testing.TB, tag string) (Block, bool) {
	t.Helper()
	var b *Block
	if err := e.Chain.RPC.CallContext(context.Background(), &b, "eth_getBlockByNumber", tag, false); err != nil {
		t.Fatalf("eth_getBlockByNumber %s: %v", tag, err)
	}
	if b == nil {
		return Block{}, false
	}
	return *b, true
}

// Head is the latest block's number.
func (e *Env) Head(t testing.TB) uint64 { return uint64(e.BlockAt(t, "latest").Number) }

// TimeBase is the later of the wall clock and the chain's clock: the verifier checks validBefore
// against the first, the simulation against the second, and some tests move the chain's ahead.
func (e *Env) TimeBase(t testing.TB) int64 {
	t.Helper()
	return max(time.Now().Unix(), int64(e.BlockAt(t, "latest").Time))
}

// InPool reports whether the node knows the transaction and has not mined it.
func (e *Env) InPool(t testing.TB, hash common.Hash) bool {
	t.Helper()
	var tx *struct {
		BlockNumber *hexutil.Big `json:"blockNumber"`
	}
	if err := e.Chain.RPC.CallContext(context.Background(), &tx, "eth_getTransactionByHash", hash); err != nil {
		t.Fatalf("eth_getTransactionByHash: %v", err)
	}
	return tx != nil && tx.BlockNumber == nil
}

// Receipt is the transaction's receipt, nil while it is not mined.
func (e *Env) Receipt(t testing.TB, hash common.Hash) *types.Receipt {
	t.Helper()
	var r *types.Receipt
	if err := e.Chain.RPC.CallContext(context.Background(), &r, "eth_getTransactionReceipt", hash); err != nil {
		t.Fatalf("eth_getTransactionReceipt: %v", err)
	}
	return r
}

// Balance is addr's USDC balance in atomic units.
func (e *Env) Balance(t testing.TB, addr common.Address) int64 {
	t.Helper()
	b, err := e.Chain.USDC.BalanceOf(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return b.Int64()
}

// CancelAuthorization has the payer cancel its authorization nonce on chain, submitted by a dev
// account (auto-mining must be on); it returns the mined transaction's hash.
func (e *Env) CancelAuthorization(t testing.TB, payer *ecdsa.PrivateKey, nonce [32]byte) common.Hash {
	t.Helper()
	hash, err := e.Chain.USDC.CancelAuthorization(context.Background(), e.Chain.Accounts[2], payer, nonce)
	if err != nil {
		t.Fatalf("cancelAuthorization: %v", err)
	}
	return hash
}
