package settle_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBatchForeignNonceResigned: a transaction from the signer's key that is not ours (the key
// used elsewhere) takes a batch's nonce before the batch is mined, and one member's authorization
// is used by a third party meanwhile. Once that is final, the members still valid are signed
// again as ONE new batch at the next nonce (recorded before it is sent: slots 0..1 at the new
// nonce, one new transaction), and mined; the member used elsewhere is settled_elsewhere and stays
// at the old nonce, where it took the old batch's transactions as slot 0. Every payee is paid
// exactly once, each member's authorization is used once, and exactly one caller is told success
// for each of the moved members.
func TestBatchForeignNonceResigned(t *testing.T) {
	const n = 3
	const usedElsewhere = 1
	r := quickBatchEngine(t, n)
	ctx := context.Background()
	signer := r.Signers[0]
	addr := stacktest.AddressOf(signer)
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(400_000 + i) }, nil)
	batchTx := settlePendingBatch(t, r, bodies)
	old, _, err := env.Chain.Client.TransactionByHash(ctx, batchTx)
	if err != nil {
		t.Fatal(err)
	}
	// The key used elsewhere: a self-transfer at the batch's nonce replaces the batch in the pool
	// (the engine resends it meanwhile), beside a third party's use of one member's authorization.
	foreign := replaceNonce(t, signer, old.Nonce(), facilitator.TxRecord{TipCap: old.GasTipCap(), FeeCap: old.GasFeeCap()}, batchTx)
	elsewhere := pays[usedElsewhere].SendElsewhere(t)
	env.Mine(t)
	for _, h := range []common.Hash{foreign, elsewhere} {
		if rc := env.Receipt(t, h); rc == nil || rc.Status != 1 {
			t.Fatalf("%s: %+v, want mined", h, rc)
		}
	}
	env.SetAutomine(t, true)
	waitMembers(t, pays, 40*time.Second, "the batch's members are decided", func(i int, s *facilitator.Settlement) bool {
		return (i == usedElsewhere && s.State == facilitator.StateSettledElsewhere) || (i != usedElsewhere && s.State.Succeeded())
	})

	var newTx common.Hash
	slots := map[int]bool{}
	for i, p := range pays {
		s := env.Row(t, p.Key())
		if got := env.Balance(t, p.PayTo); got != int64(400_000+i) {
			t.Fatalf("payee %d holds %d, want exactly %d", i, got, 400_000+i)
		}
		if uses := authorizationUses(t, p); uses != 1 {
			t.Fatalf("member %d's authorization used %d times", i, uses)
		}
		if i == usedElsewhere {
			if s.TxNonce != old.Nonce() || s.BatchSlot != 0 || s.ErrorReason != facilitator.ReasonNonceAlreadyUsed || s.TxHash != elsewhere {
				t.Fatalf("the member used elsewhere: %+v; want settled_elsewhere by %s, left at nonce %d slot 0", s, elsewhere, old.Nonce())
			}
			continue
		}
		if newTx == (common.Hash{}) {
			newTx = s.TxHash
		}
		if s.TxNonce != old.Nonce()+1 || s.TxHash != newTx || s.TxHash == batchTx || s.ErrorReason != "" {
			t.Fatalf("moved member %d: %+v; want mined by one new batch at nonce %d", i, s, old.Nonce()+1)
		}
		slots[s.BatchSlot] = true
		var renonced bool
		for _, ev := range env.Events(t, s.ID) {
			renonced = renonced || (ev.State == "renonced" && strings.Contains(ev.Detail, newTx.Hex()))
		}
		if !renonced {
			t.Fatalf("member %d's events %v name no move to %s", i, stacktest.States(env.Events(t, s.ID)), newTx)
		}
	}
	if len(slots) != n-1 || !slots[0] || !slots[1] {
		t.Fatalf("the new batch's slots %v, want 0 and 1", slots)
	}
	mined, _, err := env.Chain.Client.TransactionByHash(ctx, newTx)
	if err != nil || *mined.To() != multicall3.Address {
		t.Fatalf("the new batch %v (%v)", mined, err)
	}
	if calls, ok := multicall3.DecodeAggregate3Calldata(mined.Data()); !ok || len(calls) != n-1 {
		t.Fatalf("the new batch holds %d calls (%v), want %d", len(calls), ok, n-1)
	}
	if rc := env.Receipt(t, newTx); rc == nil || rc.Status != 1 {
		t.Fatalf("the new batch's receipt %+v", rc)
	}
	members, err := r.DB.BatchMembers(ctx, env.Network().ID, addr, old.Nonce()+1)
	if err != nil || len(members) != n-1 {
		t.Fatalf("the new batch's members %d (%v), want %d", len(members), err, n-1)
	}
	left, err := r.DB.BatchMembers(ctx, env.Network().ID, addr, old.Nonce())
	if err != nil || len(left) != 1 || left[0].Key != pays[usedElsewhere].Key() {
		t.Fatalf("left at the old nonce: %+v (%v)", left, err)
	}
	// The old batch's transaction is still recorded, now under the member left behind.
	if s, err := r.DB.SettlementByTx(ctx, batchTx); err != nil || s.Key != pays[usedElsewhere].Key() {
		t.Fatalf("the old batch's transaction belongs to %+v (%v)", s, err)
	}
	if got := nonceOf(t, addr, "latest"); got != old.Nonce()+2 {
		t.Fatalf("the key's nonce is %d, want %d (the foreign transaction and one new batch)", got, old.Nonce()+2)
	}
	// Exactly one success per moved member: the callers were told pending; the next identical
	// request gets the success, a later one already_settled.
	for i, b := range bodies {
		first := r.MustSettle(t, b)
		again := r.MustSettle(t, b)
		switch {
		case i == usedElsewhere && (first.Response.Success || again.Response.Success):
			t.Fatalf("the member used elsewhere was told success: %+v / %+v", first.Response, again.Response)
		case i != usedElsewhere && (!first.Response.Success || first.Response.Transaction != newTx.Hex() ||
			again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled):
			t.Fatalf("member %d: %+v then %+v; want one success with %s, then already_settled", i, first.Response, again.Response, newTx)
		}
	}
}
