package reconcile_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestReconcileAfterDeath: a facilitator dies right after broadcasting a settlement that carries a
// payment id (the engine is stopped: nothing works on the row any more). Once the chain has the
// transfer, one run of the Settlements job brings the row, the id's record and the status answer to
// the truth: settled, by us, with the transaction. When the node lost the transaction along with
// the process, the job first sends the ledger's raw transaction again (the same bytes, the same hash).
func TestReconcileAfterDeath(t *testing.T) {
	for _, tc := range []struct {
		name string
		lost bool
	}{
		{"mempool kept", false},
		{"mempool lost", true},
	} {
		t.Run(tc.name, func(t *testing.T) { testAfterDeath(t, tc.lost) })
	}
}

func testAfterDeath(t *testing.T, lost bool) {
	ctx := context.Background()
	env.StartIndexer(t)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 250_000)
	p.ID = stacktest.RandomID(t)
	body := p.Body(t)
	_, hash := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: pendingDeadline}) // the process dies after the broadcast
	r := env.Row(t, p.Key())
	if !r.State.Open() || r.TxHash != hash {
		t.Fatalf("ledger after the death: %+v, want open with %s", r, hash)
	}
	svc := env.Status(env.DB, 2)
	if st, err := svc.Payment(ctx, "", p.ID); err != nil || st.State != facilitator.StatusPending || st.Transaction != hash.Hex() ||
		st.Basis != "ledger" || st.PaymentID != p.ID {
		t.Fatalf("status while pending: %+v %v, want pending with %s from the ledger", st, err, hash)
	}

	// A run that sees the row as fresh leaves it to its engine (StaleAfter): no look, no touch.
	before := updatedAt(t, r.ID)
	runSettlements(t, jobs(t, 2, time.Now))
	if got := updatedAt(t, r.ID); !got.Equal(before) {
		t.Fatalf("a fresh settlement was looked at (updated_at %v -> %v)", before, got)
	}

	j := jobs(t, 2, later)
	if lost {
		env.DropPool(t)
		// The chain does not have it: with validBefore ahead the job cannot tell lost from slow,
		// and resends the ledger's signed bytes.
		ch := runSettlements(t, j)
		if ch.Resent < 1 || !env.InPool(t, hash) {
			t.Fatalf("the job did not resend the lost transaction %s (changes %+v, in pool %v)", hash, ch, env.InPool(t, hash))
		}
		if r := env.Row(t, p.Key()); !r.State.Open() || r.TxHash != hash {
			t.Fatalf("ledger after the resend: %+v", r)
		}
	}

	env.Mine(t)
	rc := env.Receipt(t, hash)
	if rc == nil || rc.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("receipt of %s: %+v", hash, rc)
	}
	env.WaitIndexed(t, rc.BlockNumber.Uint64())

	// One job interval after the chain has the transfer.
	ch := runSettlements(t, j)
	if ch.Mined < 1 {
		t.Fatalf("the job did not resolve the settlement: %+v", ch)
	}
	r = env.Row(t, p.Key())
	if r.State != facilitator.StateMined || r.TxHash != hash || r.BlockNumber != rc.BlockNumber.Uint64() || r.ErrorReason != "" {
		t.Fatalf("ledger after the job: %+v, want mined with %s in block %d", r, hash, rc.BlockNumber)
	}
	rec, err := env.DB.PaymentID(ctx, "", p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Settlement.ID != r.ID || rec.Settlement.State != facilitator.StateMined || rec.Settlement.TxHash != hash {
		t.Fatalf("payment id's settlement: %+v, want the mined row", rec.Settlement)
	}
	st, err := svc.Payment(ctx, "", p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Transaction != hash.Hex() || st.Basis != "ledger" ||
		st.BlockNumber != rc.BlockNumber.Uint64() || st.PaymentID != p.ID || st.Confirmations != 1 || st.Final {
		t.Fatalf("status after the job: %+v", st)
	}

	// One more block: final at depth 2.
	env.Mine(t)
	env.WaitIndexed(t, env.Head(t))
	ch = runSettlements(t, j)
	if ch.Final < 1 {
		t.Fatalf("the job did not finalise the settlement: %+v", ch)
	}
	if r := env.Row(t, p.Key()); r.State != facilitator.StateFinal || r.TxHash != hash {
		t.Fatalf("ledger at depth 2: %+v", r)
	}
	// The run recorded itself for the operations overview: what it examined and changed.
	runs, err := env.DB.ReconcileRuns(ctx, 1)
	if err != nil || len(runs) != 1 {
		t.Fatalf("reconcile runs: %+v %v", runs, err)
	}
	if run := runs[0]; run.Job != "settlements" || run.Examined != ch.Looked || run.Changed["final"] != ch.Final || run.Error != "" ||
		run.Finished.Before(run.Started) {
		t.Fatalf("the run's row %+v, the run changed %+v", run, ch)
	}
	if st, err := svc.Payment(ctx, "", p.ID); err != nil || st.State != facilitator.StatusSettled || !st.Final || st.Confirmations < 2 {
		t.Fatalf("status at depth 2: %+v %v", st, err)
	}
	if got := env.Balance(t, p.PayTo); got != p.Value {
		t.Fatalf("payee holds %d, want exactly %d", got, p.Value)
	}
	want := []string{"signed", "broadcast", "mined", "final"}
	if got := stacktest.States(env.Events(t, r.ID)); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("settlement events %v, want %v", got, want)
	}
}

