package devchain

import (
	"context"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// TestStranded: only a sender whose transaction at its mined nonce sits in "queued" (with nothing
// pending at that nonce) is stranded; a queued transaction behind a gap is not.
func TestStranded(t *testing.T) {
	a, b, c := common.HexToAddress("0xa"), common.HexToAddress("0xb"), common.HexToAddress("0xc")
	pool, err := decodePool([]byte(`{
		"pending": {"` + c.Hex() + `": {"7": {"hash": "0x0101010101010101010101010101010101010101010101010101010101010101"}}},
		"queued": {
			"` + a.Hex() + `": {"5": {"hash": "0x0202020202020202020202020202020202020202020202020202020202020202"}, "6": {"hash": "0x0303030303030303030303030303030303030303030303030303030303030303"}},
			"` + b.Hex() + `": {"9": {"hash": "0x0404040404040404040404040404040404040404040404040404040404040404"}},
			"` + c.Hex() + `": {"7": {"hash": "0x0505050505050505050505050505050505050505050505050505050505050505"}}
		}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := stranded(pool, map[common.Address]uint64{a: 5, b: 8, c: 7})
	if len(got) != 1 || got[a] != 5 {
		t.Fatalf("stranded %v; want only %s at 5 (b waits behind a gap at 8, c's 7 is pending)", got, a)
	}
}

// TestResendPool: on the real anvil, the guard's remedy sends the pool's transactions again,
// the same bytes (eth_getRawTransactionByHash), and they are mined as before.
func TestResendPool(t *testing.T) {
	c := startChain(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.RPC.CallContext(ctx, nil, "anvil_setAutomine", false); err != nil {
		t.Fatal(err)
	}
	from, to := c.Accounts[3], c.Accounts[4].Address
	var hashes []common.Hash
	for range 3 {
		tx, err := c.submit(ctx, from, &to, nil)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, tx.Hash())
	}
	c.resendPool(ctx)
	var st struct {
		Pending hexutil.Uint64 `json:"pending"`
	}
	if err := c.RPC.CallContext(ctx, &st, "txpool_status"); err != nil || st.Pending != 3 {
		t.Fatalf("after the resend: %d pending (%v); want the 3 sent again", st.Pending, err)
	}
	if err := c.Mine(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range hashes {
		var r *struct{}
		if err := ethrpc.One(ctx, c.RPC, ethrpc.TransactionReceipt(h, &r)); err != nil || r == nil {
			t.Fatalf("%s not mined after the resend (%v)", h, err)
		}
	}
}
