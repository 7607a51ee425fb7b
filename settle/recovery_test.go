package settle_test

import (
	"context"
	"crypto/ecdsa"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

func poolSize(t testing.TB) int {
	t.Helper()
	n, err := stacktest.PoolSize(context.Background(), env.Chain)
	if err != nil {
		t.Fatalf("txpool_status: %v", err)
	}
	return n
}

// nonceOf is addr's transaction count at block: "latest", what it had mined; "pending", what it
// has sent, the pool's included.
func nonceOf(t testing.TB, addr common.Address, block string) uint64 {
	t.Helper()
	var n hexutil.Uint64
	if err := env.Chain.RPC.CallContext(context.Background(), &n, "eth_getTransactionCount", addr, block); err != nil {
		t.Fatal(err)
	}
	return uint64(n)
}

// openRows is the ledger's open settlements of a signer, by authorization, as recovery reads them.
func openRows(t testing.TB, signer common.Address) map[facilitator.AuthorizationKey]*facilitator.OpenSettlement {
	t.Helper()
	db, err := postgres.Open(context.Background(), env.DBURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.OpenSettlements(context.Background(), env.Network().ID, signer)
	if err != nil {
		t.Fatal(err)
	}
	out := map[facilitator.AuthorizationKey]*facilitator.OpenSettlement{}
	for i := range rows {
		out[rows[i].Key] = &rows[i]
	}
	return out
}

// latestTx is the hash of the last transaction signed for a settlement: the one (re)sent.
func latestTx(s *facilitator.OpenSettlement) string {
	if len(s.Txs) == 0 {
		return ""
	}
	return s.Txs[len(s.Txs)-1].Hash.Hex()
}

// TestSettleSlowChainPending: a settlement that outlives the deadline is answered
// settlement_pending with its hash (not a failure, not an error); the same payload sent again
// once the block is mined gets the success with that hash, and a third time already_settled.
func TestSettleSlowChainPending(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 2_000_000) // minted while anvil still mines
	p := env.NewPay(t, payer, 1_500_000)
	body := p.Body(t)
	const deadline = 1500 * time.Millisecond
	env.ManualMining(t)
	r := env.NewEngine(t, stacktest.EngineOptions{Deadline: deadline})
	signer := crypto.PubkeyToAddress(r.Signers[0].PublicKey)

	start := time.Now()
	out, err := r.SettleBody(ctx, t, body)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("a slow chain is not an error: %v", err)
	}
	res := out.Response
	if res.Success || res.ErrorReason != facilitator.ReasonSettlementPending || res.Transaction == "" || out.Claimed {
		t.Fatalf("want settlement_pending with a hash, got %+v (claimed %v)", res, out.Claimed)
	}
	if res.Network != env.Network().ID || res.Payer != crypto.PubkeyToAddress(payer.PublicKey).Hex() {
		t.Fatalf("network/payer: %+v", res)
	}
	if took < deadline-100*time.Millisecond || took > deadline+2*time.Second {
		t.Fatalf("answered after %v, want about the %v deadline", took, deadline)
	}
	hash := res.Transaction
	if !env.InPool(t, common.HexToHash(hash)) {
		t.Fatalf("the pending answer's transaction %s is not in the node's pool", hash)
	}
	open := openRows(t, signer)
	if len(open) != 1 || open[p.Key()] == nil || open[p.Key()].Delivered || latestTx(open[p.Key()]) != hash {
		t.Fatalf("ledger while pending: %+v, want one open row with transaction %s", open, hash)
	}
	if row, err := r.DB.SettlementByKey(ctx, p.Key()); err != nil || !row.State.Open() || row.TxHash.Hex() != hash {
		t.Fatalf("ledger row while pending: %+v %v, want open with transaction %s", row, err, hash)
	}
	if got := env.Balance(t, p.PayTo); got != 0 {
		t.Fatalf("payee holds %d before any block", got)
	}

	env.Mine(t)

	// The official resource server's one retry: the same payload, owed the final outcome.
	again := r.MustSettle(t, body)
	if !again.Response.Success || again.Response.Transaction != hash || again.Response.ErrorReason != "" || !again.Claimed {
		t.Fatalf("retry after the block: want success with %s, got %+v (claimed %v)", hash, again.Response, again.Claimed)
	}
	third := r.MustSettle(t, body)
	if third.Response.Success || third.Response.ErrorReason != facilitator.ReasonAlreadySettled || third.Response.Transaction != hash {
		t.Fatalf("third call: want already_settled with %s, got %+v", hash, third.Response)
	}

	if got := env.Balance(t, p.PayTo); got != 1_500_000 {
		t.Fatalf("payee holds %d, want exactly 1500000", got)
	}
	if got := env.Balance(t, crypto.PubkeyToAddress(payer.PublicKey)); got != 500_000 {
		t.Fatalf("payer holds %d, want 500000", got)
	}
	if n := nonceOf(t, signer, "latest"); n != 1 {
		t.Fatalf("signer sent %d transactions, want 1", n)
	}
	row, err := r.DB.SettlementByKey(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	if !row.State.Succeeded() || row.TxHash.Hex() != hash || !row.Delivered || row.BlockNumber == 0 {
		t.Fatalf("ledger row after the block: %+v", row)
	}
}

// TestSettleNonceRecovery: five settlements are pending when their engine stops; a new engine on
// the same key and ledger resumes them (resending the very same signed transactions when the
// node lost them), allocates the next payments nonces after theirs, and everything settles once,
// with the key's nonces used without a gap or a reuse.
func TestSettleNonceRecovery(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop bool
	}{
		{"mempool kept", false},
		{"mempool lost", true},
	} {
		t.Run(tc.name, func(t *testing.T) { testNonceRecovery(t, tc.drop, nil) })
	}
}

