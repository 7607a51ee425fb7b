package settle_test

import (
	"context"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// batchEngine is an engine on the env's network with batches of up to max, closed after wait.
func batchEngine(t *testing.T, max int, wait time.Duration, o stacktest.EngineOptions) *stacktest.Engine {
	n := env.Network()
	n.Batch = facilitator.BatchPolicy{Max: max, Wait: wait}
	o.Network = &n
	return env.NewEngine(t, o)
}

// quickBatchEngine is batchEngine (batches of up to max, closed after 2 s) answering pending
// after 1.5 s, and resending and retrying fast: for batches that wait for blocks.
func quickBatchEngine(t *testing.T, max int) *stacktest.Engine {
	return quickBatchEngineOf(t, max, stacktest.EngineOptions{})
}

// quickBatchEngineOf is quickBatchEngine with o's other options (its Deadline and Config are
// quickBatchEngine's).
func quickBatchEngineOf(t *testing.T, max int, o stacktest.EngineOptions) *stacktest.Engine {
	o.Deadline = 1500 * time.Millisecond
	o.Config = func(c *settle.Config) {
		c.RetryInterval, c.RebroadcastAfter = 200*time.Millisecond, 300*time.Millisecond
	}
	return batchEngine(t, max, 2*time.Second, o)
}

// batchPays are n payments, each by a freshly funded payer, of value(i), edited by edit (nil:
// none) before they are signed, and their bodies.
func batchPays(t *testing.T, n int, value func(int) int64, edit func(int, *stacktest.Pay)) ([]stacktest.Pay, [][]byte) {
	pays := make([]stacktest.Pay, n)
	bodies := make([][]byte, n)
	for i := range n {
		pays[i] = env.NewPay(t, env.FundedPayer(t, 1_000_000), value(i))
		if edit != nil {
			edit(i, &pays[i])
		}
		bodies[i] = pays[i].Body(t)
	}
	return pays, bodies
}

// settlePendingBatch turns mining off and settles bodies as one batch, which every member is
// answered pending with; it returns the batch's transaction.
func settlePendingBatch(t *testing.T, r *stacktest.Engine, bodies [][]byte) common.Hash {
	t.Helper()
	env.ManualMining(t)
	outs := settleAll(t, r, bodies)
	batchTx := common.HexToHash(outs[0].Response.Transaction)
	for i, out := range outs {
		if out.Response.ErrorReason != facilitator.ReasonSettlementPending || out.Response.Transaction != batchTx.Hex() {
			t.Fatalf("member %d with no blocks: %+v", i, out.Response)
		}
	}
	return batchTx
}

// settleAll settles bodies concurrently and returns the outcomes in order.
func settleAll(t *testing.T, r *stacktest.Engine, bodies [][]byte) []facilitator.SettleOutcome {
	t.Helper()
	outs := make([]facilitator.SettleOutcome, len(bodies))
	errs := make([]error, len(bodies))
	var wg sync.WaitGroup
	for i, b := range bodies {
		wg.Add(1)
		go func() { defer wg.Done(); outs[i], errs[i] = r.SettleBody(context.Background(), t, b) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("settlement %d: %v", i, err)
		}
	}
	return outs
}

// waitMembers mines a block and reads every payment's row until done holds of each, for up to
// within; it fails naming what it waited for and each member's state.
func waitMembers(t *testing.T, pays []stacktest.Pay, within time.Duration, what string, done func(i int, s *facilitator.Settlement) bool) {
	t.Helper()
	began := time.Now()
	for {
		env.Mine(t)
		all, states := true, ""
		for i, p := range pays {
			s := env.Row(t, p.Key())
			states += fmt.Sprintf(" %d:%s", i, s.State)
			all = done(i, s) && all
		}
		if all {
			return
		}
		if time.Since(began) > within {
			t.Fatalf("%s: not within %s:%s", what, within, states)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// decided is waitMembers' condition that a member left the open states.
func decided(_ int, s *facilitator.Settlement) bool { return !s.State.Open() }

// TestBatchSettle: five concurrent settlements on a network batching up to five go out as ONE
// transaction to Multicall3 at one nonce; every member is told success with the batch's hash,
// every payee is paid exactly once, the ledger holds slots 0..4 at that nonce, and each member's
// status by key names the batch's transaction.
func TestBatchSettle(t *testing.T) {
	const n = 5
	r := batchEngine(t, n, 2*time.Second, stacktest.EngineOptions{})
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(i int) int64 { return int64(100_000 + i) }, nil)
	outs := settleAll(t, r, bodies)
	tx := outs[0].Response.Transaction
	slots := map[int]bool{}
	for i, out := range outs {
		if !out.Response.Success || !out.Claimed || out.Response.Transaction != tx {
			t.Fatalf("member %d: %+v, want success with the batch's transaction %s", i, out.Response, tx)
		}
		if got := env.Balance(t, pays[i].PayTo); got != int64(100_000+i) {
			t.Fatalf("payee %d holds %d, want %d", i, got, 100_000+i)
		}
		s, err := r.DB.SettlementByKey(ctx, pays[i].Key())
		if err != nil || s.TxHash.Hex() != tx || s.TxNonce != 0 || !s.State.Succeeded() {
			t.Fatalf("member %d's row: %+v, %v", i, s, err)
		}
		slots[s.BatchSlot] = true
	}
	if len(slots) != n {
		t.Fatalf("slots %v, want 0..%d", slots, n-1)
	}
	signer := stacktest.AddressOf(r.Signers[0])
	if nonce := nonceOf(t, signer, "latest"); nonce != 1 {
		t.Fatalf("signer sent %d transactions, want exactly 1", nonce)
	}
	mined, _, err := env.Chain.Client.TransactionByHash(ctx, common.HexToHash(tx))
	if err != nil || mined.To() == nil || *mined.To() != multicall3.Address {
		t.Fatalf("the batch's transaction %v (%v) does not call Multicall3", mined, err)
	}
	if calls, ok := multicall3.DecodeAggregate3Calldata(mined.Data()); !ok || len(calls) != n {
		t.Fatalf("the batch holds %d calls (%v), want %d", len(calls), ok, n)
	}
	members, err := r.DB.BatchMembers(ctx, env.Network().ID, signer, 0)
	if err != nil || len(members) != n {
		t.Fatalf("batch members %d, %v", len(members), err)
	}
	// Status: by the batch's transaction, every member listed with its own status path; by a
	// member's nonce, its own status with the batch's transaction.
	svc := env.Status(r.DB, 2)
	byTx, err := svc.Settlement(ctx, common.HexToHash(tx))
	if err != nil || byTx.Transaction != tx || len(byTx.Batch) != n {
		t.Fatalf("status by the batch's transaction: %+v, %v; want its %d settlements listed", byTx, err, n)
	}
	listed := map[string]facilitator.BatchSettlement{}
	for _, m := range byTx.Batch {
		listed[m.Nonce] = m
	}
	for i, p := range pays {
		k := p.Key()
		nonce := hexutil.Encode(k.Nonce[:])
		m, ok := listed[nonce]
		want := status.AuthorizationPath(k.Network, k.Asset.Hex(), k.Payer.Hex(), nonce)
		if !ok || m.State != facilitator.StatusSettled || m.Authorizer != k.Payer.Hex() || m.Asset != k.Asset.Hex() || m.Network != k.Network || m.Status != want {
			t.Fatalf("member %d in the batch's status: %+v (listed %v), want settled at %s", i, m, ok, want)
		}
		own, found, err := svc.Authorization(ctx, k)
		if err != nil || !found || own.State != facilitator.StatusSettled || own.Transaction != tx || own.Nonce != nonce ||
			own.To != p.PayTo.Hex() || own.Value != fmt.Sprint(100_000+i) || own.Batch != nil {
			t.Fatalf("member %d by nonce: %+v, %v, %v; want its own settled status with the batch's transaction", i, own, found, err)
		}
	}
	// A repeat is no second success.
	again, err := r.SettleBody(ctx, t, bodies[2])
	if err != nil || again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled {
		t.Fatalf("repeat: %+v, %v", again.Response, err)
	}
}

// TestBatchMemberUsedElsewhere: a batch member's authorization is used by a third party's
// transaction mined before the batch: the batch mines without reverting, that member is
// settled_elsewhere (decided from its own logs: no pair of its in the batch's receipt), the
// others are mined and paid once each.
func TestBatchMemberUsedElsewhere(t *testing.T) {
	const n = 3
	r := quickBatchEngine(t, n)
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(int) int64 { return 200_000 }, nil)
	batchTx := settlePendingBatch(t, r, bodies)
	// The batch leaves the pool; the third party's use of member 1's authorization is mined first,
	// then the engine's resend of the batch.
	if err := env.Chain.RPC.CallContext(ctx, nil, "anvil_dropTransaction", batchTx); err != nil {
		t.Fatal(err)
	}
	elsewhere := pays[1].SendElsewhere(t)
	env.Mine(t)
	if rc, err := env.Chain.Client.TransactionReceipt(ctx, elsewhere); err != nil || rc.Status != 1 {
		t.Fatalf("the third party's transfer: %+v, %v", rc, err)
	}
	env.SetAutomine(t, true)
	waitMembers(t, pays, 30*time.Second, "the batch's members are decided", func(i int, s *facilitator.Settlement) bool {
		return !s.State.Open() && (i != 1 || s.State == facilitator.StateSettledElsewhere)
	})
	for i, p := range pays {
		s, _ := r.DB.SettlementByKey(ctx, p.Key())
		switch {
		case i == 1 && (s.State != facilitator.StateSettledElsewhere || s.ErrorReason != facilitator.ReasonNonceAlreadyUsed):
			t.Fatalf("member used elsewhere: %+v", s)
		case i != 1 && (!s.State.Succeeded() || s.TxHash != batchTx || s.ErrorReason != ""):
			t.Fatalf("member %d: %+v, want mined by the batch %s", i, s, batchTx)
		}
		if got := env.Balance(t, p.PayTo); got != 200_000 {
			t.Fatalf("payee %d holds %d, want exactly 200000", i, got)
		}
	}
	if rc, err := env.Chain.Client.TransactionReceipt(ctx, batchTx); err != nil || rc.Status != 1 {
		t.Fatalf("the batch: %+v, %v; want mined without reverting", rc, err)
	}
}

// TestBatchFeeBump: a batch left unmined past BumpAfter is replaced as a whole, once per round
// however many members decide the bump: every variant in the ledger is recorded once (under slot
// 0), each replaces the previous at the same nonce with higher fees, every member reads the same
// variants; once mined, every member is paid exactly once.
func TestBatchFeeBump(t *testing.T) {
	const n = 3
	obs := &recordingObserver{}
	r := batchEngine(t, n, 2*time.Second, stacktest.EngineOptions{Deadline: 1500 * time.Millisecond, Config: func(c *settle.Config) {
		c.BumpAfter = 300 * time.Millisecond
		c.Observer = obs
	}})
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(int) int64 { return 300_000 }, nil)
	env.ManualMining(t)
	settleAll(t, r, bodies)
	signer := stacktest.AddressOf(r.Signers[0])
	open := bumped(t, r, n)
	for i, o := range open {
		if len(o.Txs) < len(open[0].Txs) || o.Txs[0].Hash != open[0].Txs[0].Hash || o.Txs[1].Hash != open[0].Txs[1].Hash {
			t.Fatalf("member %d reads variants %+v, slot 0 %+v", i, o.Txs, open[0].Txs)
		}
	}
	first, second := decodeTx(t, open[0].Txs[0].Raw), decodeTx(t, open[0].Txs[1].Raw)
	if first.Nonce() != second.Nonce() || *second.To() != multicall3.Address || string(second.Data()) != string(first.Data()) ||
		second.GasFeeCap().Cmp(pct(first.GasFeeCap(), 110)) < 0 {
		t.Fatalf("the replacement is not the same batch at the same nonce with higher fees")
	}
	// One replacement per bump round, not one per member: every member decides the bump each
	// round, and only the first to carry it out (slot 0, the lowest id) replaces the batch; the
	// others find the variant they decided on replaced. Members bumping alone would record bumps
	// on every row, n per round.
	bumped := 0
	for i, o := range open {
		evs, err := r.DB.SettlementEvents(ctx, o.ID, 0, []string{"bumped"}, 100)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && len(evs) > 0 {
			t.Fatalf("member %d (slot %d) bumped the batch %d times too", i, o.BatchSlot, len(evs))
		}
		bumped += len(evs)
	}
	if bumped == 0 || obs.count("bump "+env.Network().ID) < bumped {
		t.Fatalf("%d bumps recorded, %d observed", bumped, obs.count("bump "+env.Network().ID))
	}
	env.SetAutomine(t, true)
	env.Mine(t)
	waitMembers(t, pays, 20*time.Second, "the batch's members are mined", func(_ int, s *facilitator.Settlement) bool { return s.State.Succeeded() })
	for i, p := range pays {
		if got := env.Balance(t, p.PayTo); got != 300_000 {
			t.Fatalf("payee %d holds %d, want exactly 300000", i, got)
		}
	}
	if nonce := nonceOf(t, signer, "latest"); nonce != 1 {
		t.Fatalf("signer used %d nonces, want 1", nonce)
	}
}

// TestBatchesInARow: a key's second batch takes the nonce after its first (a batch holds ONE
// nonce, however many members it has): both are mined, the key sent exactly two transactions,
// and every payee is paid once. (A batch once moved the key's next nonce by its member count: the
// second batch sat at a nonce past a gap, never mined, and the key filled up with it.)
func TestBatchesInARow(t *testing.T) {
	const n = 3
	r := batchEngine(t, n, 2*time.Second, stacktest.EngineOptions{})
	ctx := context.Background()
	signer := stacktest.AddressOf(r.Signers[0])
	for round := range 2 {
		pays, bodies := batchPays(t, n, func(int) int64 { return 300_000 }, nil)
		outs := settleAll(t, r, bodies)
		for i, out := range outs {
			if !out.Response.Success || out.Response.Transaction != outs[0].Response.Transaction {
				t.Fatalf("round %d member %d: %+v, want success with the batch's transaction", round, i, out.Response)
			}
			s, err := r.DB.SettlementByKey(ctx, pays[i].Key())
			if err != nil || s.TxNonce != uint64(round) {
				t.Fatalf("round %d member %d's row: %+v, %v; want tx nonce %d", round, i, s, err, round)
			}
			if got := env.Balance(t, pays[i].PayTo); got != 300_000 {
				t.Fatalf("round %d payee %d holds %d, want 300000", round, i, got)
			}
		}
	}
	if nonce := nonceOf(t, signer, "latest"); nonce != 2 {
		t.Fatalf("signer sent %d transactions, want exactly 2", nonce)
	}
}

// TestBatchCrashAfterCommit: the process holding a key dies after a batch's commit and before its
// broadcast (its committing goroutine stops at FaultAfterCommit and its lease session ends):
// nothing reached the chain, every member's row is in the ledger at one nonce, and the engine
// that takes the key over sends the batch once: every member mined by the one transaction, every
// payee paid once, the key's nonce moved by one.
func TestBatchCrashAfterCommit(t *testing.T) {
	const n = 3
	ctx := context.Background()
	key := env.NewSigner(t)
	addr := stacktest.AddressOf(key)
	conn := sqlConn(t)
	committed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	crashing := leased(500*time.Millisecond, key)
	crashing.Config = func(c *settle.Config) {
		c.Leaser = c.Store.(*postgres.DB)
		c.Fault = func(p settle.FaultPoint) {
			if p == settle.FaultAfterCommit {
				once.Do(func() { close(committed) })
				<-release // the process is dead from here on: nothing it holds moves again
			}
		}
	}
	a := batchEngine(t, n, 2*time.Second, crashing)
	// At the end the dead process's goroutines go on (then its callers return), before a stops:
	// cleanups run last first.
	var callers sync.WaitGroup
	t.Cleanup(callers.Wait)
	t.Cleanup(func() { close(release) })

	var pays []stacktest.Pay
	for range n {
		pays = append(pays, env.NewPay(t, env.FundedPayer(t, 1_000_000), 400_000))
	}
	for _, p := range pays {
		callers.Add(1)
		go func() {
			defer callers.Done()
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, _ = a.SettleBody(cctx, t, p.Body(t)) // answered by no one: the process died
		}()
	}
	select {
	case <-committed:
	case <-time.After(15 * time.Second):
		t.Fatal("the batch was not committed")
	}
	for i, p := range pays {
		s, err := a.DB.SettlementByKey(ctx, p.Key())
		if err != nil || s.TxNonce != 0 || s.Signer != addr || !s.State.Open() {
			t.Fatalf("member %d's row after the crash: %+v, %v; want open at tx nonce 0", i, s, err)
		}
	}
	if got := nonceOf(t, addr, "pending"); got != 0 || poolSize(t) != 0 {
		t.Fatalf("something left the crashed process: pending nonce %d, pool %d", got, poolSize(t))
	}
	pid, _ := leaseRow(t, conn, key)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}

	b := batchEngine(t, n, 2*time.Second, leased(20*time.Second, key))
	waitFor(t, 10*time.Second, "the second engine takes the key over", func() bool { return holds(b, key) })
	var tx string
	for i, p := range pays {
		waitFor(t, 20*time.Second, "the member settles", func() bool {
			out, err := b.SettleBody(ctx, t, p.Body(t))
			if err != nil {
				t.Fatal(err)
			}
			if tx == "" {
				tx = out.Response.Transaction
			}
			if out.Response.Transaction != tx {
				t.Fatalf("member %d: transaction %s, want the batch's %s", i, out.Response.Transaction, tx)
			}
			return out.Response.Success
		})
		if got := env.Balance(t, p.PayTo); got != 400_000 {
			t.Fatalf("payee %d holds %d, want 400000 exactly once", i, got)
		}
	}
	if got := nonceOf(t, addr, "latest"); got != 1 {
		t.Fatalf("the key sent %d transactions, want the one batch", got)
	}
	mined, _, err := env.Chain.Client.TransactionByHash(ctx, common.HexToHash(tx))
	if err != nil || mined.To() == nil || *mined.To() != multicall3.Address {
		t.Fatalf("the recovered transaction %v (%v) is not the batch", mined, err)
	}
}

