package settle_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBatchDeliveryRecord: a merchant's record of what it delivered, on a real batch (three
// payments in one Multicall3 transaction, on anvil and Postgres): the batch's transaction alone
// does not say which payment it is for (invalid_delivery); named by its authorization, the
// member carries it on its own status and no other member does; a key that did not make the
// settlement (these were made without one) cannot set it.
func TestBatchDeliveryRecord(t *testing.T) {
	const n = 3
	r := batchEngine(t, n, 2*time.Second, stacktest.EngineOptions{})
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(200_000 + i) }, nil)
	outs := settleAll(t, r, bodies)
	tx := common.HexToHash(outs[0].Response.Transaction)
	for i, out := range outs {
		if !out.Response.Success || common.HexToHash(out.Response.Transaction) != tx {
			t.Fatalf("member %d: %+v, want success with the batch's transaction %s", i, out.Response, tx.Hex())
		}
	}
	size := int64(5)
	rec := facilitator.DeliveryRecord{SHA256: facilitator.DigestHex(sha256.Sum256([]byte("hello"))), ContentType: "text/plain", Size: &size}
	attach := func(key *facilitator.AuthorizationKey, keyID string) (facilitator.DeliveryCandidate, error) {
		target, _, _, err := r.DB.AttachDelivery(ctx, facilitator.DeliveryAttachment{Tx: tx, Authorization: key, KeyID: keyID, Record: rec})
		return target, err
	}
	if _, err := attach(nil, ""); facilitator.ErrorReason(err, "") != facilitator.ReasonInvalidDelivery {
		t.Fatalf("the batch's transaction alone: %v, want invalid_delivery", err)
	}
	k1 := pays[1].Key()
	if _, err := attach(&k1, "shop00000001"); facilitator.ErrorReason(err, "") != facilitator.ReasonNotSettlingKey {
		t.Fatalf("a key that did not settle it: %v, want not_settling_key", err)
	}
	target, err := attach(&k1, "")
	if err != nil || target.Key != k1 {
		t.Fatalf("member 1 by its authorization: %+v, %v", target, err)
	}
	svc := env.Status(r.DB, 2)
	for i, p := range pays {
		st, found, err := svc.Authorization(ctx, p.Key())
		if err != nil || !found || st.State != facilitator.StatusSettled {
			t.Fatalf("member %d: %+v, %v, %v", i, st, found, err)
		}
		if want := i == 1; (st.Delivery != nil) != want || (want && !st.Delivery.Same(rec)) {
			t.Errorf("member %d's status carries %+v; want a record: %v", i, st.Delivery, want)
		}
	}
	// By the batch's transaction: the answer is its first member's, with that member's record only.
	byTx, err := svc.Settlement(ctx, tx)
	if err != nil || len(byTx.Batch) != n {
		t.Fatalf("by the batch's transaction: %+v, %v", byTx, err)
	}
	if want := byTx.Nonce == hexutil.Encode(k1.Nonce[:]); (byTx.Delivery != nil) != want {
		t.Errorf("the batch's answer (member %s) carries %+v; want member 1's record only on member 1", byTx.Nonce, byTx.Delivery)
	}
}