// TestReconcileSettledElsewhere: our transaction never lands (the process died and the node lost it)
// and a third party submits the same authorization directly. The job reads the use from the index
// and records settled_elsewhere; status answers settled by "other" with the third party's hash.
func TestReconcileSettledElsewhere(t *testing.T) {
	ctx := context.Background()
	env.StartIndexer(t)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 400_000)
	body := p.Body(t)
	_, ours := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: pendingDeadline})
	env.DropPool(t) // ours never lands
	env.SetAutomine(t, true)
	theirs := p.SubmitElsewhere(t)
	rc := env.Receipt(t, theirs)
	indexedFinal(t, rc.BlockNumber.Uint64(), 2)
	if u := env.Use(t, p.Key()); u == nil || u.TxHash != theirs || u.Canceled {
		t.Fatalf("indexed use: %+v, want %s", u, theirs)
	}

	ch := runSettlements(t, jobs(t, 2, later))
	if ch.Elsewhere < 1 {
		t.Fatalf("changes %+v, want settled_elsewhere", ch)
	}
	r := env.Row(t, p.Key())
	if r.State != facilitator.StateSettledElsewhere || r.ErrorReason != facilitator.ReasonNonceAlreadyUsed ||
		r.BlockNumber != rc.BlockNumber.Uint64() {
		t.Fatalf("ledger: %+v, want settled_elsewhere in block %d", r, rc.BlockNumber)
	}
	svc := env.Status(env.DB, 2)
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("status: %v, found %v", err, found)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Transaction != theirs.Hex() || st.Basis != "ledger+index" ||
		st.BlockNumber != rc.BlockNumber.Uint64() || st.To != p.PayTo.Hex() || st.Value != big.NewInt(p.Value).String() {
		t.Fatalf("status: %+v, want settled by other with %s", st, theirs)
	}
	// Asked by our own (never mined) transaction's hash, status says the same.
	if st2, err := svc.Settlement(ctx, ours); err != nil || st2.State != st.State || st2.Transaction != theirs.Hex() {
		t.Fatalf("status by our hash: %+v %v", st2, err)
	}
	// Whatever becomes of our signed transaction now (a resend would only spend its nonce), it
	// cannot move the money a second time.
	env.Mine(t)
	if rc := env.Receipt(t, ours); rc != nil && rc.Status != types.ReceiptStatusFailed {
		t.Fatalf("our transaction %s succeeded after the authorization was used elsewhere", ours)
	}
	if got := env.Balance(t, p.PayTo); got != p.Value {
		t.Fatalf("payee holds %d, want exactly %d", got, p.Value)
	}
}

