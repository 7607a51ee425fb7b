package postgres_test

import (
	"crypto/rand"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// batchRows are n new settlements of random authorizations sharing one transaction at txNonce,
// in slots 0..n-1.
func (l *ledgerFixture) batchRows(n int, txNonce uint64, tx facilitator.TxRecord) []*facilitator.NewSettlement {
	rows := make([]*facilitator.NewSettlement, n)
	for i := range rows {
		var nonce [32]byte
		rand.Read(nonce[:])
		rows[i] = &facilitator.NewSettlement{
			Key:   facilitator.AuthorizationKey{Network: l.network, Asset: common.HexToAddress("0xa"), Payer: common.HexToAddress("0xb"), Nonce: nonce},
			PayTo: common.HexToAddress("0xc"), Value: big.NewInt(1), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1 << 40),
			X402Version: 2, Request: []byte(`{}`), Signer: l.signer, TxNonce: txNonce, BatchSlot: i, Tx: tx,
		}
	}
	return rows
}

// TestBatchLedger: a batch's members are written in one statement batch with slots 0..n-1 and
// the transaction once, under slot 0; every member reads the batch's transaction (open, by key,
// by nonce); the transaction names slot 0; a lone settlement or another batch at the nonce is
// refused as nonce taken and writes nothing; a bump recorded on slot 0 is every member's.
func TestBatchLedger(t *testing.T) {
	l := newLedgerFixture(t, 30*time.Second)
	tx := txRecord()
	rows := l.batchRows(3, 7, tx)
	ids, err := l.db.InsertSettlements(l.ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		s, err := l.db.SettlementByID(l.ctx, id)
		if err != nil || s.BatchSlot != i || s.TxNonce != 7 || s.TxHash != tx.Hash {
			t.Fatalf("member %d: %+v, %v", i, s, err)
		}
	}
	if s, err := l.db.SettlementByTx(l.ctx, tx.Hash); err != nil || s.ID != ids[0] {
		t.Fatalf("by transaction: %+v, %v; want slot 0 (%d)", s, err, ids[0])
	}
	members, err := l.db.BatchMembers(l.ctx, l.network, l.signer, 7)
	if err != nil || len(members) != 3 || members[2].ID != ids[2] {
		t.Fatalf("members: %+v, %v", members, err)
	}
	// Invariant 7 on the slot: a lone row at the nonce (slot 0), and another batch, collide.
	if _, err := l.db.InsertSettlement(l.ctx, l.batchRows(1, 7, txRecord())[0]); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("a lone settlement at a batch's nonce: %v, want ErrNonceTaken", err)
	}
	if _, err := l.db.InsertSettlements(l.ctx, l.batchRows(2, 7, txRecord())); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("a second batch at the nonce: %v, want ErrNonceTaken", err)
	}
	if members, _ := l.db.BatchMembers(l.ctx, l.network, l.signer, 7); len(members) != 3 {
		t.Fatalf("the refused writes left %d members", len(members))
	}
	bump := txRecord()
	if err := l.db.AddTx(l.ctx, ids[0], bump); err != nil {
		t.Fatal(err)
	}
	open, err := l.db.OpenSettlements(l.ctx, l.network, l.signer)
	if err != nil || len(open) != 3 {
		t.Fatalf("open: %d, %v", len(open), err)
	}
	for i, o := range open {
		if o.BatchSlot != i || len(o.Txs) != 2 || o.Txs[0].Hash != tx.Hash || o.Txs[1].Hash != bump.Hash || o.TxHash != bump.Hash {
			t.Fatalf("open member %d: slot %d, txs %+v, hash %s", i, o.BatchSlot, o.Txs, o.TxHash)
		}
	}
	held, err := l.db.NoncesHeld(l.ctx, l.network, l.signer, 0)
	if err != nil || len(held) != 3 || held[0] != 7 {
		t.Fatalf("nonces held %v, %v", held, err)
	}
}
