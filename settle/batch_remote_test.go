package settle_test

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/extsigner"
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
