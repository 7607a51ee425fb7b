package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// ledgerFixture is the package's ledger, migrated, with a network of its own, for the tests of
// single ledger statements.
type ledgerFixture struct {
	db      *postgres.DB
	ctx     context.Context
	network string
	signer  common.Address
}

func newLedgerFixture(t *testing.T, timeout time.Duration) *ledgerFixture {
	t.Helper()
	db := openTestDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	network := fmt.Sprintf("eip155:%d", time.Now().UnixNano()%1_000_000_000)
	if err := db.BindNetwork(ctx, network, 31337, common.HexToHash("0x03")); err != nil {
		t.Fatal(err)
	}
	return &ledgerFixture{db: db, ctx: ctx, network: network, signer: common.HexToAddress("0xd")}
}

// txRecord is a signed transaction's record with a random hash.
func txRecord() facilitator.TxRecord {
	var hash common.Hash
	rand.Read(hash[:])
	return facilitator.TxRecord{Hash: hash, Raw: hash[:], TipCap: big.NewInt(1), FeeCap: big.NewInt(2), Gas: 100_000}
}

// insert writes a new settlement of a random authorization at the signer's txNonce.
func (l *ledgerFixture) insert(t *testing.T, txNonce uint64) (int64, facilitator.TxRecord) {
	t.Helper()
	return l.insertFor(t, txNonce, "")
}