// TestBatchMemberExpired: a batch is mined in a block at one member's validBefore: that member's
// call reverts inside the batch (the token refuses an expired authorization) and it ends expired
// (the valid_before reason, nothing moved for it), while the batch's other members are mined by
// the same transaction and paid once each.
func TestBatchMemberExpired(t *testing.T) {
	const n = 3
	r := quickBatchEngine(t, n)
	ctx := context.Background()
	pays, bodies := batchPays(t, n, func(int) int64 { return 250_000 }, func(i int, p *stacktest.Pay) {
		if i == 1 {
			p.ValidBefore = big.NewInt(env.TimeBase(t) + 120)
		}
	})
	payerBefore := env.Balance(t, pays[1].From())
	batchTx := settlePendingBatch(t, r, bodies)
	// The batch is mined in a block at member 1's validBefore.
	if err := env.Chain.SetNextBlockTimestamp(ctx, pays[1].ValidBefore.Uint64()); err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	if rc, err := env.Chain.Client.TransactionReceipt(ctx, batchTx); err != nil || rc.Status != 1 {
		t.Fatalf("the batch: %+v, %v; want mined without reverting", rc, err)
	}
	waitMembers(t, pays, 30*time.Second, "the batch's members are decided", decided)
	for i, p := range pays {
		s := env.Row(t, p.Key())
		switch {
		case i == 1 && (s.State != facilitator.StateExpired || s.ErrorReason != facilitator.ReasonValidBefore):
			t.Fatalf("the expired member: %+v, want expired / %s", s, facilitator.ReasonValidBefore)
		case i != 1 && (!s.State.Succeeded() || s.TxHash != batchTx):
			t.Fatalf("member %d: %+v, want mined by the batch %s", i, s, batchTx)
		}
		want := int64(250_000)
		if i == 1 {
			want = 0
		}
		if got := env.Balance(t, p.PayTo); got != want {
			t.Fatalf("payee %d holds %d, want %d", i, got, want)
		}
	}
	if got := env.Balance(t, pays[1].From()); got != payerBefore {
		t.Fatalf("the expired member's payer holds %d, want %d untouched", got, payerBefore)
	}
	if out := r.MustSettle(t, bodies[1]); out.Response.Success || out.Response.ErrorReason != facilitator.ReasonValidBefore {
		t.Fatalf("the expired member's answer after: %+v", out.Response)
	}
}