// testNonceRecovery runs with the key in the engine, or, with remote, behind the remote signer it
// returns (which outlives the engines, as a signer process outlives a facilitator's restart).
func testNonceRecovery(t *testing.T, dropPool bool, remote func(t *testing.T, key *ecdsa.PrivateKey) []settle.Signer) {
	ctx := context.Background()
	const before, after, value = 5, 3, 10_000
	const deadline = 1500 * time.Millisecond
	pays := make([]stacktest.Pay, before+after)
	bodies := make([][]byte, len(pays))
	for i := range pays {
		pays[i] = env.NewPay(t, env.FundedPayer(t, value), value)
		bodies[i] = pays[i].Body(t)
	}
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	opts := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: deadline}
	if remote != nil {
		opts = stacktest.EngineOptions{Remote: remote(t, signer), Deadline: deadline}
	}
	env.ManualMining(t)

	// settleAll settles bodies[from:to] concurrently through r; every answer must be pending.
	hashes := make([]string, len(pays))
	settleAll := func(r *stacktest.Engine, from, to int) {
		t.Helper()
		outs := make([]facilitator.SettleOutcome, to-from)
		errs := make([]error, to-from)
		var wg sync.WaitGroup
		for i := from; i < to; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i-from], errs[i-from] = r.SettleBody(ctx, t, bodies[i])
			}()
		}
		wg.Wait()
		for i := from; i < to; i++ {
			out, err := outs[i-from], errs[i-from]
			if err != nil {
				t.Fatalf("payment %d: %v", i, err)
			}
			if out.Response.Success || out.Response.ErrorReason != facilitator.ReasonSettlementPending || out.Response.Transaction == "" {
				t.Fatalf("payment %d with mining off: want settlement_pending with a hash, got %+v", i, out.Response)
			}
			hashes[i] = out.Response.Transaction
		}
		seen := map[string]int{}
		for i := range to {
			if j, dup := seen[hashes[i]]; dup {
				t.Fatalf("payments %d and %d share transaction %s", j, i, hashes[i])
			}
			seen[hashes[i]] = i
		}
	}
	// rowNonces checks the ledger rows of payments [from, to) and returns their tx nonces.
	rowNonces := func(from, to int) map[uint64]bool {
		t.Helper()
		out := map[uint64]bool{}
		open := openRows(t, addr)
		for i := from; i < to; i++ {
			row := open[pays[i].Key()]
			if row == nil || row.Signer != addr || len(row.Txs) != 1 || latestTx(row) != hashes[i] {
				t.Fatalf("payment %d: open ledger row %+v, want signer %s, tx %s", i, row, addr, hashes[i])
			}
			if out[row.TxNonce] {
				t.Fatalf("tx nonce %d used twice", row.TxNonce)
			}
			out[row.TxNonce] = true
		}
		return out
	}
	wantNonces := func(got map[uint64]bool, from, to uint64) {
		t.Helper()
		for n := from; n < to; n++ {
			if !got[n] {
				t.Fatalf("tx nonces %v, want exactly %d..%d", got, from, to-1)
			}
		}
		if len(got) != int(to-from) {
			t.Fatalf("tx nonces %v, want exactly %d..%d", got, from, to-1)
		}
	}

	// Engine A: five settlements left pending, then a "restart".
	a := env.NewEngine(t, opts)
	settleAll(a, 0, before)
	wantNonces(rowNonces(0, before), 0, before)
	a.Engine.Stop(context.Background())
	a.Engine.Stop(context.Background()) // Stop is idempotent; the rig's cleanup calls it again too
	for i := range before {
		if !env.InPool(t, common.HexToHash(hashes[i])) {
			t.Fatalf("payment %d: transaction %s is not in the node's pool after stop", i, hashes[i])
		}
	}
	if dropPool {
		if err := env.Chain.RPC.CallContext(ctx, nil, "anvil_dropAllTransactions"); err != nil {
			t.Fatalf("anvil_dropAllTransactions: %v", err)
		}
		if n := poolSize(t); n != 0 {
			t.Fatalf("%d transactions left in the pool after dropping all", n)
		}
		if n := nonceOf(t, addr, "pending"); n != 0 {
			t.Fatalf("the node still counts %d pending nonces for the signer", n)
		}
	}

	// Engine B on the same key and ledger: recovery, then new payments.
	b := env.NewEngine(t, opts)
	if dropPool {
		// Recovery must resend the very same signed transactions from the ledger.
		limit := time.Now().Add(5 * time.Second)
		for i := range before {
			for !env.InPool(t, common.HexToHash(hashes[i])) {
				if time.Now().After(limit) {
					t.Fatalf("payment %d: transaction %s was not rebroadcast by the new engine", i, hashes[i])
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	settleAll(b, before, before+after)
	wantNonces(rowNonces(before, before+after), before, before+after)
	if n := poolSize(t); n != before+after {
		t.Fatalf("%d transactions in the pool before mining, want %d", n, before+after)
	}

	env.Mine(t)
	env.Mine(t)

	// Every payload, sent again, gets its one success with the hash of its first answer.
	limit := time.Now().Add(10 * time.Second)
	for i := range pays {
		for {
			out, err := b.SettleBody(ctx, t, bodies[i])
			if err != nil {
				t.Fatalf("payment %d after mining: %v", i, err)
			}
			res := out.Response
			if res.Transaction != hashes[i] {
				t.Fatalf("payment %d: transaction %s, want the first answer's %s (%+v)", i, res.Transaction, hashes[i], res)
			}
			if res.Success {
				break
			}
			if res.ErrorReason != facilitator.ReasonSettlementPending {
				t.Fatalf("payment %d: want success after mining, got %+v", i, res)
			}
			if time.Now().After(limit) {
				t.Fatalf("payment %d still pending after mining: %+v", i, res)
			}
		}
		again, err := b.SettleBody(ctx, t, bodies[i])
		if err != nil || again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled {
			t.Fatalf("payment %d, once more: want already_settled, got %+v %v", i, again.Response, err)
		}
	}

	for i, p := range pays {
		if got := env.Balance(t, p.PayTo); got != value {
			t.Fatalf("payee %d holds %d, want exactly %d", i, got, value)
		}
		row, err := b.DB.SettlementByKey(ctx, p.Key())
		if err != nil {
			t.Fatal(err)
		}
		if !row.State.Succeeded() || row.TxHash.Hex() != hashes[i] || row.BlockNumber == 0 || !row.Delivered {
			t.Fatalf("payment %d: ledger row %+v, want mined or final with tx %s", i, row, hashes[i])
		}
	}
	if n := nonceOf(t, addr, "latest"); n != before+after {
		t.Fatalf("signer's nonce is %d on chain, want exactly %d (no reuse, no gap)", n, before+after)
	}
	if n := nonceOf(t, addr, "pending"); n != before+after {
		t.Fatalf("signer's pending nonce is %d, want %d", n, before+after)
	}
	if n := poolSize(t); n != 0 {
		t.Fatalf("%d transactions still in the pool", n)
	}
}

// TestSettlePendingSeenByAnotherEngine: a replica that does not own a pending settlement (its
// signer keys are others) answers a repeat of the payload from the ledger alone: pending with the
// transaction's hash while unmined (ARCHITECTURE.md invariant 3: "settlement_pending with the hash"), then
// the success with the same hash once mined.
func TestSettlePendingSeenByAnotherEngine(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 100_000)
	p := env.NewPay(t, payer, 100_000)
	body := p.Body(t)
	const deadline = time.Second
	env.ManualMining(t)
	owner := env.NewEngine(t, stacktest.EngineOptions{Deadline: deadline})
	replica := env.NewEngine(t, stacktest.EngineOptions{Deadline: deadline}) // another signer key, the same ledger

	first, err := owner.SettleBody(ctx, t, body)
	if err != nil || first.Response.ErrorReason != facilitator.ReasonSettlementPending || first.Response.Transaction == "" {
		t.Fatalf("owner: want settlement_pending with a hash, got %+v %v", first.Response, err)
	}
	hash := first.Response.Transaction

	seen := replica.MustSettle(t, body)
	if seen.Response.Success || seen.Response.ErrorReason != facilitator.ReasonSettlementPending || seen.Response.Transaction != hash {
		t.Fatalf("replica while unmined: want settlement_pending with %s (an open ledger row reads back its latest "+
			"signed hash), got %+v", hash, seen.Response)
	}

	env.Mine(t)
	done := replica.MustSettle(t, body)
	if !done.Response.Success || done.Response.Transaction != hash {
		t.Fatalf("replica after the block: want success with %s, got %+v", hash, done.Response)
	}
	if got := env.Balance(t, p.PayTo); got != 100_000 {
		t.Fatalf("payee holds %d, want exactly 100000", got)
	}
	if n := nonceOf(t, crypto.PubkeyToAddress(replica.Signers[0].PublicKey), "latest"); n != 0 {
		t.Fatalf("the replica's signer sent %d transactions for a settlement it does not own", n)
	}
}
