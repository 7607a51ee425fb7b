package settle_test

import (
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/core/types"
)

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
