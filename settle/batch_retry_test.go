package settle_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBatchSunkByGreedyPayer: a batch of 8 whose first call's payer has, by the time the batch
// is mined, code whose isValidSignature burns the gas it is given (an EOA when verified, as one
// that delegates with EIP-7702 meanwhile is): the token's check of it sinks the batch. The 7
// honest members are not failed: each is settled again alone, paid exactly once and answered
// success; the greedy payer's payment, settled again alone once, fails on its own, and nothing of
// its moves.
func TestBatchSunkByGreedyPayer(t *testing.T) {
	const n = 8
	r := quickBatchEngine(t, n)
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(300_000 + i) }, nil)
	batchTx := settlePendingBatch(t, r, bodies)
	// The greedy payer is the batch's first call's (slot 0): its call leaves too little gas for
	// any call after it.
	g := -1
	for i, p := range pays {
		if env.Row(t, p.Key()).BatchSlot == 0 {
			g = i
		}
	}
	greedy := pays[g].From()
	greedyBefore := env.Balance(t, greedy)
	if err := env.Chain.SetGreedyCode(ctx, greedy); err != nil {
		t.Fatal(err)
	}
	env.SetAutomine(t, true)
	env.Mine(t)
	rc, err := env.Chain.Client.TransactionReceipt(ctx, batchTx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the batch: status %d, %d gas used", rc.Status, rc.GasUsed)
	waitMembers(t, pays, 60*time.Second, "every member is decided", decided)
	signer := stacktest.AddressOf(r.Signers[0])
	lone := 0
	for i, p := range pays {
		s := env.Row(t, p.Key())
		if i == g {
			if s.State != facilitator.StateReverted || s.ErrorReason != facilitator.ReasonTransactionFailed || s.TxHash == batchTx {
				t.Fatalf("the greedy payer's settlement: %+v, want reverted alone (%s), not by the batch", s, facilitator.ReasonTransactionFailed)
			}
			continue
		}
		if !s.State.Succeeded() || s.ErrorReason != "" {
			t.Fatalf("honest member %d: %+v, want mined", i, s)
		}
		if s.TxHash != batchTx {
			lone++
			if tx, _, err := env.Chain.Client.TransactionByHash(ctx, s.TxHash); err != nil || tx.To() == nil || *tx.To() != p.Key().Asset {
				t.Fatalf("honest member %d settled again by %v (%v), want a lone call of the token", i, tx, err)
			}
		}
		if got := env.Balance(t, p.PayTo); got != int64(300_000+i) {
			t.Fatalf("payee %d holds %d, want exactly %d", i, got, 300_000+i)
		}
		if out := r.MustSettle(t, bodies[i]); !out.Response.Success || out.Response.Transaction != s.TxHash.Hex() {
			t.Fatalf("honest member %d answered %+v, want success with %s", i, out.Response, s.TxHash)
		}
	}
	if env.Balance(t, pays[g].PayTo) != 0 || env.Balance(t, greedy) != greedyBefore {
		t.Fatal("the greedy payer's payment moved money")
	}
	if out := r.MustSettle(t, bodies[g]); out.Response.Success || out.Response.ErrorReason != facilitator.ReasonTransactionFailed {
		t.Fatalf("the greedy payer's answer: %+v", out.Response)
	}
	// One batch, then each member settled again at most once, alone: the greedy payer's and each
	// honest member's the batch did not pay.
	if lone != n-1 {
		t.Fatalf("%d honest members settled again alone, want all %d (the batch paid none of them)", lone, n-1)
	}
	if nonce := nonceOf(t, signer, "latest"); nonce != uint64(2+lone) {
		t.Fatalf("the signer sent %d transactions, want the batch and %d lone ones", nonce, 1+lone)
	}
}