// TestReconcileExpired: a settlement whose transaction never lands, with a short validBefore. While
// validBefore is ahead the job cannot know the transaction is gone for good, so it resends the
// ledger's raw transaction (had that resend been mined before validBefore, the settlement would
// simply be mined: TestReconcileAfterDeath/mempool_lost). Then the chain's clock passes validBefore:
//   - "lost again": the node dropped the resend too; no receipt, the authorization unused on chain
//     at a head past validBefore: the job records expired from the clock;
//   - "mined too late": the resend is mined in the first block past validBefore and reverts; the
//     job records expired from that receipt.
//
// Either way status says expired, and nothing of ours can land any more.
func TestReconcileExpired(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lostAgain bool
	}{
		{"lost again", true},
		{"mined too late", false},
	} {
		t.Run(tc.name, func(t *testing.T) { testExpired(t, tc.lostAgain) })
	}
}

func testExpired(t *testing.T, lostAgain bool) {
	ctx := context.Background()
	env.StartIndexer(t)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 100_000)
	p.ValidBefore = big.NewInt(env.TimeBase(t) + 30)
	body := p.Body(t)
	_, hash := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: pendingDeadline})
	env.DropPool(t)

	j := jobs(t, 2, later)
	ch := runSettlements(t, j)
	if ch.Resent < 1 || ch.Expired != 0 || !env.InPool(t, hash) {
		t.Fatalf("before validBefore: changes %+v (in pool %v), want the raw transaction resent", ch, env.InPool(t, hash))
	}
	svc := env.Status(env.DB, 2)
	if st, _, err := svc.Authorization(ctx, p.Key()); err != nil || st.State != facilitator.StatusPending || st.Transaction != hash.Hex() {
		t.Fatalf("status before validBefore: %+v %v", st, err)
	}

	if lostAgain {
		env.DropPool(t)
	}
	if err := env.Chain.IncreaseTime(ctx, 60); err != nil { // mines the first block past validBefore
		t.Fatal(err)
	}
	env.Mine(t) // expiry rests on a block final by the network's depth (2)
	if now := env.BlockAt(t, "latest").Time; uint64(now) < p.ValidBefore.Uint64() {
		t.Fatalf("chain time %d is not past validBefore %s", now, p.ValidBefore)
	}
	rc := env.Receipt(t, hash)
	switch {
	case lostAgain && rc != nil:
		t.Fatalf("a dropped transaction was mined: %+v", rc)
	case !lostAgain && (rc == nil || rc.Status != types.ReceiptStatusFailed):
		t.Fatalf("the resend mined past validBefore: receipt %+v, want a revert", rc)
	}
	env.WaitIndexed(t, env.Head(t))

	ch = runSettlements(t, j)
	if ch.Expired < 1 {
		t.Fatalf("after validBefore: changes %+v, want expired", ch)
	}
	r := env.Row(t, p.Key())
	if r.State != facilitator.StateExpired || r.ErrorReason != facilitator.ReasonValidBefore {
		t.Fatalf("ledger: %+v, want expired", r)
	}
	if !lostAgain && (r.TxHash != hash || r.BlockNumber != rc.BlockNumber.Uint64()) {
		t.Fatalf("ledger: %+v, want our reverted transaction %s in block %d", r, hash, rc.BlockNumber)
	}
	if used, err := env.Chain.USDC.AuthorizationState(ctx, p.From(), p.Nonce); err != nil || used {
		t.Fatalf("authorizationState: %v %v, want unused", used, err)
	}
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found || st.State != facilitator.StatusExpired || st.Basis != "ledger" || st.Reason != facilitator.ReasonValidBefore {
		t.Fatalf("status: %+v %v %v, want expired from the ledger", st, found, err)
	}
	if st.Transaction != "" && st.Transaction != hash.Hex() {
		t.Fatalf("status names transaction %s, which is neither none nor ours (%s)", st.Transaction, hash)
	}
	// Nothing of ours can land any more: mined now, our transaction can only revert, and the
	// outcome stays expired.
	env.Mine(t)
	if rc := env.Receipt(t, hash); rc != nil && rc.Status != types.ReceiptStatusFailed {
		t.Fatalf("our transaction %s succeeded after validBefore", hash)
	}
	env.WaitIndexed(t, env.Head(t))
	runSettlements(t, j)
	if r := env.Row(t, p.Key()); r.State != facilitator.StateExpired {
		t.Fatalf("ledger after a later run: %+v, want still expired", r)
	}
	if got := env.Balance(t, p.PayTo); got != 0 {
		t.Fatalf("payee holds %d after an expiry", got)
	}
}