// insertFor is insert for a request made with API key keyID ("" in open mode).
func (l *ledgerFixture) insertFor(t *testing.T, txNonce uint64, keyID string) (int64, facilitator.TxRecord) {
	t.Helper()
	var nonce [32]byte
	rand.Read(nonce[:])
	tx := txRecord()
	id, err := l.db.InsertSettlement(l.ctx, &facilitator.NewSettlement{
		Key:   facilitator.AuthorizationKey{Network: l.network, Asset: common.HexToAddress("0xa"), Payer: common.HexToAddress("0xb"), Nonce: nonce},
		PayTo: common.HexToAddress("0xc"),
		Value: big.NewInt(1), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1 << 40),
		X402Version: 2, Request: []byte(`{}`), Signer: l.signer, TxNonce: txNonce, Tx: tx, KeyID: keyID,
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, tx
}

// delivered reports whether a settlement's success is claimed.
func (l *ledgerFixture) delivered(t *testing.T, id int64) bool {
	t.Helper()
	s, err := l.db.SettlementByID(l.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return s.Delivered
}

// states lists a settlement's events of the given states, oldest first.
func (l *ledgerFixture) states(t *testing.T, id int64, states ...string) []facilitator.State {
	t.Helper()
	evs, err := l.db.SettlementEvents(l.ctx, id, 0, states, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []facilitator.State
	for _, ev := range evs {
		out = append(out, ev.State)
	}
	return out
}

// TestResolveKeepsEveryStep: a node that mines on arrival can hand the watcher a receipt before the
// broadcast is recorded. The row still passes through broadcast in its event log, in order, so a
// webhook subscriber sees the whole life, and the late MarkBroadcast changes nothing.
func TestResolveKeepsEveryStep(t *testing.T) {
	l := newLedgerFixture(t, 20*time.Second)
	db, ctx := l.db, l.ctx
	insert := func(txNonce uint64) int64 { id, _ := l.insert(t, txNonce); return id }
	states := func(id int64) []facilitator.State {
		return l.states(t, id, "signed", "broadcast", "mined", "reverted", "expired", "final")
	}
	mined := facilitator.Resolution{State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 5, BlockHash: common.HexToHash("0x2")}

	early, normal, expired := insert(1), insert(2), insert(3)
	if err := db.MarkBroadcast(ctx, []int64{normal}); err != nil {
		t.Fatal(err)
	}
	r1, r2 := mined, mined
	r1.ID, r2.ID = early, normal
	if _, _, err := db.Resolve(ctx, []facilitator.Resolution{r1, r2, {ID: expired, State: facilitator.StateExpired}}); err != nil {
		t.Fatal(err)
	}
	if err := db.MarkBroadcast(ctx, []int64{early}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]facilitator.State{"signed", "broadcast", "mined"})
	for name, id := range map[string]int64{"mined before the broadcast was recorded": early, "broadcast then mined": normal} {
		if got := fmt.Sprint(states(id)); got != want {
			t.Errorf("%s: events %s, want %s", name, got, want)
		}
	}
	// An outcome read from the clock never sent anything: no broadcast step is invented.
	if got, want := fmt.Sprint(states(expired)), fmt.Sprint([]facilitator.State{"signed", "expired"}); got != want {
		t.Errorf("expired: events %s, want %s", got, want)
	}
	s, err := db.SettlementByID(ctx, early)
	if err != nil || s.State != facilitator.StateMined {
		t.Fatalf("late MarkBroadcast moved the row: %+v, %v", s, err)
	}
}

// TestResolveRacingMarkBroadcast: the sender's MarkBroadcast and the watcher's Resolve of the same
// rows race; whichever wins, each row has exactly one broadcast event, before its mined one.
func TestResolveRacingMarkBroadcast(t *testing.T) {
	l := newLedgerFixture(t, 60*time.Second)
	db, ctx := l.db, l.ctx
	const n = 150
	ids := make([]int64, n)
	for i := range ids {
		ids[i], _ = l.insert(t, uint64(i))
	}
	errs := make(chan error, 2)
	go func() {
		for _, id := range ids {
			if err := db.MarkBroadcast(ctx, []int64{id}); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	go func() {
		for _, id := range ids {
			r := facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 5, BlockHash: common.HexToHash("0x2")}
			if _, _, err := db.Resolve(ctx, []facilitator.Resolution{r}); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprint([]facilitator.State{"signed", "broadcast", "mined"})
	for _, id := range ids {
		if got := fmt.Sprint(l.states(t, id, "signed", "broadcast", "mined")); got != want {
			t.Fatalf("settlement %d: events %v, want %s", id, got, want)
		}
	}
}

// TestMoveNonce: a settlement whose tx nonce a foreign transaction took moves to a new nonce with
// its re-signed transaction, in one statement: every earlier variant stays, the new one is the
// latest, the signer's highest nonce follows, a nonce another settlement holds is refused as
// ErrNonceTaken, and a settlement that is no longer open is not moved.
func TestMoveNonce(t *testing.T) {
	l := newLedgerFixture(t, 20*time.Second)
	db, ctx, network, signer, record := l.db, l.ctx, l.network, l.signer, txRecord
	insert := func(txNonce uint64) (int64, facilitator.TxRecord) { return l.insert(t, txNonce) }
	moved, first := insert(0)
	other, _ := insert(1)

	if err := db.MoveNonce(ctx, moved, 1, record()); err != facilitator.ErrNonceTaken {
		t.Fatalf("moving onto another settlement's nonce: %v, want ErrNonceTaken", err)
	}
	resigned := record()
	if err := db.MoveNonce(ctx, moved, 2, resigned); err != nil {
		t.Fatal(err)
	}
	s, err := db.SettlementByID(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	if s.TxNonce != 2 || s.TxHash != resigned.Hash || s.State != facilitator.StateSigned {
		t.Fatalf("after the move: nonce %d, hash %s, state %s", s.TxNonce, s.TxHash, s.State)
	}
	if top, ok, err := db.MaxTxNonce(ctx, network, signer); err != nil || !ok || top != 2 {
		t.Fatalf("MaxTxNonce %d %v %v, want 2", top, ok, err)
	}
	open, err := db.OpenSettlements(ctx, network, signer)
	if err != nil {
		t.Fatal(err)
	}
	if len(open) != 2 || open[0].ID != other || open[1].ID != moved {
		t.Fatalf("open settlements in tx nonce order: %+v", open)
	}
	if txs := open[1].Txs; len(txs) != 2 || txs[0].Hash != first.Hash || txs[1].Hash != resigned.Hash {
		t.Fatalf("variants %+v: want the first, then the re-signed one", txs)
	}
	if got, err := db.SettlementByTx(ctx, first.Hash); err != nil || got.ID != moved {
		t.Fatalf("the first variant still names its settlement: %v %v", got, err)
	}
	evs, err := db.SettlementEvents(ctx, moved, 0, []string{"renonced"}, 10)
	if err != nil || len(evs) != 1 {
		t.Fatalf("renonced events: %+v %v", evs, err)
	}

	// A failed settlement still moves (its nonce may be a gap below the key's others: filling it
	// moves the settlement down); a mined one does not.
	if _, _, err := db.Resolve(ctx, []facilitator.Resolution{{ID: other, State: facilitator.StateExpired}}); err != nil {
		t.Fatal(err)
	}
	if err := db.MoveNonce(ctx, other, 3, record()); err != nil {
		t.Fatalf("moving a failed settlement: %v", err)
	}
	minedID, _ := insert(4)
	if _, _, err := db.Resolve(ctx, []facilitator.Resolution{{ID: minedID, State: facilitator.StateMined, TxHash: common.HexToHash("0x9"), BlockNumber: 5,
		BlockHash: common.HexToHash("0x2")}}); err != nil {
		t.Fatal(err)
	}
	if err := db.MoveNonce(ctx, minedID, 5, record()); err != facilitator.ErrNotFound {
		t.Fatalf("moving a mined settlement: %v, want ErrNotFound", err)
	}
	if s, err := db.SettlementByID(ctx, minedID); err != nil || s.TxNonce != 4 {
		t.Fatalf("the mined settlement changed: %+v %v", s, err)
	}
}

// TestWritesThatMatchNoRow: a ledger write that finds its row no longer in the state it moves
// from says so (the engine then re-reads the row), and writes nothing: Resolve and MarkFinal
// return only the ids they moved, Reopen of a row that is not mined and AddTx to a row that is no
// longer open answer ErrNotFound.
func TestWritesThatMatchNoRow(t *testing.T) {
	l := newLedgerFixture(t, 20*time.Second)
	db, ctx := l.db, l.ctx
	open, _ := l.insert(t, 0)
	done, _ := l.insert(t, 1)
	mined := facilitator.Resolution{State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 5, BlockHash: common.HexToHash("0x2")}
	mined.ID = done
	if moved, _, err := db.Resolve(ctx, []facilitator.Resolution{mined}); err != nil || fmt.Sprint(moved) != fmt.Sprint([]int64{done}) {
		t.Fatalf("first Resolve moved %v, %v; want [%d]", moved, err, done)
	}
	expired := facilitator.Resolution{ID: done, State: facilitator.StateExpired}
	if moved, _, err := db.Resolve(ctx, []facilitator.Resolution{expired}); err != nil || len(moved) != 0 {
		t.Fatalf("Resolve of a mined row moved %v, %v; want nothing", moved, err)
	}
	if moved, err := db.MarkFinal(ctx, []facilitator.MinedIn{{ID: open, BlockHash: mined.BlockHash}, {ID: done, BlockHash: mined.BlockHash}}); err != nil || fmt.Sprint(moved) != fmt.Sprint([]int64{done}) {
		t.Fatalf("MarkFinal moved %v, %v; want only the mined [%d]", moved, err, done)
	}
	if err := db.Reopen(ctx, facilitator.MinedIn{ID: done, BlockHash: mined.BlockHash}, "test"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("Reopen of a final row: %v, want ErrNotFound", err)
	}
	if err := db.Reopen(ctx, facilitator.MinedIn{ID: open, BlockHash: mined.BlockHash}, "test"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("Reopen of an open row: %v, want ErrNotFound", err)
	}
	before := len(l.states(t, done, "signed", "broadcast", "mined", "final", "bumped"))
	if err := db.AddTx(ctx, done, txRecord()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("AddTx to a final row: %v, want ErrNotFound", err)
	}
	if after := len(l.states(t, done, "signed", "broadcast", "mined", "final", "bumped")); after != before {
		t.Fatalf("AddTx to a final row wrote events: %d, was %d", after, before)
	}
	if err := db.AddTx(ctx, open, txRecord()); err != nil {
		t.Fatalf("AddTx to an open row: %v", err)
	}
	s, err := db.SettlementByID(ctx, done)
	if err != nil || s.State != facilitator.StateFinal || s.BlockHash != mined.BlockHash {
		t.Fatalf("final row %+v, %v: want final with its block hash", s, err)
	}
}

// TestClaimDeliveryKey: a settlement's success can be claimed only with the API key that created
// it; a claim with another key, or in open mode, fails and leaves the success to the creator's
// key. A settlement created in open mode is claimed only in open mode.
func TestClaimDeliveryKey(t *testing.T) {
	l := newLedgerFixture(t, 20*time.Second)
	db, ctx := l.db, l.ctx
	keyed, _ := l.insertFor(t, 1, "key_a")
	open, _ := l.insertFor(t, 2, "")
	for i, id := range []int64{keyed, open} {
		r := facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: common.BigToHash(big.NewInt(int64(i + 1))), BlockNumber: 5,
			BlockHash: common.HexToHash("0x2")}
		if _, _, err := db.Resolve(ctx, []facilitator.Resolution{r}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(id int64, key string, want bool) {
		t.Helper()
		got, err := db.ClaimDelivery(ctx, id, key, []byte("claim of "+key), time.Minute)
		if err != nil || got != want {
			t.Fatalf("ClaimDelivery(%d, %q) = %v, %v; want %v", id, key, got, err, want)
		}
	}
	delivered := func(id int64) bool { t.Helper(); return l.delivered(t, id) }

	claim(keyed, "key_b", false)
	claim(keyed, "", false)
	if delivered(keyed) {
		t.Fatal("a claim with the wrong key marked the success delivered")
	}
	claim(keyed, "key_a", true)
	// One success, even for its own key: undecided until the first claim's answer is confirmed
	// written, then refused.
	if ok, err := db.ClaimDelivery(ctx, keyed, "key_a", []byte("second"), time.Minute); ok || !errors.Is(err, facilitator.ErrClaimUndecided) {
		t.Fatalf("a second claim while the first is undecided = %v, %v; want ErrClaimUndecided", ok, err)
	}
	if lapsed, err := db.ConfirmDeliveries(ctx, []facilitator.Delivery{{ID: keyed, Claim: []byte("claim of key_a")}}); err != nil || len(lapsed) != 0 {
		t.Fatalf("confirming the claim = %v, %v", lapsed, err)
	}
	claim(keyed, "key_a", false)
	claim(keyed, "key_b", false) // another key is told it was settled, never that it is undecided

	claim(open, "key_a", false)
	claim(open, "", true)
}

// TestResolveClaims: a resolution's claim is recorded with the outcome under ClaimDelivery's
// rules (a mined outcome without an error reason, nothing delivered yet, the settlement's own
// key), and only then: the claimed ids say which, the row says delivered with that token (which
// ReleaseDelivery alone undoes), and nobody else can claim the success afterwards.
func TestResolveClaims(t *testing.T) {
	l := newLedgerFixture(t, 20*time.Second)
	db, ctx := l.db, l.ctx
	mined := func(id int64, key, token string) facilitator.Resolution {
		return facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: common.BigToHash(big.NewInt(id)), BlockNumber: 5,
			BlockHash: common.HexToHash("0x2"), Claim: &facilitator.SuccessClaim{KeyID: key, Token: []byte(token), Lease: time.Minute}}
	}
	open, _ := l.insertFor(t, 1, "")
	keyed, _ := l.insertFor(t, 2, "key_a")
	wrongKey, _ := l.insertFor(t, 3, "key_a")
	mismatch, _ := l.insertFor(t, 4, "")
	reverted, _ := l.insertFor(t, 5, "")
	unclaimed, _ := l.insertFor(t, 6, "")
	mis := mined(mismatch, "", "t-mismatch")
	mis.ErrorReason = facilitator.ReasonTransactionFailed
	rev := mined(reverted, "", "t-reverted")
	rev.State = facilitator.StateReverted
	plain := mined(unclaimed, "", "")
	plain.Claim = nil
	moved, claimed, err := db.Resolve(ctx, []facilitator.Resolution{
		mined(open, "", "t-open"), mined(keyed, "key_a", "t-keyed"), mined(wrongKey, "key_b", "t-wrong"), mis, rev, plain})
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != 6 {
		t.Fatalf("moved %v, want all 6", moved)
	}
	if got, want := fmt.Sprint(sortedIDs(claimed)), fmt.Sprint(sortedIDs([]int64{open, keyed})); got != want {
		t.Fatalf("claimed %s, want %s (the open-mode and own-key claims of clean mined outcomes)", got, want)
	}
	delivered := func(id int64) bool { t.Helper(); return l.delivered(t, id) }
	for name, id := range map[string]int64{"another key's claim": wrongKey, "an outcome with an error reason": mismatch,
		"a reverted outcome": reverted, "no claim": unclaimed} {
		if delivered(id) {
			t.Errorf("%s marked the success delivered", name)
		}
	}
	// The recorded claims are the successes: nobody claims them again, until their own token
	// releases them.
	for id, key := range map[int64]string{open: "", keyed: "key_a"} {
		if ok, err := db.ClaimDelivery(ctx, id, key, []byte("second"), time.Minute); ok || !errors.Is(err, facilitator.ErrClaimUndecided) {
			t.Fatalf("ClaimDelivery after a recorded claim = %v, %v; want ErrClaimUndecided", ok, err)
		}
	}
	if err := db.ReleaseDelivery(ctx, keyed, []byte("t-wrong")); err != nil || !delivered(keyed) {
		t.Fatalf("another token released the claim: %v", err)
	}
	if err := db.ReleaseDelivery(ctx, keyed, []byte("t-keyed")); err != nil || delivered(keyed) {
		t.Fatalf("its own token did not release the claim: %v", err)
	}
	if ok, err := db.ClaimDelivery(ctx, keyed, "key_a", []byte("next"), time.Minute); err != nil || !ok {
		t.Fatalf("ClaimDelivery after the release = %v, %v; want true", ok, err)
	}
	// The wrong key's settlement is still its own key's to claim.
	if ok, err := db.ClaimDelivery(ctx, wrongKey, "key_a", []byte("own"), time.Minute); err != nil || !ok {
		t.Fatalf("ClaimDelivery by the settlement's key = %v, %v; want true", ok, err)
	}
	// A reorganised settlement keeps the success it delivered: mined again, no claim is taken.
	if err := db.Reopen(ctx, facilitator.MinedIn{ID: open, BlockHash: common.HexToHash("0x2")}, "test"); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := db.Resolve(ctx, []facilitator.Resolution{mined(open, "", "t-again")}); err != nil || len(claimed) != 0 {
		t.Fatalf("re-mined settlement claimed %v, %v; want nothing (its success was delivered)", claimed, err)
	}
	if err := db.ReleaseDelivery(ctx, open, []byte("t-again")); err != nil || !delivered(open) {
		t.Fatalf("the second claim's token released the first: %v", err)
	}
}

func sortedIDs(ids []int64) []int64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}
