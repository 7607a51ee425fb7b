package postgres_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestAttachDelivery: a delivery record is kept once per settlement, by the key that made it; the
// same record again answers the one kept, a different one is refused and changes nothing; a
// settlement not mined, or of another key, takes none; a batch's member is named by its
// authorization, and the record is its own.
func TestAttachDelivery(t *testing.T) {
	l := newLedgerFixture(t, 30*time.Second)
	db, ctx := l.db, l.ctx
	size := int64(17)
	rec := func(body string) facilitator.DeliveryRecord {
		return facilitator.DeliveryRecord{SHA256: facilitator.DigestHex(sha256.Sum256([]byte(body))), ContentType: "application/json", Size: &size}
	}
	reason := func(err error) string { return facilitator.ErrorReason(err, "") }
	mine := func(id int64, tx common.Hash) {
		t.Helper()
		if _, _, err := db.Resolve(ctx, []facilitator.Resolution{{ID: id, State: facilitator.StateMined, TxHash: tx, BlockNumber: 5, BlockHash: common.HexToHash("0x5")}}); err != nil {
			t.Fatal(err)
		}
	}

	id, tx := l.insertFor(t, 1, "shopa00000aa")
	attach := func(keyID string, r facilitator.DeliveryRecord, key *facilitator.AuthorizationKey) (facilitator.DeliveryCandidate, facilitator.DeliveryRecord, bool, error) {
		return db.AttachDelivery(ctx, facilitator.DeliveryAttachment{Tx: tx.Hash, Authorization: key, KeyID: keyID, Record: r})
	}
	if _, _, _, err := attach("shopa00000aa", rec("a"), nil); reason(err) != facilitator.ReasonSettlementPending {
		t.Fatalf("before it is mined: %v, want settlement_pending", err)
	}
	mine(id, tx.Hash)
	if _, _, _, err := attach("shopb00000bb", rec("a"), nil); reason(err) != facilitator.ReasonNotSettlingKey {
		t.Fatalf("another key: %v, want not_settling_key", err)
	}
	target, kept, created, err := attach("shopa00000aa", rec("a"), nil)
	if err != nil || !created || target.ID != id || !kept.Same(rec("a")) || kept.RecordedAt.IsZero() {
		t.Fatalf("the settling key: %+v, %+v, created %v, %v", target, kept, created, err)
	}
	again, kept2, created, err := attach("shopa00000aa", rec("a"), nil)
	if err != nil || created || again.ID != id || !kept2.RecordedAt.Equal(kept.RecordedAt) {
		t.Fatalf("the same record again: %+v, created %v, %v; want the one kept at %s", kept2, created, err, kept.RecordedAt)
	}
	if _, _, _, err := attach("shopa00000aa", rec("b"), nil); reason(err) != facilitator.ReasonDeliveryConflict || facilitator.ErrorCode(err) != facilitator.EConflict {
		t.Fatalf("a different record: %v, want delivery_conflict", err)
	}
	noSize := rec("a")
	noSize.Size = nil
	if _, _, _, err := attach("shopa00000aa", noSize, nil); reason(err) != facilitator.ReasonDeliveryConflict {
		t.Fatalf("the same digest without its size: %v, want delivery_conflict", err)
	}
	if got, err := db.DeliveryRecord(ctx, id); err != nil || got == nil || !got.Same(rec("a")) {
		t.Fatalf("kept: %+v, %v; want the first record", got, err)
	}
	var unknown common.Hash
	unknown[0] = 1
	if _, _, _, err := db.AttachDelivery(ctx, facilitator.DeliveryAttachment{Tx: unknown, Record: rec("a")}); reason(err) != facilitator.ReasonNotFound {
		t.Fatalf("an unknown transaction: %v, want not_found", err)
	}

	// A batch: three members under one transaction, two of them this key's.
	btx := txRecord()
	rows := l.batchRows(3, 2, btx)
	rows[0].KeyID, rows[1].KeyID, rows[2].KeyID = "shopa00000aa", "shopa00000aa", "shopb00000bb"
	ids, err := db.InsertSettlements(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		mine(id, btx.Hash)
	}
	battach := func(keyID string, key *facilitator.AuthorizationKey) (facilitator.DeliveryCandidate, bool, error) {
		target, _, created, err := db.AttachDelivery(ctx, facilitator.DeliveryAttachment{Tx: btx.Hash, Authorization: key, KeyID: keyID, Record: rec("member")})
		return target, created, err
	}
	if _, _, err := battach("shopa00000aa", nil); reason(err) != facilitator.ReasonInvalidDelivery {
		t.Fatalf("a batch without an authorization: %v, want invalid_delivery", err)
	}
	if target, created, err := battach("shopa00000aa", &rows[1].Key); err != nil || !created || target.ID != ids[1] {
		t.Fatalf("member 1 by its authorization: %+v, %v, %v", target, created, err)
	}
	if _, _, err := battach("shopa00000aa", &rows[2].Key); reason(err) != facilitator.ReasonNotSettlingKey {
		t.Fatalf("another merchant's member: %v, want not_settling_key", err)
	}
	for i, want := range []bool{false, true, false} {
		if got, err := db.DeliveryRecord(ctx, ids[i]); err != nil || (got != nil) != want {
			t.Errorf("member %d's record: %+v, %v; want one: %v", i, got, err, want)
		}
	}
}