// TestReconcileLateTransfer: a settlement answered pending whose engine then stopped; its
// transaction is mined later, while the ledger still says broadcast. The job moves it to mined,
// from the index when it has the block, and from our receipt when it does not, and the move is
// recorded in settlement_events.
func TestReconcileLateTransfer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		indexed bool
	}{
		{"from the index", true},
		{"from the receipt", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.indexed {
				env.StartIndexer(t)
			}
			p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 70_000)
			body := p.Body(t)
			_, hash := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: 500 * time.Millisecond})

			env.Mine(t) // the transfer lands after the pending answer
			rc := env.Receipt(t, hash)
			if rc == nil || rc.Status != types.ReceiptStatusSuccessful {
				t.Fatalf("receipt: %+v", rc)
			}
			if r := env.Row(t, p.Key()); r.State != facilitator.StateBroadcast {
				t.Fatalf("ledger after the late transfer: %+v, want still broadcast", r)
			}
			if tc.indexed {
				env.WaitIndexed(t, rc.BlockNumber.Uint64())
			} else if env.Use(t, p.Key()) != nil {
				t.Fatal("the index has the use although no indexer runs")
			}

			ch := runSettlements(t, jobs(t, 2, later))
			if ch.Mined < 1 {
				t.Fatalf("changes %+v, want mined", ch)
			}
			r := env.Row(t, p.Key())
			if r.State != facilitator.StateMined || r.TxHash != hash || r.BlockNumber != rc.BlockNumber.Uint64() {
				t.Fatalf("ledger: %+v, want mined with %s in block %d", r, hash, rc.BlockNumber)
			}
			es := env.Events(t, r.ID)
			last := es[len(es)-1]
			if last.State != "mined" || !strings.Contains(last.Detail, strings.ToLower(hash.Hex()[2:])) {
				t.Fatalf("events %+v, want the last to record mined with %s", es, hash)
			}
			want := []string{"signed", "broadcast", "mined"}
			if got := stacktest.States(es); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("settlement events %v, want %v", got, want)
			}
			st, _, err := env.Status(env.DB, 2).Authorization(context.Background(), p.Key())
			if err != nil || st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Transaction != hash.Hex() {
				t.Fatalf("status: %+v %v", st, err)
			}
		})
	}
}

