package settle_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// The tests below reorganise the chain (anvil_reorg) inside the finality window, after the
// engine recorded a settlement mined and before it is final, into a new branch that mines the
// settlement's very transaction again: one block later, or after a third party's transfer of the
// same authorization, or after the payer's cancelAuthorization of it (ours then reverts). Each
// then mines past finality and checks that the ledger row, its events, a later /settle of the
// same payload, the status service and the balances all tell the new branch's story.

// reorgFinality is the engine's finality depth in these tests: deep enough that a reorg of one
// or two blocks after the settlement is mined happens before it is final.
const reorgFinality = 4

// reorged is a settlement whose transaction the first branch mined: the engine has it mined,
// not final.
type reorged struct {
	r      *stacktest.Engine
	p      stacktest.Pay
	body   []byte
	id     int64
	ours   *types.Transaction // the mined variant, as the ledger holds it signed
	first  stacktest.Block    // the block the first branch mined it in
	payer  int64              // the payer's balance before
	payees int64              // the payee's balance before (0)
}

// minedThenReorgable settles a payment with mining off, mines its transaction in one block,
// waits for the engine to record it mined there, then mines extra empty blocks; the settlement
// stays mined, short of finality.
func minedThenReorgable(t *testing.T, extra int) *reorged {
	t.Helper()
	payer := env.FundedPayer(t, 5000) // minted while anvil still mines
	d := &reorged{p: env.NewPay(t, payer, 1000)}
	d.body = d.p.Body(t)
	env.ManualMining(t)
	d.r = env.NewEngine(t, stacktest.EngineOptions{Depth: reorgFinality, Deadline: time.Second})
	sent := d.r.SettlePending(t, d.body)
	d.payer, d.payees = env.Balance(t, d.p.From()), env.Balance(t, d.p.PayTo)

	env.Mine(t)
	rcpt := env.Receipt(t, sent)
	if rcpt == nil || rcpt.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("the settlement's transaction %s in the first branch: receipt %+v, want status 1", sent, rcpt)
	}
	d.first = env.BlockAt(t, hexutil.EncodeUint64(rcpt.BlockNumber.Uint64()))
	row := waitRow(t, d.p.Key(), 10*time.Second, func(s *facilitator.Settlement) bool { return !s.State.Open() })
	if row.State != facilitator.StateMined || row.TxHash != sent || row.BlockNumber != uint64(d.first.Number) || blockHashOf(t, row.ID) != d.first.Hash {
		t.Fatalf("ledger row after the first branch mined %s in block %d %s: %s (block hash %s), want mined there",
			sent, d.first.Number, d.first.Hash, rowString(row), blockHashOf(t, row.ID))
	}
	d.id = row.ID
	for _, raw := range txsOf(t, row.ID) {
		if tx := decodeTx(t, raw); tx.Hash() == sent {
			d.ours = tx
		}
	}
	if d.ours == nil {
		t.Fatalf("the ledger holds no signed transaction %s for settlement %d", sent, row.ID)
	}
	for range extra {
		env.Mine(t)
	}
	if row := env.Row(t, d.p.Key()); row.State != facilitator.StateMined {
		t.Fatalf("before the reorg, at head %d: ledger row %s, want still mined (finality %d)", env.Head(t), rowString(row), reorgFinality)
	}
	return d
}

// settleDown mines past finality for a transaction in block `from` of the new branch, then waits
// (bounded) for the engine to take the settlement out of signed, broadcast and mined, and
// returns its row. The bound covers the watcher's full sweep (every 10 s).
func (d *reorged) settleDown(t *testing.T, from uint64) *facilitator.Settlement {
	t.Helper()
	for env.Head(t)+1 < from+reorgFinality+1 {
		env.Mine(t)
	}
	return waitRow(t, d.p.Key(), 30*time.Second, func(s *facilitator.Settlement) bool {
		return !s.State.Open() && s.State != facilitator.StateMined
	})
}

