package settle_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBatchNarrowSigner: with the key behind the narrow signer (the engine holds only its
// address), a batching network settles concurrent payments as ONE Multicall3 transaction the
// narrow signer signed, within its per-settlement gas ceiling: every member succeeds with that
// transaction, every payee is paid exactly once, and the key sent exactly one transaction.
func TestBatchNarrowSigner(t *testing.T) {
	const n = 3
	ctx := context.Background()
	key := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(key.PublicKey)
	// 150,000 per settlement: a lone one needs about 120,000 with its margin, a batch of three
	// about 340,000, under its ceiling of 450,000.
	signers := env.NarrowSigner(t, extsigner.Policy{MaxGas: 150_000, MaxFeeCap: big.NewInt(1e12)}, key)
	r := batchEngine(t, n, 2*time.Second, stacktest.EngineOptions{Remote: signers})
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(300_000 + i) }, nil)
	outs := settleAll(t, r, bodies)
	tx := outs[0].Response.Transaction
	for i, out := range outs {
		if !out.Response.Success || out.Response.Transaction != tx {
			t.Fatalf("member %d: %+v, want success with the batch's transaction %s", i, out.Response, tx)
		}
		if got := env.Balance(t, pays[i].PayTo); got != int64(300_000+i) {
			t.Fatalf("payee %d holds %d, want %d", i, got, 300_000+i)
		}
		if row := env.Row(t, pays[i].Key()); !row.State.Succeeded() || row.Signer != addr || row.TxHash.Hex() != tx {
			t.Fatalf("member %d's row %+v", i, row)
		}
	}
	mined, _, err := env.Chain.Client.TransactionByHash(ctx, common.HexToHash(tx))
	if err != nil || mined.To() == nil || *mined.To() != multicall3.Address || mined.Gas() > 3*150_000 {
		t.Fatalf("the batch's transaction %v (%v): want a call of Multicall3 within the signer's ceiling", mined, err)
	}
	if calls, ok := multicall3.DecodeAggregate3Calldata(mined.Data()); !ok || len(calls) != n {
		t.Fatalf("the batch holds %d calls (%v), want %d", len(calls), ok, n)
	}
	if rc := env.Receipt(t, mined.Hash()); rc == nil || rc.Status != 1 {
		t.Fatalf("receipt %+v", rc)
	}
	if got := nonceOf(t, addr, "latest"); got != 1 {
		t.Fatalf("the key sent %d transactions, want 1", got)
	}
}

// TestBatchNarrowSignerResignsSubset: a batch of four signed by the narrow signer (150,000 gas per
// settlement) loses its nonce to a foreign transaction of its key while three of its members'
// authorizations are used elsewhere. The last member is re-signed alone as a new batch with a gas
// limit for its one call (the old batch's, sized for four, is more than the narrow signer signs
// for one), which the narrow signer signs: it is mined, its payee is paid exactly once, and its
// caller is told success once, with the new transaction. Recovered: the engine that signed the
// batch stops before the re-sign, and the next one, which knows the members only from the ledger
// (no estimates of their own), sizes the new batch from the old one's limit.
func TestBatchNarrowSignerResignsSubset(t *testing.T) {
	t.Run("live", func(t *testing.T) { testBatchNarrowSignerResignsSubset(t, false) })
	t.Run("recovered", func(t *testing.T) { testBatchNarrowSignerResignsSubset(t, true) })
}

func testBatchNarrowSignerResignsSubset(t *testing.T, restart bool) {
	const n = 4
	const moved = n - 1 // the member re-signed; the others are used elsewhere
	const ceiling = 150_000
	ctx := context.Background()
	key := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(key.PublicKey)
	signers := env.NarrowSigner(t, extsigner.Policy{MaxGas: ceiling, MaxFeeCap: big.NewInt(1e12)}, key)
	engine := func() *stacktest.Engine { return quickBatchEngineOf(t, n, stacktest.EngineOptions{Remote: signers}) }
	r := engine()
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(500_000 + i) }, nil)
	batchTx := settlePendingBatch(t, r, bodies)
	if restart {
		r.Stop(ctx)
		r = engine()
	}
	old, _, err := env.Chain.Client.TransactionByHash(ctx, batchTx)
	if err != nil {
		t.Fatal(err)
	}
	if old.Gas() <= ceiling {
		t.Fatalf("the batch of %d has gas %d: the test needs more than one settlement's ceiling %d", n, old.Gas(), ceiling)
	}
	foreign := replaceNonce(t, key, old.Nonce(), facilitator.TxRecord{TipCap: old.GasTipCap(), FeeCap: old.GasFeeCap()}, batchTx)
	elsewhere := []common.Hash{foreign}
	for i := range moved {
		elsewhere = append(elsewhere, pays[i].SendElsewhere(t))
	}
	env.Mine(t)
	for _, h := range elsewhere {
		if rc := env.Receipt(t, h); rc == nil || rc.Status != 1 {
			t.Fatalf("%s: %+v, want mined", h, rc)
		}
	}
	env.SetAutomine(t, true)
	waitMembers(t, pays, 40*time.Second, "the batch's members are decided", func(i int, s *facilitator.Settlement) bool {
		return (i != moved && s.State == facilitator.StateSettledElsewhere) || (i == moved && s.State.Succeeded())
	})

	for i, p := range pays {
		if got := env.Balance(t, p.PayTo); got != int64(500_000+i) {
			t.Fatalf("payee %d holds %d, want exactly %d", i, got, 500_000+i)
		}
		if uses := authorizationUses(t, p); uses != 1 {
			t.Fatalf("member %d's authorization used %d times", i, uses)
		}
	}
	row := env.Row(t, pays[moved].Key())
	newTx := row.TxHash
	if row.TxNonce != old.Nonce()+1 || newTx == batchTx || row.BatchSlot != 0 || row.Signer != addr {
		t.Fatalf("the moved member: %+v; want mined by a new batch at nonce %d", row, old.Nonce()+1)
	}
	mined, _, err := env.Chain.Client.TransactionByHash(ctx, newTx)
	if err != nil || mined.To() == nil || *mined.To() != multicall3.Address || mined.Gas() > ceiling {
		t.Fatalf("the new batch %v (%v): want a call of Multicall3 within one settlement's ceiling %d", mined, err, ceiling)
	}
	if calls, ok := multicall3.DecodeAggregate3Calldata(mined.Data()); !ok || len(calls) != 1 {
		t.Fatalf("the new batch holds %d calls (%v), want 1", len(calls), ok)
	}
	if rc := env.Receipt(t, newTx); rc == nil || rc.Status != 1 {
		t.Fatalf("the new batch's receipt %+v", rc)
	}
	if got := nonceOf(t, addr, "latest"); got != old.Nonce()+2 {
		t.Fatalf("the key's nonce is %d, want %d (the foreign transaction and one new batch)", got, old.Nonce()+2)
	}
	first := r.MustSettle(t, bodies[moved])
	again := r.MustSettle(t, bodies[moved])
	if !first.Response.Success || first.Response.Transaction != newTx.Hex() || again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled {
		t.Fatalf("the moved member: %+v then %+v; want one success with %s, then already_settled", first.Response, again.Response, newTx)
	}
}