// TestReconcileReorg: a mined (not yet final, depth 3) settlement whose block is reorganised away.
// The indexer follows the reorg; the job reopens the settlement (broadcast) and resends the raw
// transaction from the ledger; once mined again it is mined with the same hash in its new block,
// and final at depth.
func TestReconcileReorg(t *testing.T) {
	ctx := context.Background()
	const depth = 3
	env.StartIndexer(t)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 123_000)
	body := p.Body(t)
	_, hash := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: pendingDeadline})

	snap, err := env.Chain.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	first := env.Receipt(t, hash)
	if first == nil || first.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("receipt: %+v", first)
	}
	b := first.BlockNumber.Uint64()
	env.Mine(t)
	env.WaitIndexed(t, b+1)
	j := jobs(t, depth, later)
	if ch := runSettlements(t, j); ch.Mined < 1 {
		t.Fatalf("changes %+v, want mined", ch)
	}
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined || r.BlockNumber != b {
		t.Fatalf("ledger before the reorg: %+v", r)
	}
	svc := env.Status(env.DB, depth)
	if st, _, err := svc.Authorization(ctx, p.Key()); err != nil || st.State != facilitator.StatusSettled || st.Final || st.Confirmations != 2 {
		t.Fatalf("status before the reorg: %+v %v, want settled, 2 confirmations, not final", st, err)
	}

	// The reorg: back to before the block, and a longer branch without the transaction.
	if err := env.Chain.Revert(ctx, snap); err != nil {
		t.Fatal(err)
	}
	t.Logf("reverted to block %d; pool %d", env.Head(t), poolLen(t))
	env.DropPool(t)
	for range 3 {
		env.Mine(t)
	}
	if env.Receipt(t, hash) != nil {
		t.Fatal("the transaction is still on the chain after the reorg")
	}
	env.WaitIndexed(t, b+2)
	if u := env.Use(t, p.Key()); u != nil {
		t.Fatalf("the index still has the use after the reorg: %+v", u)
	}

	ch := runSettlements(t, j)
	if ch.Reopened != 1 || ch.Resent != 1 {
		t.Fatalf("after the reorg: changes %+v, want reopened and resent", ch)
	}
	r := env.Row(t, p.Key())
	if r.State != facilitator.StateBroadcast || r.TxHash != hash || r.BlockNumber != 0 {
		t.Fatalf("ledger after the reorg: %+v, want broadcast with %s", r, hash)
	}
	if !env.InPool(t, hash) {
		t.Fatalf("the job did not resend %s", hash)
	}
	if st, _, err := svc.Authorization(ctx, p.Key()); err != nil || st.State != facilitator.StatusPending || st.Transaction != hash.Hex() {
		t.Fatalf("status after the reorg: %+v %v, want pending with %s", st, err, hash)
	}

	// Re-mined: the same transaction in a new block.
	env.Mine(t)
	again := env.Receipt(t, hash)
	if again == nil || again.Status != types.ReceiptStatusSuccessful || again.BlockHash == first.BlockHash {
		t.Fatalf("receipt after re-mining: %+v", again)
	}
	env.WaitIndexed(t, again.BlockNumber.Uint64())
	if ch := runSettlements(t, j); ch.Mined < 1 {
		t.Fatalf("changes %+v, want mined", ch)
	}
	r = env.Row(t, p.Key())
	if r.State != facilitator.StateMined || r.TxHash != hash || r.BlockNumber != again.BlockNumber.Uint64() {
		t.Fatalf("ledger after re-mining: %+v, want mined with %s in block %d", r, hash, again.BlockNumber)
	}
	for range depth - 1 {
		env.Mine(t)
	}
	env.WaitIndexed(t, env.Head(t))
	if ch := runSettlements(t, j); ch.Final < 1 {
		t.Fatalf("changes %+v, want final", ch)
	}
	if r := env.Row(t, p.Key()); r.State != facilitator.StateFinal || r.BlockNumber != again.BlockNumber.Uint64() {
		t.Fatalf("ledger at depth: %+v", r)
	}
	st, _, err := svc.Authorization(ctx, p.Key())
	if err != nil || st.State != facilitator.StatusSettled || !st.Final || st.Confirmations != depth || st.BlockNumber != again.BlockNumber.Uint64() {
		t.Fatalf("status at depth: %+v %v", st, err)
	}
	want := []string{"signed", "broadcast", "mined", "broadcast", "mined", "final"}
	if got := stacktest.States(env.Events(t, r.ID)); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("settlement events %v, want %v", got, want)
	}
	if got := env.Balance(t, p.PayTo); got != p.Value {
		t.Fatalf("payee holds %d, want exactly %d", got, p.Value)
	}
}

