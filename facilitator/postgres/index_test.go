package postgres_test

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestAuthorizationUsePairsItsOwnTransfer: one transaction uses two authorizations of one payer
// (a batch, or a contract of the payer's own), each followed by the Transfer it made. Each use is
// answered with its own transfer, the log right after its AuthorizationUsed, never the payer's
// first transfer in the transaction: otherwise a payer bundling a dummy payment before a real one
// shows the dummy as paid to the real one's merchant, with its amount.
func TestAuthorizationUsePairsItsOwnTransfer(t *testing.T) {
	db := openTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	network := fmt.Sprintf("eip155:%d", 2_000_000_000+time.Now().UnixNano()%1_000_000_000)
	if err := db.BindNetwork(ctx, network, 31337, common.HexToHash("0x03")); err != nil {
		t.Fatal(err)
	}
	_, release, err := db.Lead(ctx, network)
	if err != nil {
		t.Fatal(err)
	}
	defer release()

	token := common.HexToAddress("0x00000000000000000000000000000000000000a1")
	payer := common.HexToAddress("0x00000000000000000000000000000000000000b2")
	merchant := common.HexToAddress("0x00000000000000000000000000000000000000c3")
	dummy := common.HexToAddress("0x00000000000000000000000000000000000000d4")
	real, fake := [32]byte{1}, [32]byte{2}
	block := facilitator.Block{Number: 7, Hash: common.HexToHash("0x07"), ParentHash: common.HexToHash("0x06")}
	tx := common.HexToHash("0xabc")
	at := func(i uint) facilitator.LogPosition {
		return facilitator.LogPosition{BlockNumber: block.Number, BlockHash: block.Hash, TxHash: tx, LogIndex: i, Token: token}
	}
	// The dummy first (1,000,000 to an address of the payer's), then the real payment (1 to the
	// merchant): each AuthorizationUsed is followed by its Transfer, as FiatToken emits them.
	batch := facilitator.IndexBatch{
		Events: facilitator.Events{
			Auths: []facilitator.AuthorizationEvent{
				{LogPosition: at(3), Authorizer: payer, Nonce: fake},
				{LogPosition: at(5), Authorizer: payer, Nonce: real},
			},
			Transfers: []facilitator.Transfer{
				{LogPosition: at(4), From: payer, To: dummy, Value: big.NewInt(1_000_000)},
				{LogPosition: at(6), From: payer, To: merchant, Value: big.NewInt(1)},
			},
		},
		Blocks: []facilitator.Block{block},
		Cursor: block,
	}
	if err := db.Commit(ctx, network, batch); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		nonce [32]byte
		to    common.Address
		value int64
	}{{fake, dummy, 1_000_000}, {real, merchant, 1}} {
		u, err := db.AuthorizationUse(ctx, network, token, payer, c.nonce)
		if err != nil || u == nil {
			t.Fatalf("nonce %x: %v, %v", c.nonce[:1], u, err)
		}
		if u.To != c.to || u.Value == nil || u.Value.Int64() != c.value {
			t.Errorf("nonce %x: answered a transfer of %v to %s, want %d to %s", c.nonce[:1], u.Value, u.To, c.value, c.to)
		}
	}

	// A use whose next log is not a transfer from the payer (its call made none) names no transfer.
	lone := [32]byte{3}
	tx2 := common.HexToHash("0xdef")
	next := facilitator.Block{Number: 8, Hash: common.HexToHash("0x08"), ParentHash: block.Hash}
	pos := func(i uint) facilitator.LogPosition {
		return facilitator.LogPosition{BlockNumber: next.Number, BlockHash: next.Hash, TxHash: tx2, LogIndex: i, Token: token}
	}
	if err := db.Commit(ctx, network, facilitator.IndexBatch{
		Events: facilitator.Events{
			Auths:     []facilitator.AuthorizationEvent{{LogPosition: pos(0), Authorizer: payer, Nonce: lone}},
			Transfers: []facilitator.Transfer{{LogPosition: pos(2), From: payer, To: merchant, Value: big.NewInt(5)}},
		},
		Blocks: []facilitator.Block{next}, Cursor: next,
	}); err != nil {
		t.Fatal(err)
	}
	u, err := db.AuthorizationUse(ctx, network, token, payer, lone)
	if err != nil || u == nil {
		t.Fatalf("lone use: %v, %v", u, err)
	}
	if u.To != (common.Address{}) || u.Value != nil {
		t.Errorf("a use followed by no transfer of its own was answered a transfer of %v to %s", u.Value, u.To)
	}
}