// TestBatchMemberShortOfFunds: a payer with funds for one of its two payments in one batch: the
// batch pays the first; the second's call reverts inside the batch, and that is the payment's own
// failure (its payer's balance is short at the batch's block): it is answered batch_call_failed,
// with the batch's transaction, as before, and never settled again.
func TestBatchMemberShortOfFunds(t *testing.T) {
	const n = 3
	r := quickBatchEngine(t, n)
	payer := env.FundedPayer(t, 400_000)
	pays := []stacktest.Pay{env.NewPay(t, payer, 400_000), env.NewPay(t, payer, 400_000), env.NewPay(t, env.FundedPayer(t, 1_000_000), 400_000)}
	bodies := make([][]byte, n)
	for i := range pays {
		bodies[i] = pays[i].Body(t)
	}
	batchTx := settlePendingBatch(t, r, bodies)
	env.SetAutomine(t, true)
	env.Mine(t)
	waitMembers(t, pays, 30*time.Second, "every member is decided", decided)
	var short []int
	for i, p := range pays {
		s := env.Row(t, p.Key())
		if s.TxHash != batchTx {
			t.Fatalf("member %d: %+v, want decided by the batch %s alone", i, s, batchTx)
		}
		if !s.State.Succeeded() {
			if s.State != facilitator.StateReverted || s.ErrorReason != facilitator.ReasonBatchCallFailed || !strings.Contains(s.ErrorMessage, "balance") {
				t.Fatalf("member %d: %+v, want reverted / %s, the message naming the balance", i, s, facilitator.ReasonBatchCallFailed)
			}
			short = append(short, i)
		}
	}
	if len(short) != 1 || short[0] == 2 {
		t.Fatalf("members short of funds %v, want one of the shared payer's two", short)
	}
	if out := r.MustSettle(t, bodies[short[0]]); out.Response.Success || out.Response.ErrorReason != facilitator.ReasonBatchCallFailed {
		t.Fatalf("the short member's answer: %+v", out.Response)
	}
	if env.Balance(t, stacktest.AddressOf(payer)) != 0 || env.Balance(t, pays[2].PayTo) != 400_000 {
		t.Fatal("balances moved other than once each for the payments that had funds")
	}
	if nonce := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "latest"); nonce != 1 {
		t.Fatalf("the signer sent %d transactions, want only the batch", nonce)
	}
}

// TestBatchWithoutMulticall3: a batching engine on a chain with no code at Multicall3's address
// (serve refuses to start there; here the code is gone after start): the batch is a call to an
// empty account, which succeeds transferring nothing. No member is answered batch_call_failed:
// each is settled again alone, once, paid exactly once and answered success.
func TestBatchWithoutMulticall3(t *testing.T) {
	const n = 5
	ctx := context.Background()
	code, err := env.Chain.Client.CodeAt(ctx, multicall3.Address, nil)
	if err != nil || len(code) == 0 {
		t.Fatalf("Multicall3's code: %d bytes, %v", len(code), err)
	}
	setCode := func(c []byte) {
		if err := env.Chain.RPC.CallContext(ctx, nil, "anvil_setCode", multicall3.Address, hexutil.Bytes(c)); err != nil {
			t.Fatal(err)
		}
	}
	setCode(nil)
	t.Cleanup(func() { setCode(code) })
	r := quickBatchEngine(t, n)
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(500_000 + i) }, nil)
	outs := settleAll(t, r, bodies)
	for i, out := range outs {
		if out.Response.ErrorReason == facilitator.ReasonBatchCallFailed {
			t.Fatalf("member %d answered %+v", i, out.Response)
		}
	}
	waitMembers(t, pays, 30*time.Second, "every member is decided", decided)
	for i, p := range pays {
		s := env.Row(t, p.Key())
		if !s.State.Succeeded() {
			t.Fatalf("member %d: %+v, want mined", i, s)
		}
		if tx, _, err := env.Chain.Client.TransactionByHash(ctx, s.TxHash); err != nil || tx.To() == nil || *tx.To() != p.Key().Asset || tx.Nonce() == 0 {
			t.Fatalf("member %d mined by %v (%v), want a lone call of the token after the batch", i, tx, err)
		}
		if got := env.Balance(t, p.PayTo); got != int64(500_000+i) {
			t.Fatalf("payee %d holds %d, want exactly %d", i, got, 500_000+i)
		}
		// Its caller was told success, or (told pending) is told it now.
		if out := r.MustSettle(t, bodies[i]); !outs[i].Response.Success && !out.Response.Success {
			t.Fatalf("member %d answered %+v, then %+v", i, outs[i].Response, out.Response)
		}
	}
	if nonce := nonceOf(t, stacktest.AddressOf(r.Signers[0]), "latest"); nonce != 1+n {
		t.Fatalf("the signer sent %d transactions, want the batch and %d lone ones", nonce, n)
	}
}

