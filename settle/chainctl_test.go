package settle_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
)

// setAutomine switches anvil's mining per transaction (devchaintest.ManualMining turns it off).
func setAutomine(t testing.TB, on bool) {
	t.Helper()
	if err := chain.RPC.CallContext(context.Background(), nil, "anvil_setAutomine", on); err != nil {
		t.Fatal(err)
	}
}

func mine(t testing.TB) {
	t.Helper()
	if err := chain.RPC.CallContext(context.Background(), nil, "evm_mine"); err != nil {
		t.Fatal(err)
	}
}

func decodeTx(t testing.TB, raw []byte) *types.Transaction {
	t.Helper()
	var tx types.Transaction
	if err := tx.UnmarshalBinary(raw); err != nil {
		t.Fatal(err)
	}
	return &tx
}

func pct(n *big.Int, p int64) *big.Int {
	return new(big.Int).Div(new(big.Int).Mul(n, big.NewInt(p)), big.NewInt(100))
}

func addressOf(k *ecdsa.PrivateKey) common.Address { return crypto.PubkeyToAddress(k.PublicKey) }