// waitRow polls the ledger row until done accepts it or the bound passes (then the test fails).
func waitRow(t *testing.T, k facilitator.AuthorizationKey, bound time.Duration, done func(*facilitator.Settlement) bool) *facilitator.Settlement {
	t.Helper()
	limit := time.Now().Add(bound)
	for {
		row := env.Row(t, k)
		if done(row) {
			return row
		}
		if time.Now().After(limit) {
			t.Fatalf("the ledger row did not settle within %v: %s, events %v", bound, rowString(row), env.Events(t, row.ID))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// blockHashOf is the block hash the ledger records for a settlement (zero: none).
func blockHashOf(t testing.TB, id int64) common.Hash {
	t.Helper()
	var h []byte
	if err := env.Pool.QueryRow(context.Background(), `SELECT block_hash FROM settlements WHERE id = $1`, id).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return common.BytesToHash(h)
}

// canonicalBlock checks that a row naming a block names one of the current chain's.
func canonicalBlock(t *testing.T, row *facilitator.Settlement) {
	t.Helper()
	h := blockHashOf(t, row.ID)
	if row.BlockNumber == 0 && h == (common.Hash{}) {
		return
	}
	b, ok := env.BlockIf(t, hexutil.EncodeUint64(row.BlockNumber))
	if !ok || b.Hash != h {
		t.Errorf("the ledger row names block %d %s; the chain's block %d is %s (present %v)", row.BlockNumber, h, row.BlockNumber, b.Hash, ok)
	}
}

// mentionsBlock reports whether an event's detail names block n (the ledger writes "tx 0x… block n").
func mentionsBlock(ev stacktest.Event, n uint64) bool {
	return regexp.MustCompile(fmt.Sprintf(`\bblock %d\b`, n)).MatchString(ev.Detail)
}

// reorgStep reports whether an event records that the settlement's block left the chain: the
// ledger's reopen step (back to broadcast), or any step whose detail names the reorganisation.
func reorgStep(ev stacktest.Event) bool {
	return ev.State == string(facilitator.StateBroadcast) || strings.Contains(strings.ToLower(ev.Detail), "reorg")
}

// afterFirstMined checks the events up to the first branch's mined step and the reorganisation
// step after it; it returns the index of the step after the reorganisation step (-1: missing).
func (d *reorged) afterFirstMined(t *testing.T, evs []stacktest.Event) int {
	t.Helper()
	mined := -1
	for i, ev := range evs {
		if ev.State == string(facilitator.StateMined) && mentionsBlock(ev, uint64(d.first.Number)) {
			mined = i
			break
		}
	}
	if mined < 0 {
		t.Errorf("events %v: no mined step for the first branch's block %d", evs, d.first.Number)
		return -1
	}
	for i := mined + 1; i < len(evs); i++ {
		if evs[i].State == string(facilitator.StateFinal) {
			t.Errorf("events %v: final (step %d) before any step recording the reorganisation of block %d", evs, i, d.first.Number)
			return -1
		}
		if reorgStep(evs[i]) {
			return i + 1
		}
	}
	t.Errorf("events %v: no step after the first branch's mined one records the reorganisation of block %d", evs, d.first.Number)
	return -1
}

// statusNow is the status service's answer for the authorization, once the index has the head.
func (d *reorged) statusNow(t *testing.T) facilitator.AuthorizationStatus {
	t.Helper()
	svc := env.Status(env.DB, reorgFinality)
	env.StartIndexer(t)
	env.WaitIndexed(t, env.Head(t))
	st, found, err := svc.Authorization(context.Background(), d.p.Key())
	if err != nil || !found {
		t.Fatalf("status: found %v, err %v", found, err)
	}
	return st
}

// authorizationLogs is the chain's logs of topic (AuthorizationUsed or AuthorizationCanceled)
// for p's authorization.
func authorizationLogs(t testing.TB, p stacktest.Pay, topic common.Hash) []types.Log {
	t.Helper()
	var logs []types.Log
	filter := map[string]any{"fromBlock": "0x0", "toBlock": "latest", "address": []common.Address{env.Chain.USDC.Address},
		"topics": []any{topic, common.BytesToHash(p.From().Bytes()), common.Hash(p.Nonce)}}
	if err := env.Chain.RPC.CallContext(context.Background(), &logs, "eth_getLogs", filter); err != nil {
		t.Fatal(err)
	}
	return logs
}

// paid checks that the payer paid exactly value since the settlement began, and the payee
// received it.
func (d *reorged) paid(t *testing.T, value int64) {
	t.Helper()
	if got := env.Balance(t, d.p.PayTo) - d.payees; got != value {
		t.Errorf("the payee received %d, want exactly %d", got, value)
	}
	if got := d.payer - env.Balance(t, d.p.From()); got != value {
		t.Errorf("the payer paid %d, want exactly %d", got, value)
	}
}

// revertedAfterReorg is what the tests whose new branch mines ours reverted (the authorization
// used or canceled before it, in block ourBlock) check alike: past finality the settlement ends
// in end, naming a block of the current chain; its events hold no final step and end with end,
// after the reorganisation; a later /settle of the same payload is no success and no claim but
// nonce_already_used, not naming our reverted transaction. It returns the row and that answer.
func (d *reorged) revertedAfterReorg(t *testing.T, ourBlock uint64, end facilitator.State) (*facilitator.Settlement, facilitator.SettleOutcome) {
	t.Helper()
	row := d.settleDown(t, ourBlock)
	if row.State != end {
		t.Errorf("ledger row %s, want %s", rowString(row), end)
	}
	canonicalBlock(t, row)

	evs := env.Events(t, d.id)
	if n := countState(evs, facilitator.StateFinal); n != 0 {
		t.Errorf("events %v: %d final steps for a settlement whose transaction reverted", evs, n)
	}
	if i := d.afterFirstMined(t, evs); i >= 0 && (i >= len(evs) || evs[len(evs)-1].State != string(end)) {
		t.Errorf("events %v: want %s last, after the reorganisation", evs, end)
	}

	out := d.r.MustSettle(t, d.body)
	if out.Response.Success || out.Claimed || out.Response.ErrorReason != facilitator.ReasonNonceAlreadyUsed || out.Response.Transaction == d.ours.Hash().Hex() {
		t.Errorf("/settle after: %+v (claimed %v), want nonce_already_used, not naming our reverted %s", out.Response, out.Claimed, d.ours.Hash())
	}
	return row, out
}

// TestReorgMovesTransaction: the first branch mines our transaction in block N; a reorg of depth
// 2 at head N+1 replaces N and N+1 with an empty N' and an N+1' that mines the same signed
// transaction again. The settlement must end final in N+1' (row, events, status), answered once
// as a success with our hash, the payee paid exactly once.
func TestReorgMovesTransaction(t *testing.T) {
	d := minedThenReorgable(t, 1)
	moved := uint64(d.first.Number) + 1
	env.Reorg(t, 2, stacktest.BranchTx{Tx: d.ours, Block: 1})
	rcpt := env.Receipt(t, d.ours.Hash())
	if rcpt.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("our transaction in the new branch: status %d, want 1", rcpt.Status)
	}
	newBlock := env.BlockAt(t, hexutil.EncodeUint64(moved))

	row := d.settleDown(t, moved)
	if row.State != facilitator.StateFinal || row.TxHash != d.ours.Hash() || row.ErrorReason != "" {
		t.Errorf("ledger row %s, want final with %s", rowString(row), d.ours.Hash())
	}
	if row.BlockNumber != moved || blockHashOf(t, row.ID) != newBlock.Hash {
		t.Errorf("ledger row names block %d %s, want the new branch's %d %s (the first branch had %d %s)",
			row.BlockNumber, blockHashOf(t, row.ID), moved, newBlock.Hash, d.first.Number, d.first.Hash)
	}
	canonicalBlock(t, row)

	evs := env.Events(t, d.id)
	if i := d.afterFirstMined(t, evs); i >= 0 {
		again := -1
		for j := i; j < len(evs); j++ {
			if evs[j].State != string(facilitator.StateFinal) && mentionsBlock(evs[j], moved) && strings.Contains(evs[j].Detail, strings.ToLower(d.ours.Hash().Hex()[2:])) {
				again = j
				break
			}
		}
		if again < 0 {
			t.Errorf("events %v: no step records %s mined again in block %d after the reorganisation", evs, d.ours.Hash(), moved)
		}
		if finals := countState(evs, facilitator.StateFinal); finals != 1 || evs[len(evs)-1].State != string(facilitator.StateFinal) || (again >= 0 && indexOfState(evs, facilitator.StateFinal) < again) {
			t.Errorf("events %v: want one final step, the last, after the new block's", evs)
		}
	}

	out := d.r.MustSettle(t, d.body)
	if !out.Response.Success || out.Response.Transaction != d.ours.Hash().Hex() || !out.Claimed {
		t.Errorf("/settle after: %+v (claimed %v), want the success of %s", out.Response, out.Claimed, d.ours.Hash())
	}
	if again := d.r.MustSettle(t, d.body); again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled {
		t.Errorf("/settle once more: %+v, want already_settled", again.Response)
	}

	st := d.statusNow(t)
	if st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Transaction != d.ours.Hash().Hex() ||
		st.BlockNumber != moved || !st.Final {
		t.Errorf("status %+v, want settled by the facilitator with %s in block %d, final", st, d.ours.Hash(), moved)
	}

	d.paid(t, d.p.Value)
	if uses := authorizationLogs(t, d.p, eip3009.AuthorizationUsedTopic); len(uses) != 1 || uses[0].TxHash != d.ours.Hash() || uses[0].BlockNumber != moved {
		t.Errorf("AuthorizationUsed logs %+v, want one, ours in block %d", uses, moved)
	}
}

// TestReorgReincludedAfterThirdPartyTransfer: the first branch mines our transaction in block N;
// a reorg of depth 1 at head N replaces N with an N' holding a third party's
// transferWithAuthorization of the same signed authorization, then ours, which reverts. The
// settlement must end settled_elsewhere (nonce_already_used), never final; /settle must not
// answer success; the status names the third party's transaction; the payee is paid once, by it.
func TestReorgReincludedAfterThirdPartyTransfer(t *testing.T) {
	d := minedThenReorgable(t, 0)
	theirs := d.p.ElsewhereTx(t)
	env.Reorg(t, 1, stacktest.BranchTx{Tx: theirs, Block: 0}, stacktest.BranchTx{Tx: d.ours, Block: 0})
	their, our := env.Receipt(t, theirs.Hash()), env.Receipt(t, d.ours.Hash())
	if their.Status != types.ReceiptStatusSuccessful || our.Status != types.ReceiptStatusFailed || their.TransactionIndex >= our.TransactionIndex {
		t.Fatalf("the new branch: theirs status %d index %d, ours status %d index %d; want theirs first and mined, ours reverted",
			their.Status, their.TransactionIndex, our.Status, our.TransactionIndex)
	}
	newBlock := our.BlockNumber.Uint64()

	if row, _ := d.revertedAfterReorg(t, newBlock, facilitator.StateSettledElsewhere); row.ErrorReason != facilitator.ReasonNonceAlreadyUsed {
		t.Errorf("ledger row %s, want settled_elsewhere / %s", rowString(row), facilitator.ReasonNonceAlreadyUsed)
	}

	st := d.statusNow(t)
	if st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Transaction != theirs.Hash().Hex() || st.BlockNumber != newBlock {
		t.Errorf("status %+v, want settled by other with %s in block %d", st, theirs.Hash(), newBlock)
	}

	d.paid(t, d.p.Value)
	if uses := authorizationLogs(t, d.p, eip3009.AuthorizationUsedTopic); len(uses) != 1 || uses[0].TxHash != theirs.Hash() {
		t.Errorf("AuthorizationUsed logs %+v, want one, the third party's %s", uses, theirs.Hash())
	}
}

// TestReorgReincludedAfterCancel: the first branch mines our transaction in block N; a reorg of
// depth 2 at head N+1 replaces N and N+1 with an N' holding the payer's cancelAuthorization of
// the nonce and an N+1' holding ours, which reverts. The settlement must end canceled, never
// final; /settle must not answer success; the status says canceled; nothing is paid.
func TestReorgReincludedAfterCancel(t *testing.T) {
	d := minedThenReorgable(t, 1)
	cancel := env.CancelTx(t, d.p.Payer, d.p.Nonce)
	env.Reorg(t, 2, stacktest.BranchTx{Tx: cancel, Block: 0}, stacktest.BranchTx{Tx: d.ours, Block: 1})
	canceled, our := env.Receipt(t, cancel.Hash()), env.Receipt(t, d.ours.Hash())
	if canceled.Status != types.ReceiptStatusSuccessful || our.Status != types.ReceiptStatusFailed {
		t.Fatalf("the new branch: the cancel's status %d, ours %d; want the cancel mined, ours reverted", canceled.Status, our.Status)
	}
	newBlock := our.BlockNumber.Uint64()

	if _, out := d.revertedAfterReorg(t, newBlock, facilitator.StateCanceled); !strings.Contains(out.Response.ErrorMessage, "cancel") {
		t.Errorf("/settle after: %+v, want nonce_already_used for a canceled authorization", out.Response)
	}

	st := d.statusNow(t)
	if st.State != facilitator.StatusCanceled || st.SettledBy != "" {
		t.Errorf("status %+v, want canceled", st)
	}

	d.paid(t, 0)
	if uses := authorizationLogs(t, d.p, eip3009.AuthorizationUsedTopic); len(uses) != 0 {
		t.Errorf("AuthorizationUsed logs %+v, want none", uses)
	}
	if cancels := authorizationLogs(t, d.p, eip3009.AuthorizationCanceledTopic); len(cancels) != 1 || cancels[0].TxHash != cancel.Hash() {
		t.Errorf("AuthorizationCanceled logs %+v, want one, the payer's %s", cancels, cancel.Hash())
	}
}

// rowString is the fields of a ledger row these tests check.
func rowString(s *facilitator.Settlement) string {
	return fmt.Sprintf("{state %s tx %s block %d reason %q message %q delivered %v}", s.State, s.TxHash, s.BlockNumber, s.ErrorReason, s.ErrorMessage, s.Delivered)
}

func countState(evs []stacktest.Event, s facilitator.State) int {
	n := 0
	for _, ev := range evs {
		if ev.State == string(s) {
			n++
		}
	}
	return n
}

func indexOfState(evs []stacktest.Event, s facilitator.State) int {
	for i, ev := range evs {
		if ev.State == string(s) {
			return i
		}
	}
	return -1
}