// TestReconcileReorgRemined: the reorganised transaction is mined again in the new branch, in
// another block, before the job looks (anvil here; a node re-including an orphaned transaction
// from its pool in practice). The index has the use at the new block: the ledger must follow it.
func TestReconcileReorgRemined(t *testing.T) {
	ctx := context.Background()
	const depth = 3
	env.StartIndexer(t)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 321_000)
	body := p.Body(t)
	env.ManualMining(t)
	e := env.NewEngine(t, stacktest.EngineOptions{Deadline: pendingDeadline})
	hash := e.SettlePending(t, body)
	raw := rawTx(t, hash)
	e.Stop(context.Background())

	snap, err := env.Chain.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	b := env.Receipt(t, hash).BlockNumber.Uint64()
	env.WaitIndexed(t, b)
	j := jobs(t, depth, later)
	runSettlements(t, j)
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined || r.BlockNumber != b {
		t.Fatalf("ledger before the reorg: %+v", r)
	}

	if err := env.Chain.Revert(ctx, snap); err != nil {
		t.Fatal(err)
	}
	env.DropPool(t)
	env.Mine(t) // block b, empty
	if err := env.Chain.RPC.CallContext(ctx, nil, "eth_sendRawTransaction", hexutil.Bytes(raw)); err != nil {
		t.Fatal(err)
	}
	env.Mine(t) // block b+1, with our transaction
	again := env.Receipt(t, hash)
	if again == nil || again.BlockNumber.Uint64() != b+1 {
		t.Fatalf("receipt after the reorg: %+v, want block %d", again, b+1)
	}
	env.WaitIndexed(t, b+1)
	if u := env.Use(t, p.Key()); u == nil || u.BlockNumber != b+1 {
		t.Fatalf("indexed use: %+v, want block %d", u, b+1)
	}

	runSettlements(t, j)
	if r := env.Row(t, p.Key()); !r.State.Succeeded() || r.BlockNumber != b+1 {
		t.Errorf("ledger after the job: %+v, want mined in block %d (the transaction's block on the canonical chain), "+
			"not the orphaned block %d", r, b+1, b)
	}
	st, _, err := env.Status(env.DB, depth).Authorization(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockNumber != b+1 {
		t.Errorf("status: block %d, %d confirmations, want block %d", st.BlockNumber, st.Confirmations, b+1)
	}
}

// TestReconcileCanceled: our transaction never lands and the payer cancels the authorization on
// chain; the job records canceled from the index, and status says canceled.
func TestReconcileCanceled(t *testing.T) {
	ctx := context.Background()
	env.StartIndexer(t)
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 55_000)
	body := p.Body(t)
	_, ours := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: pendingDeadline})
	env.DropPool(t)
	env.SetAutomine(t, true)
	cancelTx := env.CancelAuthorization(t, payer, p.Nonce)
	rc := env.Receipt(t, cancelTx)
	indexedFinal(t, rc.BlockNumber.Uint64(), 2)

	ch := runSettlements(t, jobs(t, 2, later))
	if ch.Canceled < 1 {
		t.Fatalf("changes %+v, want canceled", ch)
	}
	r := env.Row(t, p.Key())
	if r.State != facilitator.StateCanceled || r.ErrorReason != facilitator.ReasonNonceAlreadyUsed {
		t.Fatalf("ledger: %+v, want canceled", r)
	}
	st, found, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil || !found || st.State != facilitator.StatusCanceled || st.Basis != "ledger" {
		t.Fatalf("status: %+v %v %v, want canceled from the ledger", st, found, err)
	}
	if rc := env.Receipt(t, ours); rc != nil && rc.Status != types.ReceiptStatusFailed {
		t.Fatalf("our transaction %s succeeded after the cancellation", ours)
	}
	if got := env.Balance(t, p.PayTo); got != 0 {
		t.Fatalf("payee holds %d after a cancellation", got)
	}
}