// TestBatchWalletPayerAlone: on a network that batches, a payer whose address holds code (a
// contract wallet; here an EOA delegating to one, as with EIP-7702) is settled alone, never in a
// batch (its code runs inside the token's call and could sink the batch), while the others of the
// same burst share one batch; each is paid once and answered success.
func TestBatchWalletPayerAlone(t *testing.T) {
	const n = 3
	// Batches of three, closed after a second: the three would fill one; the two EOA payers'
	// closes when the first has waited.
	r := batchEngine(t, n, time.Second, stacktest.EngineOptions{})
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(600_000 + i) }, nil)
	if err := env.Chain.SetSmartWalletCode(ctx, pays[0].From()); err != nil {
		t.Fatal(err)
	}
	outs := settleAll(t, r, bodies)
	var batchTx string
	for i, out := range outs {
		if !out.Response.Success {
			t.Fatalf("member %d: %+v, want success", i, out.Response)
		}
		tx, _, err := env.Chain.Client.TransactionByHash(ctx, common.HexToHash(out.Response.Transaction))
		if err != nil || tx.To() == nil {
			t.Fatalf("member %d's transaction: %v, %v", i, tx, err)
		}
		switch {
		case i == 0 && *tx.To() != pays[0].Key().Asset:
			t.Fatalf("the wallet payer's settlement calls %s, want the token alone", tx.To())
		case i > 0 && *tx.To() != multicall3.Address:
			t.Fatalf("member %d's settlement calls %s, want Multicall3", i, tx.To())
		case i > 0 && batchTx != "" && out.Response.Transaction != batchTx:
			t.Fatalf("the EOA payers' settlements are in %s and %s, want one batch", batchTx, out.Response.Transaction)
		}
		if i > 0 {
			batchTx = out.Response.Transaction
		}
		if got := env.Balance(t, pays[i].PayTo); got != int64(600_000+i) {
			t.Fatalf("payee %d holds %d, want exactly %d", i, got, 600_000+i)
		}
	}
}

// TestJudgeLeavesSunkBatchMember: the reconcile job's judgement (settle.Judge) of batch members
// whose batch was sunk, read from the chain alone while no engine works them: it does not answer
// them failed (the engine holding the key settles them again alone), and it judges their receipts
// by their own pair of logs.
func TestJudgeLeavesSunkBatchMember(t *testing.T) {
	const n = 2
	r := quickBatchEngine(t, n)
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(700_000 + i) }, nil)
	batchTx := settlePendingBatch(t, r, bodies)
	for _, p := range pays {
		if env.Row(t, p.Key()).BatchSlot == 0 {
			if err := env.Chain.SetGreedyCode(ctx, p.From()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.Engine.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	env.SetAutomine(t, true)
	for range 3 {
		env.Mine(t)
	}
	if rc, err := env.Chain.Client.TransactionReceipt(ctx, batchTx); err != nil || rc.Status != 0 {
		t.Fatalf("the batch: %+v, %v; want mined and reverted", rc, err)
	}
	open, err := r.DB.OpenSettlements(ctx, env.Network().ID, stacktest.AddressOf(r.Signers[0]))
	if err != nil || len(open) != n {
		t.Fatalf("open settlements: %d, %v", len(open), err)
	}
	batchOn := func(c ethrpc.Chain) func(context.Context, []rpc.BatchElem) error {
		return func(ctx context.Context, elems []rpc.BatchElem) error { return c.BatchCallContext(ctx, elems) }
	}
	for _, s := range open {
		res, ok, err := settle.Judge(ctx, env.Chain.RPC, batchOn, &s, facilitator.Finality{Depth: 1}, nil, nil, time.Now())
		if err != nil || ok {
			t.Fatalf("settlement %d judged %+v (%v, %v), want left to the engine", s.ID, res, ok, err)
		}
	}
}