// receiptCounter is the engine's chain, counting in each JSON-RPC batch the reads of each
// transaction's receipt.
type receiptCounter struct {
	ethrpc.Chain
	mu       sync.Mutex
	reads    map[common.Hash]int // in all
	perBatch int                 // the most reads of one receipt in one request
}

func (c *receiptCounter) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	in := map[common.Hash]int{}
	for _, el := range b {
		if el.Method == "eth_getTransactionReceipt" && len(el.Args) == 1 {
			if h, ok := el.Args[0].(common.Hash); ok {
				in[h]++
			}
		}
	}
	c.mu.Lock()
	for h, k := range in {
		c.reads[h] += k
		c.perBatch = max(c.perBatch, k)
	}
	c.mu.Unlock()
	return c.Chain.BatchCallContext(ctx, b)
}

// TestBatchReceiptReadOnce: the members of a batch share its transaction, and a round's read of
// its receipt serves all of them: the watcher never asks one request for the same receipt twice
// (it once asked once per member, n reads of one receipt, on the way to finality).
func TestBatchReceiptReadOnce(t *testing.T) {
	const n = 5
	counter := &receiptCounter{Chain: env.Chain.RPC, reads: map[common.Hash]int{}}
	r := batchEngine(t, n, 2*time.Second, stacktest.EngineOptions{Chain: counter, Depth: 2})
	pays, bodies := batchPays(t, n, func(int) int64 { return 50_000 }, nil)
	outs := settleAll(t, r, bodies)
	batchTx := common.HexToHash(outs[0].Response.Transaction)
	waitMembers(t, pays, 20*time.Second, "the batch's members are final", func(_ int, s *facilitator.Settlement) bool { return s.State == facilitator.StateFinal })
	counter.mu.Lock()
	defer counter.mu.Unlock()
	if counter.reads[batchTx] == 0 {
		t.Fatal("the batch's receipt was never read by hash: the test saw nothing")
	}
	if counter.perBatch > 1 {
		t.Fatalf("one request read a receipt %d times, want once (reads of the batch's: %d)", counter.perBatch, counter.reads[batchTx])
	}
}
