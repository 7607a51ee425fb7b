package stacktest

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// BranchTx is a transaction of a reorganisation's new branch: its signed bytes, and the block
// of the branch it is mined in (0: the first block after the common ancestor).
type BranchTx struct {
	Tx    *types.Transaction
	Block uint64
}

// Reorg replaces the chain's last depth blocks with depth new ones (anvil_reorg): the head keeps
// its number and gets a new hash, and the new blocks hold exactly txs, each in its Block, in the
// order given within a block. The replaced blocks' transactions are not put back in the pool:
// one left out of txs is gone from the chain. The test fails unless every tx of txs is mined
// where it was placed.
func (e *Env) Reorg(t testing.TB, depth uint64, txs ...BranchTx) {
	t.Helper()
	ctx := context.Background()
	pairs := make([][2]any, len(txs))
	for i, b := range txs {
		raw, err := b.Tx.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		pairs[i] = [2]any{hexutil.Bytes(raw), b.Block}
	}
	before := e.BlockAt(t, "latest")
	if err := e.Chain.RPC.CallContext(ctx, nil, "anvil_reorg", depth, pairs); err != nil {
		t.Fatalf("anvil_reorg(%d, %d transactions): %v", depth, len(txs), err)
	}
	after := e.BlockAt(t, "latest")
	if after.Number != before.Number || after.Hash == before.Hash {
		t.Fatalf("anvil_reorg(%d): head %d %s became %d %s, want the same height with a new hash", depth,
			before.Number, before.Hash, after.Number, after.Hash)
	}
	base := uint64(before.Number) - depth + 1
	for _, b := range txs {
		r := e.Receipt(t, b.Tx.Hash())
		if r == nil || r.BlockNumber.Uint64() != base+b.Block {
			t.Fatalf("anvil_reorg: transaction %s is not in block %d of the new branch: receipt %+v", b.Tx.Hash(), base+b.Block, r)
		}
	}
}

// CancelTx is the payer's cancelAuthorization of nonce, submitted from the dev account
// CancelAuthorization uses (at its next nonce), signed and not sent: for a new branch (Reorg).
func (e *Env) CancelTx(t testing.TB, payer *ecdsa.PrivateKey, nonce [32]byte) *types.Transaction {
	t.Helper()
	data, err := e.Chain.USDC.CancelAuthorizationCalldata(payer, nonce)
	if err != nil {
		t.Fatal(err)
	}
	return e.signTx(t, e.Chain.Accounts[2], data)
}

// signTx signs a call of USDC from a dev account at its next nonce (pending), with a gas limit
// enough for an EIP-3009 call and fees twice the head's base fee.
func (e *Env) signTx(t testing.TB, from *devchain.Account, data []byte) *types.Transaction {
	t.Helper()
	ctx := context.Background()
	c := e.Chain
	nonce, err := c.Client.PendingNonceAt(ctx, from.Address)
	if err != nil {
		t.Fatal(err)
	}
	head, err := c.Client.HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	tip := big.NewInt(1_000_000_000)
	feeCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip)
	tx, err := ethrpc.NewSigner(c.ChainID, from.Key).Sign(nonce, &c.USDC.Address, data, 200_000, tip, feeCap)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}
