package ethrpc

import (
	"encoding/json"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
)

// blockOfReceipts is a block's receipts as a node answers eth_getBlockReceipts: n settlements,
// each with its AuthorizationUsed and Transfer logs and the bloom.
func blockOfReceipts(t testing.TB, n int) []byte {
	t.Helper()
	token := common.HexToAddress("0x036CbD53842c5426634e7929541eC2318f3dCF7e")
	var rs []*types.Receipt
	for i := range n {
		tx := common.BigToHash(big.NewInt(int64(1000 + i)))
		logs := []*types.Log{
			{Address: token, Topics: []common.Hash{{0x98}, {0x01}, {0x02}}, TxHash: tx, Index: uint(2 * i)},
			{Address: token, Topics: []common.Hash{{0xdd}, {0x01}, {0x03}}, Data: common.LeftPadBytes(big.NewInt(10000).Bytes(), 32), TxHash: tx, Index: uint(2*i + 1)},
		}
		r := &types.Receipt{Type: types.DynamicFeeTxType, Status: 1, CumulativeGasUsed: uint64(100000 * (i + 1)), TxHash: tx,
			GasUsed: 102823, EffectiveGasPrice: big.NewInt(1_000_000_007), BlockHash: common.Hash{0xb}, BlockNumber: big.NewInt(77),
			TransactionIndex: uint(i), Logs: logs}
		r.Bloom = types.CreateBloom(r)
		rs = append(rs, r)
	}
	raw, err := json.Marshal(rs)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// What the engine reads of a receipt decodes as go-ethereum's full decoding has it.
func TestReceiptDecodes(t *testing.T) {
	raw := blockOfReceipts(t, 3)
	var full []*types.Receipt
	var mini []*Receipt
	if err := json.Unmarshal(raw, &full); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &mini); err != nil {
		t.Fatal(err)
	}
	if len(mini) != len(full) {
		t.Fatalf("%d receipts, want %d", len(mini), len(full))
	}
	for i, f := range full {
		m := mini[i]
		if m.TxHash != f.TxHash || m.Succeeded() != (f.Status == types.ReceiptStatusSuccessful) || m.BlockNumber == nil ||
			uint64(*m.BlockNumber) != f.BlockNumber.Uint64() || m.BlockHash != f.BlockHash || uint64(m.TxIndex) != uint64(f.TransactionIndex) ||
			uint64(m.GasUsed) != f.GasUsed || m.EffectiveGasPrice.ToInt().Cmp(f.EffectiveGasPrice) != 0 {
			t.Fatalf("receipt %d: %+v, want %+v", i, m, f)
		}
		if len(m.Logs) != len(f.Logs) {
			t.Fatalf("receipt %d: %d logs, want %d", i, len(m.Logs), len(f.Logs))
		}
		for j, l := range f.Logs {
			ml := m.Logs[j]
			if ml.Address != l.Address || len(ml.Topics) != len(l.Topics) || ml.Topics[2] != l.Topics[2] || string(ml.Data) != string(l.Data) {
				t.Fatalf("receipt %d log %d: %+v, want %+v", i, j, ml, l)
			}
		}
	}
	var none *Receipt
	if err := json.Unmarshal([]byte("null"), &none); err != nil || none != nil {
		t.Fatalf("null receipt: %v %v", none, err)
	}
	reverted := []byte(`{"transactionHash":"` + common.Hash{1}.Hex() + `","status":"0x0","blockNumber":"0x5","blockHash":"` + common.Hash{2}.Hex() + `","logs":[]}`)
	var r *Receipt
	if err := json.Unmarshal(reverted, &r); err != nil || r.Succeeded() {
		t.Fatalf("reverted receipt: %+v %v", r, err)
	}
}

// Decoding a block's receipts (34 settlements, as at the bench's 3.4 per block times ten), full
// and minimal.
func BenchmarkReceiptDecode(b *testing.B) {
	raw := blockOfReceipts(b, 34)
	b.Run("types.Receipt", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			var rs []*types.Receipt
			if err := json.Unmarshal(raw, &rs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ethrpc.Receipt", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			var rs []*Receipt
			if err := json.Unmarshal(raw, &rs); err != nil {
				b.Fatal(err)
			}
		}
	})
}