// TestReconcileLeavesNoNonceGap: when the job resolves a settlement whose transaction never landed
// (expired, used elsewhere, canceled), that transaction's nonce is still unused on chain while the
// ledger holds it. A new engine on the same signer must still get its next settlements mined.
func TestReconcileLeavesNoNonceGap(t *testing.T) {
	ctx := context.Background()
	env.StartIndexer(t)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 10_000)
	body := p.Body(t)
	signer := env.NewSigner(t)
	env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: pendingDeadline})
	env.DropPool(t)
	env.SetAutomine(t, true)
	theirs := p.SubmitElsewhere(t)
	indexedFinal(t, env.Receipt(t, theirs).BlockNumber.Uint64(), 2)
	runSettlements(t, jobs(t, 2, later))
	if r := env.Row(t, p.Key()); r.State != facilitator.StateSettledElsewhere {
		t.Fatalf("ledger: %+v, want settled_elsewhere", r)
	}

	// The signer's key comes back with a new process: the next payment must settle.
	next := env.NewPay(t, env.FundedPayer(t, 1_000_000), 20_000)
	e2 := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: 5 * time.Second})
	out := e2.MustSettle(t, next.Body(t))
	if !out.Response.Success {
		var onChain hexutil.Uint64
		_ = env.Chain.RPC.CallContext(ctx, &onChain, "eth_getTransactionCount", stacktest.AddressOf(signer), "latest")
		t.Fatalf("a payment after the job resolved an unlanded settlement: %+v; the signer's nonce on chain is %d while "+
			"the ledger holds nonce 0 for the resolved row and the new transaction took the next: a nonce gap", out.Response, onChain)
	}
}

