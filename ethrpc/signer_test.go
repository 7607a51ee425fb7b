package ethrpc_test

import (
	"bytes"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// TestSignerSign: a signed transaction is the EIP-1559 transaction asked for, from the key's
// account on the signer's chain; and the same inputs sign the same bytes, which the ledger's
// duplicate check on a lost answer relies on (a replay of a bump or a move finds its own row).
func TestSignerSign(t *testing.T) {
	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s := ethrpc.NewSigner(84532, key)
	if s.Address() != crypto.PubkeyToAddress(key.PublicKey) {
		t.Fatalf("address %s, want the key's", s.Address())
	}
	to := common.HexToAddress("0x036CbD53842c5426634e7929541eC2318f3dCF7e")
	data := []byte{0xe3, 0xee, 0x16, 0x0e, 1, 2, 3}
	tip, feeCap := big.NewInt(1_000_000_000), big.NewInt(3_000_000_000)
	tx, err := s.Sign(7, &to, data, 120_000, tip, feeCap)
	if err != nil {
		t.Fatal(err)
	}
	if tx.Type() != types.DynamicFeeTxType || tx.ChainId().Uint64() != 84532 || tx.Nonce() != 7 || *tx.To() != to ||
		!bytes.Equal(tx.Data(), data) || tx.Gas() != 120_000 || tx.GasTipCap().Cmp(tip) != 0 || tx.GasFeeCap().Cmp(feeCap) != 0 || tx.Value().Sign() != 0 {
		t.Fatalf("signed %+v", tx)
	}
	from, err := types.Sender(types.LatestSignerForChainID(big.NewInt(84532)), tx)
	if err != nil || from != s.Address() {
		t.Fatalf("sender %s (%v), want %s", from, err, s.Address())
	}

	again, err := s.Sign(7, &to, data, 120_000, tip, feeCap)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := tx.MarshalBinary()
	b, _ := again.MarshalBinary()
	if !bytes.Equal(a, b) {
		t.Fatal("the same inputs signed different bytes")
	}
	// The transaction keeps its own copy of the fees: a caller that raises them afterwards (one
	// wei more, for new bytes) does not change what was signed.
	tip.Add(tip, big.NewInt(1))
	if tx.GasTipCap().Cmp(big.NewInt(1_000_000_000)) != 0 {
		t.Fatal("the signed transaction follows the caller's fee value")
	}

	deploy, err := s.Sign(8, nil, []byte{0x60, 0x00}, 100_000, tip, feeCap)
	if err != nil || deploy.To() != nil {
		t.Fatalf("a deployment: to %v, err %v", deploy.To(), err)
	}
	if other, _ := ethrpc.NewSigner(1, key).Sign(7, &to, data, 120_000, big.NewInt(1_000_000_000), feeCap); other.Hash() == tx.Hash() {
		t.Fatal("another chain signed the same transaction")
	}
}