// TestIndexHealthRewinds: a reorg happens while no indexer runs. IndexHealth finds that the kept
// blocks are no longer canonical above the fork and rewinds the cursor to the last canonical
// block; a restarted indexer then re-indexes the new branch, and the index matches eth_getLogs.
func TestIndexHealthRewinds(t *testing.T) {
	ctx := context.Background()
	ix := env.StartIndexer(t)
	env.WaitIndexed(t, env.Head(t))
	fork := env.BlockAt(t, "latest")
	snap, err := env.Chain.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone := stacktest.AddressOf(mustKey(t))
	if err := env.Chain.USDC.Mint(ctx, gone, big.NewInt(1)); err != nil { // a transfer only the old branch has
		t.Fatal(err)
	}
	env.Mine(t)
	env.Mine(t)
	env.WaitIndexed(t, env.Head(t))
	if err := ix.Stop(); err != nil {
		t.Fatal(err)
	}
	oldCursor, _, _ := env.DB.Cursor(ctx, env.Network().ID)
	if n := countTransfersTo(t, gone); n != 1 {
		t.Fatalf("%d indexed transfers to %s before the reorg, want 1", n, gone)
	}

	if err := env.Chain.Revert(ctx, snap); err != nil {
		t.Fatal(err)
	}
	kept := stacktest.AddressOf(mustKey(t))
	if err := env.Chain.USDC.Mint(ctx, kept, big.NewInt(2)); err != nil { // and one only the new branch has
		t.Fatal(err)
	}
	for range 4 {
		env.Mine(t)
	}

	// While an indexer holds the network's lease, IndexHealth leaves the index to it: rewinding
	// under a running indexer would race its cursor.
	leadStart := time.Now()
	_, release, err := env.DB.Lead(ctx, env.Network().ID)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(leadStart); took > 500*time.Millisecond {
		t.Logf("taking the lease after the indexer stopped took %v", took)
	}
	ch, err := jobs(t, 2, later).IndexHealth(ctx)
	release()
	if err != nil || ch != (reconcile.Changes{}) {
		t.Fatalf("IndexHealth while the lease is held: %+v %v, want no change", ch, err)
	}
	if cur, _, _ := env.DB.Cursor(ctx, env.Network().ID); cur != oldCursor {
		t.Fatalf("cursor moved from %+v to %+v under a held lease", oldCursor, cur)
	}

	// Without the lease held, it rewinds. (A run that finds the lease or the job's lock taken
	// skips, silently: the test retries for a few seconds, logging why a run did nothing.)
	limit := time.Now().Add(5 * time.Second)
	for {
		ch, err = jobs(t, 2, later).IndexHealth(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Rewound != 0 || time.Now().After(limit) {
			break
		}
		rel, free, err := env.DB.TryLead(ctx, env.Network().ID)
		if free {
			rel()
		}
		relJob, freeJob, errJob := env.DB.TryLock(ctx, "index-health")
		if freeJob {
			relJob()
		}
		t.Logf("IndexHealth changed nothing: lease free %v (%v), job lock free %v (%v); retrying", free, err, freeJob, errJob)
		time.Sleep(100 * time.Millisecond)
	}
	if ch.Rewound != 1 {
		t.Fatalf("IndexHealth: %+v, want the index rewound once", ch)
	}
	cur, _, err := env.DB.Cursor(ctx, env.Network().ID)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Number != uint64(fork.Number) || cur.Hash != fork.Hash {
		t.Fatalf("cursor after the rewind: %d %s, want the fork block %d %s (it was %d)", cur.Number, cur.Hash, fork.Number, fork.Hash, oldCursor.Number)
	}
	if n := countTransfersTo(t, gone); n != 0 {
		t.Fatalf("%d indexed transfers of the orphaned branch remain after the rewind", n)
	}
	// A second run finds nothing to do.
	if ch, err := jobs(t, 2, later).IndexHealth(ctx); err != nil || ch.Rewound != 0 {
		t.Fatalf("second IndexHealth: %+v %v", ch, err)
	}

	env.StartIndexer(t)
	h := env.Head(t)
	env.WaitIndexed(t, h)
	cur, _, _ = env.DB.Cursor(ctx, env.Network().ID)
	got, want := env.IndexedLogs(t), env.ChainLogs(t, cur.Number)
	if len(got) != len(want) {
		t.Fatalf("index holds %d logs, eth_getLogs %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("log %d: index %+v, chain %+v", i, got[i], want[i])
		}
	}
	if countTransfersTo(t, kept) != 1 || countTransfersTo(t, gone) != 0 {
		t.Fatalf("after re-indexing: %d transfers to the new branch's address, %d to the old one's",
			countTransfersTo(t, kept), countTransfersTo(t, gone))
	}
}

// --- helpers ---

func updatedAt(t testing.TB, id int64) time.Time {
	t.Helper()
	var at time.Time
	if err := env.Pool.QueryRow(context.Background(), `SELECT updated_at FROM settlements WHERE id = $1`, id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func countTransfersTo(t testing.TB, to common.Address) int {
	t.Helper()
	var n int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM transfers WHERE network = $1 AND to_addr = $2`,
		env.Network().ID, to[:]).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func poolLen(t testing.TB) int {
	t.Helper()
	var st struct {
		Pending hexutil.Uint64 `json:"pending"`
		Queued  hexutil.Uint64 `json:"queued"`
	}
	if err := env.Chain.RPC.CallContext(context.Background(), &st, "txpool_status"); err != nil {
		t.Fatal(err)
	}
	return int(st.Pending + st.Queued)
}

func mustKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// rawTx is the signed bytes the ledger holds for one of our transactions.
func rawTx(t testing.TB, hash common.Hash) []byte {
	t.Helper()
	var raw []byte
	if err := env.Pool.QueryRow(context.Background(), `SELECT raw FROM settlement_txs WHERE tx_hash = $1`, hash[:]).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	return raw
}

// indexedFinal mines until block is final at depth (the mined block counts as one) and waits for
// the index to hold the head: the job decides from the index only on final blocks.
func indexedFinal(t *testing.T, block, depth uint64) {
	t.Helper()
	for env.Head(t)+1 < block+depth {
		env.Mine(t)
	}
	env.WaitIndexed(t, env.Head(t))
}
