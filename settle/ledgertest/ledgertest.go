// Package ledgertest is the ledger's contract: one suite of what the engine, the reconcile jobs
// and the status answers rely on of a ledger, run against every implementation (the Postgres
// ledger, facilitator/postgres, and the simulator's, settle/settlesim), the way River runs one
// driver suite against every driver. A difference between the two is a bug in one of them, and
// the simulator proves nothing about production unless its ledger behaves as Postgres does.
package ledgertest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// Ledger is what the contract holds of a ledger: the engine's Store, and the settlement reads
// and writes of the reconcile jobs and the status answers.
type Ledger interface {
	settle.Store
	SettlementByTx(ctx context.Context, tx common.Hash) (*facilitator.Settlement, error)
	BatchMembers(ctx context.Context, network string, signer common.Address, txNonce uint64) ([]facilitator.Settlement, error)
	SettlementEvents(ctx context.Context, settlementID, after int64, states []string, limit int) ([]facilitator.SettlementEvent, error)
	StaleSettlements(ctx context.Context, network string, before time.Time, limit int) ([]facilitator.OpenSettlement, error)
	Touch(ctx context.Context, ids []int64) error
	PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error)
}

// Harness makes the ledgers under test.
type Harness struct {
	// New is an empty ledger for one test, on which network is a network rows may use (the
	// Postgres ledger binds it).
	New func(t *testing.T) (l Ledger, network string)
	// Events lists a settlement's event states, oldest first.
	Events func(t *testing.T, l Ledger, id int64) []string
	// Now is the ledger's clock (updated_at's); Pass lets at least d of it go by.
	Now  func(l Ledger) time.Time
	Pass func(l Ledger, d time.Duration)
	// Leasers, when set, are two processes' signer leases over l (the Postgres ledger's advisory
	// locks, or the simulator's Leaser), and Cut ends the session of the lease of signer on network
	// under its live process (a connection cut: Postgres terminates the backend). The contract
	// then holds SignerLeases of them.
	Leasers func(t *testing.T, l Ledger) (a, b settle.Leaser)
	Cut     func(t *testing.T, l Ledger, network string, signer common.Address)
}

// Run runs the contract against h's ledgers.
func Run(t *testing.T, h Harness) {
	for _, c := range []struct {
		name string
		f    func(t *testing.T, f *fixture)
	}{
		{"InsertAndRead", insertAndRead},
		{"UniqueKeys", uniqueKeys},
		{"GroupCommit", groupCommit},
		{"BatchSlots", batchSlots},
		{"Transitions", transitions},
		{"NoMatchWrites", noMatchWrites},
		{"JudgedBlock", judgedBlock},
		{"AddTx", addTx},
		{"MoveNonce", moveNonce},
		{"MoveBatch", moveBatch},
		{"ClosedFrom", closedFrom},
		{"Claims", claims},
		{"ClaimWithResolve", claimWithResolve},
		{"ClaimLeases", claimLeases},
		{"EdgeCases", edgeCases},
		{"BatchMembers", batchMembers},
		{"StaleAndTouch", staleAndTouch},
		{"SettlementEvents", settlementEvents},
		{"ConcurrentInserts", concurrentInserts},
		{"ConcurrentClaims", concurrentClaims},
		{"ConcurrentResolves", concurrentResolves},
		{"SignerLeases", signerLeases},
		{"Adopt", adopt},
		{"AdoptBatch", adoptBatch},
		{"ConcurrentAdopts", concurrentAdopts},
		{"AdoptPaymentID", adoptPaymentID},
		{"AdoptInPlace", adoptInPlace},
		{"AdoptOtherKey", adoptOtherKey},
		{"AdoptCorrectsElsewhere", adoptCorrectsElsewhere},
	} {
		if c.name == "SignerLeases" && h.Leasers == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			l, network := h.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			c.f(t, &fixture{l: l, h: h, ctx: ctx, network: network, signer: randomAddress()})
		})
	}
}

type fixture struct {
	l       Ledger
	h       Harness
	ctx     context.Context
	network string
	signer  common.Address
}

func randomAddress() common.Address {
	var a common.Address
	rand.Read(a[:])
	return a
}

// sameSet: the ledger's writes report the ids they moved in no particular order (callers take
// them as a set).
func sameSet(a, b []int64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("pay_%x", b)
}

func randomTx() facilitator.TxRecord {
	var h common.Hash
	rand.Read(h[:])
	return facilitator.TxRecord{Hash: h, Raw: h[:], TipCap: big.NewInt(1), FeeCap: big.NewInt(3), Gas: 120_000}
}

// row is a new settlement of a fresh authorization, signed by the fixture's signer at txNonce.
func (f *fixture) row(txNonce uint64) *facilitator.NewSettlement {
	var nonce [32]byte
	rand.Read(nonce[:])
	return &facilitator.NewSettlement{
		Key:   facilitator.AuthorizationKey{Network: f.network, Asset: common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3"), Payer: randomAddress(), Nonce: nonce},
		PayTo: randomAddress(), Value: big.NewInt(10), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(2_000_000_000),
		X402Version: 2, Request: []byte(`{}`), Signer: f.signer, TxNonce: txNonce, Tx: randomTx(), GasReserved: big.NewInt(360_000),
	}
}

func (f *fixture) insert(t *testing.T, s *facilitator.NewSettlement) int64 {
	t.Helper()
	id, err := f.l.InsertSettlement(f.ctx, s)
	if err != nil {
		t.Fatalf("InsertSettlement: %v", err)
	}
	return id
}

func (f *fixture) get(t *testing.T, id int64) *facilitator.Settlement {
	t.Helper()
	s, err := f.l.SettlementByID(f.ctx, id)
	if err != nil {
		t.Fatalf("SettlementByID(%d): %v", id, err)
	}
	return s
}

func (f *fixture) events(t *testing.T, id int64) string {
	t.Helper()
	return fmt.Sprint(f.h.Events(t, f.l, id))
}

func (f *fixture) resolve(t *testing.T, rs ...facilitator.Resolution) (moved, claimed []int64) {
	t.Helper()
	moved, claimed, err := f.l.Resolve(f.ctx, rs)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return moved, claimed
}

// claimLease is the contract's claims' lease: longer than any test here, but for ClaimLease's.
const claimLease = time.Hour

// claim is ClaimDelivery with the contract's lease; undecided reports ErrClaimUndecided.
func (f *fixture) claim(t *testing.T, id int64, key, token string) (ok, undecided bool) {
	t.Helper()
	ok, err := f.l.ClaimDelivery(f.ctx, id, key, []byte(token), claimLease)
	if errors.Is(err, facilitator.ErrClaimUndecided) {
		return false, true
	}
	if err != nil {
		t.Fatalf("ClaimDelivery(%d): %v", id, err)
	}
	return ok, false
}

// confirm records that the claim token's answer was written; it returns the ids that lapsed.
func (f *fixture) confirm(t *testing.T, ds ...facilitator.Delivery) []int64 {
	t.Helper()
	lapsed, err := f.l.ConfirmDeliveries(f.ctx, ds)
	if err != nil {
		t.Fatalf("ConfirmDeliveries: %v", err)
	}
	return lapsed
}

func mined(id int64) facilitator.Resolution {
	return facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 5, BlockHash: common.HexToHash("0x2")}
}

// minedIn names rows as mined where mined() puts them.
func minedIn(ids ...int64) []facilitator.MinedIn {
	out := make([]facilitator.MinedIn, len(ids))
	for i, id := range ids {
		out[i] = facilitator.MinedIn{ID: id, BlockHash: mined(id).BlockHash}
	}
	return out
}

func (f *fixture) openIDs(t *testing.T) []int64 {
	t.Helper()
	open, err := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if err != nil {
		t.Fatalf("OpenSettlements: %v", err)
	}
	var ids []int64
	for _, o := range open {
		ids = append(ids, o.ID)
	}
	return ids
}

func insertAndRead(t *testing.T, f *fixture) {
	s := f.row(3)
	s.KeyID = "0123456789ab"
	id := f.insert(t, s)
	for name, read := range map[string]func() (*facilitator.Settlement, error){
		"by id":  func() (*facilitator.Settlement, error) { return f.l.SettlementByID(f.ctx, id) },
		"by key": func() (*facilitator.Settlement, error) { return f.l.SettlementByKey(f.ctx, s.Key) },
		"by tx":  func() (*facilitator.Settlement, error) { return f.l.SettlementByTx(f.ctx, s.Tx.Hash) },
	} {
		got, err := read()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.ID != id || got.Key != s.Key || got.PayTo != s.PayTo || got.Value.Cmp(s.Value) != 0 || got.ValidBefore.Cmp(s.ValidBefore) != 0 ||
			got.Signer != s.Signer || got.TxNonce != 3 || got.BatchSlot != 0 || got.State != facilitator.StateSigned || got.TxHash != s.Tx.Hash ||
			got.BlockNumber != 0 || got.ErrorReason != "" || got.Delivered {
			t.Fatalf("%s: %+v, want the row as inserted, signed", name, got)
		}
	}
	if _, err := f.l.SettlementByID(f.ctx, id+1000); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("an unknown id: %v, want ErrNotFound", err)
	}
	if _, err := f.l.SettlementByTx(f.ctx, randomTx().Hash); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("an unknown tx: %v, want ErrNotFound", err)
	}
	other := s.Key
	other.Nonce[0]++
	if _, err := f.l.SettlementByKey(f.ctx, other); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("an unknown key: %v, want ErrNotFound", err)
	}
	open, err := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if err != nil || len(open) != 1 || open[0].ID != id || len(open[0].Txs) != 1 || open[0].Txs[0].Hash != s.Tx.Hash ||
		string(open[0].Txs[0].Raw) != string(s.Tx.Raw) {
		t.Fatalf("OpenSettlements: %+v %v", open, err)
	}
	if other, err := f.l.OpenSettlements(f.ctx, f.network, randomAddress()); err != nil || len(other) != 0 {
		t.Fatalf("another signer's open settlements: %+v %v", other, err)
	}
	held, err := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0)
	if err != nil || fmt.Sprint(held) != "[3]" {
		t.Fatalf("NoncesHeld: %v %v", held, err)
	}
	if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 4); len(held) != 0 {
		t.Fatalf("NoncesHeld from 4: %v", held)
	}
	if got := f.events(t, id); got != "[signed]" {
		t.Fatalf("events %s", got)
	}
	if w, err := f.l.WalletCapWait(f.ctx, f.network, s.Key.Asset, s.Key.Payer, big.NewInt(1), facilitator.Limits{}); err != nil || w != 0 {
		t.Fatalf("WalletCapWait without caps: %v %v", w, err)
	}
}

func uniqueKeys(t *testing.T, f *fixture) {
	first := f.row(0)
	pid := randomID()
	first.PaymentID = &facilitator.PaymentIDBinding{Scope: "key1", ID: pid}
	f.insert(t, first)
	for _, tc := range []struct {
		name string
		edit func(s *facilitator.NewSettlement)
		want error
	}{
		{"same authorization", func(s *facilitator.NewSettlement) { s.Key = first.Key }, facilitator.ErrDuplicate},
		{"same signer nonce", func(s *facilitator.NewSettlement) { s.TxNonce = 0 }, facilitator.ErrNonceTaken},
		{"same transaction", func(s *facilitator.NewSettlement) { s.Tx = first.Tx }, facilitator.ErrDuplicate},
		{"same payment id", func(s *facilitator.NewSettlement) {
			s.PaymentID = &facilitator.PaymentIDBinding{Scope: "key1", ID: pid}
		}, facilitator.ErrPaymentIDTaken},
	} {
		s := f.row(1)
		tc.edit(s)
		if _, err := f.l.InsertSettlement(f.ctx, s); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); fmt.Sprint(held) != "[0]" {
			t.Fatalf("%s: a refused insert wrote a row (nonces held %v)", tc.name, held)
		}
	}
	// What differs in one field only is another row.
	s := f.row(0)
	s.Signer = randomAddress()
	f.insert(t, s)
	s = f.row(1)
	s.PaymentID = &facilitator.PaymentIDBinding{Scope: "key2", ID: pid}
	f.insert(t, s)
}

func groupCommit(t *testing.T, f *fixture) {
	rows := []*facilitator.NewSettlement{f.row(0), f.row(1), f.row(1)}
	if _, err := f.l.InsertSettlements(f.ctx, rows); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("a group colliding with itself: %v, want ErrNonceTaken", err)
	}
	if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); len(held) != 0 {
		t.Fatalf("a refused group wrote rows (nonces held %v)", held)
	}
	taken := f.row(5)
	f.insert(t, taken)
	_ = taken
	dup := f.row(2)
	dup.Key = taken.Key
	if _, err := f.l.InsertSettlements(f.ctx, []*facilitator.NewSettlement{f.row(1), dup}); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Fatalf("a group with a known authorization: %v, want ErrDuplicate", err)
	}
	ids, err := f.l.InsertSettlements(f.ctx, []*facilitator.NewSettlement{f.row(0), f.row(1)})
	if err != nil || len(ids) != 2 || ids[0] >= ids[1] {
		t.Fatalf("a group: %v %v, want two ascending ids", ids, err)
	}
	if got := f.openIDs(t); len(got) != 3 || got[0] != ids[0] || got[1] != ids[1] {
		t.Fatalf("open %v, want %v then the row at nonce 5, in tx nonce order", got, ids)
	}
	if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); fmt.Sprint(held) != "[0 1 5]" {
		t.Fatalf("nonces held %v, want [0 1 5]", held)
	}
}

// batch inserts n members of one batch at txNonce, slots 0..n-1, sharing one transaction.
func (f *fixture) batch(t *testing.T, txNonce uint64, n int) ([]int64, facilitator.TxRecord) {
	t.Helper()
	tx := randomTx()
	rows := make([]*facilitator.NewSettlement, n)
	for i := range rows {
		rows[i] = f.row(txNonce)
		rows[i].BatchSlot, rows[i].Tx = i, tx
	}
	ids, err := f.l.InsertSettlements(f.ctx, rows)
	if err != nil {
		t.Fatalf("a batch's group: %v", err)
	}
	return ids, tx
}

func batchSlots(t *testing.T, f *fixture) {
	ids, tx := f.batch(t, 4, 3)
	for i, id := range ids {
		s := f.get(t, id)
		if s.TxNonce != 4 || s.BatchSlot != i || s.TxHash != tx.Hash {
			t.Fatalf("member %d: %+v, want slot %d at nonce 4 with the batch's transaction", i, s, i)
		}
	}
	if s, err := f.l.SettlementByTx(f.ctx, tx.Hash); err != nil || s.ID != ids[0] {
		t.Fatalf("by the batch's transaction: %+v %v, want its first member", s, err)
	}
	open, err := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if err != nil || len(open) != 3 {
		t.Fatalf("open %+v %v", open, err)
	}
	for i, o := range open {
		if o.ID != ids[i] || len(o.Txs) != 1 || o.Txs[0].Hash != tx.Hash {
			t.Fatalf("open member %d: %+v, want the batch's transaction", i, o)
		}
	}
	// Every member holds the batch's nonce (the engine reads the set, not a count).
	if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); fmt.Sprint(slices.Compact(held)) != "[4]" {
		t.Fatalf("nonces held %v", held)
	}
	// A second slot 0 at the nonce is another transaction's: refused.
	s := f.row(4)
	if _, err := f.l.InsertSettlement(f.ctx, s); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("another lone row at the batch's nonce: %v, want ErrNonceTaken", err)
	}
	// A bump of the batch is recorded once and every member sees it.
	bump := randomTx()
	if err := f.l.AddTx(f.ctx, ids[0], bump); err != nil {
		t.Fatal(err)
	}
	open, _ = f.l.OpenSettlements(f.ctx, f.network, f.signer)
	for i, o := range open {
		if len(o.Txs) != 2 || o.Txs[1].Hash != bump.Hash {
			t.Fatalf("member %d after the bump: %+v", i, o.Txs)
		}
		if s := f.get(t, o.ID); s.TxHash != bump.Hash {
			t.Fatalf("member %d's hash after the bump: %s", i, s.TxHash)
		}
	}
}

func transitions(t *testing.T, f *fixture) {
	early, normal, expired := f.insert(t, f.row(0)), f.insert(t, f.row(1)), f.insert(t, f.row(2))
	if err := f.l.MarkBroadcast(f.ctx, []int64{normal}); err != nil {
		t.Fatal(err)
	}
	if s := f.get(t, normal); s.State != facilitator.StateBroadcast {
		t.Fatalf("after MarkBroadcast: %s", s.State)
	}
	moved, _ := f.resolve(t, mined(normal), mined(early), facilitator.Resolution{ID: expired, State: facilitator.StateExpired,
		ErrorReason: facilitator.ReasonValidBefore, ErrorMessage: "validBefore passed"})
	if !sameSet(moved, []int64{normal, early, expired}) {
		t.Fatalf("Resolve moved %v, want every open row (in any order)", moved)
	}
	if moved, _ := f.resolve(t, mined(normal)); len(moved) != 0 {
		t.Fatalf("a second Resolve moved %v", moved)
	}
	// A receipt before the broadcast was recorded: the broadcast still shows in the life.
	if err := f.l.MarkBroadcast(f.ctx, []int64{early}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int64]string{early: "[signed broadcast mined]", normal: "[signed broadcast mined]", expired: "[signed expired]"} {
		if got := f.events(t, id); got != want {
			t.Errorf("settlement %d: events %s, want %s", id, got, want)
		}
	}
	s := f.get(t, early)
	if s.State != facilitator.StateMined || s.TxHash != common.HexToHash("0x1") || s.BlockNumber != 5 || s.BlockHash != common.HexToHash("0x2") {
		t.Fatalf("mined row %+v", s)
	}
	if s := f.get(t, expired); s.State != facilitator.StateExpired || s.ErrorReason != facilitator.ReasonValidBefore || s.ErrorMessage != "validBefore passed" {
		t.Fatalf("expired row %+v", s)
	}
	if got := f.openIDs(t); fmt.Sprint(got) != fmt.Sprint([]int64{early, normal}) {
		t.Fatalf("open %v: mined rows are still watched, failed ones are not", got)
	}
	if err := f.l.Reopen(f.ctx, minedIn(early)[0], "reorganised away"); err != nil {
		t.Fatal(err)
	}
	if s := f.get(t, early); s.State != facilitator.StateBroadcast || s.BlockNumber != 0 {
		t.Fatalf("reopened %+v: want broadcast, no block", s)
	}
	finals, err := f.l.MarkFinal(f.ctx, minedIn(early, normal, expired))
	if err != nil || !sameSet(finals, []int64{normal}) {
		t.Fatalf("MarkFinal moved %v %v, want only the mined one", finals, err)
	}
	if got := f.events(t, normal); got != "[signed broadcast mined final]" {
		t.Errorf("events %s", got)
	}
	if got := f.events(t, early); got != "[signed broadcast mined broadcast]" {
		t.Errorf("events %s", got)
	}
	if got := f.openIDs(t); fmt.Sprint(got) != fmt.Sprint([]int64{early}) {
		t.Fatalf("open %v", got)
	}
}

// judgedBlock: MarkFinal and Reopen rest on a judgement of the block a settlement was mined in;
// a row another writer has moved to another block since (a reorg re-included its transaction)
// stays as it is, and a row still in the judged block moves. Marking a row final by a judgement of
// a block it has left answered the status of a payment final in a block without its transfer.
func judgedBlock(t *testing.T, f *fixture) {
	a, b := f.insert(t, f.row(0)), f.insert(t, f.row(1))
	f.resolve(t, mined(a), mined(b))
	elsewhere := func(id int64) facilitator.MinedIn {
		return facilitator.MinedIn{ID: id, BlockHash: common.HexToHash("0x3")} // the block a reorg took away
	}
	if got, err := f.l.MarkFinal(f.ctx, []facilitator.MinedIn{elsewhere(a), minedIn(b)[0]}); err != nil || fmt.Sprint(got) != fmt.Sprint([]int64{b}) {
		t.Fatalf("MarkFinal by a judgement of another block: moved %v %v, want only [%d]", got, err, b)
	}
	if err := f.l.Reopen(f.ctx, elsewhere(a), "reorganised away"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("Reopen by a judgement of another block: %v, want ErrNotFound", err)
	}
	if s := f.get(t, a); s.State != facilitator.StateMined || s.BlockHash != mined(a).BlockHash || f.events(t, a) != "[signed broadcast mined]" {
		t.Fatalf("after writes judging another block: %+v, events %s; want it mined where it was", s, f.events(t, a))
	}
	if got, err := f.l.MarkFinal(f.ctx, minedIn(a)); err != nil || fmt.Sprint(got) != fmt.Sprint([]int64{a}) {
		t.Fatalf("MarkFinal by a judgement of its block: moved %v %v", got, err)
	}
}

// noMatchWrites: a write that finds no row in the state it moves from changes nothing and says
// so by its result, never by writing anyway.
func noMatchWrites(t *testing.T, f *fixture) {
	open, minedRow, final, failed := f.insert(t, f.row(0)), f.insert(t, f.row(1)), f.insert(t, f.row(2)), f.insert(t, f.row(3))
	f.resolve(t, mined(minedRow), mined(final), facilitator.Resolution{ID: failed, State: facilitator.StateReverted, ErrorReason: facilitator.ReasonTransactionFailed})
	if got, err := f.l.MarkFinal(f.ctx, minedIn(final)); err != nil || len(got) != 1 {
		t.Fatalf("MarkFinal: %v %v", got, err)
	}
	before := map[int64]string{}
	for _, id := range []int64{open, minedRow, final, failed} {
		before[id] = f.events(t, id)
	}
	if err := f.l.Reopen(f.ctx, minedIn(open)[0], "x"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("Reopen of an open row: %v, want ErrNotFound", err)
	}
	if err := f.l.Reopen(f.ctx, minedIn(failed)[0], "x"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("Reopen of a failed row: %v, want ErrNotFound", err)
	}
	if err := f.l.Reopen(f.ctx, minedIn(final)[0], "x"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("Reopen of a final row: %v, want ErrNotFound", err)
	}
	if got, err := f.l.MarkFinal(f.ctx, minedIn(open, failed, final, 999_999)); err != nil || len(got) != 0 {
		t.Errorf("MarkFinal of rows that are not mined: %v %v", got, err)
	}
	if moved, _ := f.resolve(t, mined(minedRow), mined(final), mined(failed), mined(999_999)); len(moved) != 0 {
		t.Errorf("Resolve of closed rows moved %v", moved)
	}
	if err := f.l.AddTx(f.ctx, minedRow, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("AddTx on a mined row: %v, want ErrNotFound", err)
	}
	if ok, undecided := f.claim(t, open, "", "c"); ok || undecided {
		t.Errorf("a claim of an open row: %v %v", ok, undecided)
	}
	if ok, undecided := f.claim(t, failed, "", "c"); ok || undecided {
		t.Errorf("a claim of a failed row: %v %v", ok, undecided)
	}
	if err := f.l.MarkBroadcast(f.ctx, []int64{minedRow, final, failed}); err != nil {
		t.Fatal(err)
	}
	for id, was := range before {
		if got := f.events(t, id); got != was {
			t.Errorf("settlement %d: events %s after writes that matched nothing, were %s", id, got, was)
		}
	}
	for id, want := range map[int64]facilitator.State{open: facilitator.StateSigned, minedRow: facilitator.StateMined, final: facilitator.StateFinal, failed: facilitator.StateReverted} {
		if s := f.get(t, id); s.State != want {
			t.Errorf("settlement %d is %s, want %s", id, s.State, want)
		}
	}
}

func addTx(t *testing.T, f *fixture) {
	id := f.insert(t, f.row(0))
	bump := randomTx()
	bump.FeeCap = big.NewInt(1_000_000)
	if err := f.l.AddTx(f.ctx, id, bump); err != nil {
		t.Fatal(err)
	}
	if err := f.l.AddTx(f.ctx, id, bump); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Errorf("the same variant twice: %v, want ErrDuplicate", err)
	}
	if s := f.get(t, id); s.TxHash != bump.Hash || s.State != facilitator.StateSigned {
		t.Fatalf("after the bump: %+v, want the newest variant's hash", s)
	}
	open, _ := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if len(open) != 1 || len(open[0].Txs) != 2 || open[0].Txs[1].Hash != bump.Hash || open[0].Txs[1].FeeCap.Cmp(bump.FeeCap) != 0 {
		t.Fatalf("open after the bump: %+v", open)
	}
	if s, err := f.l.SettlementByTx(f.ctx, bump.Hash); err != nil || s.ID != id {
		t.Fatalf("by the bump's hash: %+v %v", s, err)
	}
	if got := f.events(t, id); got != "[signed bumped]" {
		t.Errorf("events %s", got)
	}
	// A failed row still takes a variant: its nonce may be a gap its signed bytes must fill.
	failed := f.insert(t, f.row(1))
	f.resolve(t, facilitator.Resolution{ID: failed, State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore})
	if err := f.l.AddTx(f.ctx, failed, randomTx()); err != nil {
		t.Errorf("AddTx on a failed row: %v", err)
	}
	if s := f.get(t, failed); s.State != facilitator.StateExpired {
		t.Errorf("a variant reopened a failed row: %s", s.State)
	}
}

func moveNonce(t *testing.T, f *fixture) {
	moved, other := f.insert(t, f.row(0)), f.insert(t, f.row(1))
	if err := f.l.MoveNonce(f.ctx, moved, 1, randomTx()); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("onto another's nonce: %v, want ErrNonceTaken", err)
	}
	re := randomTx()
	if err := f.l.MoveNonce(f.ctx, moved, 2, re); err != nil {
		t.Fatal(err)
	}
	if err := f.l.MoveNonce(f.ctx, moved, 3, re); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Fatalf("the same transaction again: %v, want ErrDuplicate", err)
	}
	open, _ := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if len(open) != 2 || open[0].ID != other || open[1].ID != moved || open[1].TxHash != re.Hash || open[1].TxNonce != 2 || len(open[1].Txs) != 2 {
		t.Fatalf("open %+v, want the moved row last with both transactions", open)
	}
	if _, err := f.l.InsertSettlement(f.ctx, f.row(0)); err != nil {
		t.Fatalf("the old nonce is free again: %v", err)
	}
	// A failed settlement still moves (its nonce may be a gap to fill); a mined one does not.
	f.resolve(t, facilitator.Resolution{ID: other, State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore})
	if err := f.l.MoveNonce(f.ctx, other, 9, randomTx()); err != nil {
		t.Fatalf("a failed settlement: %v", err)
	}
	minedRow := f.insert(t, f.row(10))
	f.resolve(t, mined(minedRow))
	if err := f.l.MoveNonce(f.ctx, minedRow, 11, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("a mined settlement: %v, want ErrNotFound", err)
	}
	if got := f.events(t, moved); got != "[signed renonced]" {
		t.Errorf("events %s", got)
	}
}

func moveBatch(t *testing.T, f *fixture) {
	ids, _ := f.batch(t, 0, 4)
	f.insert(t, f.row(1))
	// Members 0 and 2 were used elsewhere; 3 and 1 (given out of order) move as one new batch.
	f.resolve(t, facilitator.Resolution{ID: ids[0], State: facilitator.StateSettledElsewhere, ErrorReason: facilitator.ReasonNonceAlreadyUsed},
		facilitator.Resolution{ID: ids[2], State: facilitator.StateSettledElsewhere, ErrorReason: facilitator.ReasonNonceAlreadyUsed})
	if err := f.l.MoveBatch(f.ctx, []int64{ids[3], ids[1]}, 1, randomTx()); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("onto a taken nonce: %v, want ErrNonceTaken", err)
	}
	if err := f.l.MoveBatch(f.ctx, []int64{ids[1], ids[0]}, 2, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("with a member no longer open: %v, want ErrNotFound", err)
	}
	if s := f.get(t, ids[1]); s.TxNonce != 0 {
		t.Fatalf("a refused move moved a member: %+v", s)
	}
	stranger := f.insert(t, f.row(7))
	if err := f.l.MoveBatch(f.ctx, []int64{ids[1], stranger}, 2, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("with a settlement of another batch: %v, want ErrNotFound", err)
	}
	tx := randomTx()
	if err := f.l.MoveBatch(f.ctx, []int64{ids[1], ids[3]}, 2, tx); err != nil {
		t.Fatal(err)
	}
	for slot, id := range []int64{ids[1], ids[3]} {
		s := f.get(t, id)
		if s.TxNonce != 2 || s.BatchSlot != slot || s.TxHash != tx.Hash || s.State.Succeeded() {
			t.Fatalf("moved member %d: %+v, want nonce 2, slot %d, the new transaction", id, s, slot)
		}
	}
	if s, err := f.l.SettlementByTx(f.ctx, tx.Hash); err != nil || s.ID != ids[1] {
		t.Fatalf("by the new batch's transaction: %+v %v", s, err)
	}
	if err := f.l.MoveBatch(f.ctx, []int64{ids[1], ids[3]}, 3, tx); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Fatalf("the same transaction again: %v, want ErrDuplicate", err)
	}
	if _, err := f.l.InsertSettlement(f.ctx, f.row(2)); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("the new batch's nonce: %v, want ErrNonceTaken", err)
	}
	if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); fmt.Sprint(slices.Compact(held)) != "[0 1 2 7]" {
		t.Fatalf("nonces held %v, want [0 1 2 7] (the failed members keep the old one)", held)
	}
}

func closedFrom(t *testing.T, f *fixture) {
	a, b, c, d := f.insert(t, f.row(0)), f.insert(t, f.row(1)), f.insert(t, f.row(2)), f.insert(t, f.row(3))
	f.resolve(t, facilitator.Resolution{ID: a, State: facilitator.StateReverted, ErrorReason: facilitator.ReasonTransactionFailed},
		facilitator.Resolution{ID: c, State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore},
		mined(d))
	got, err := f.l.ClosedFrom(f.ctx, f.network, f.signer, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, o := range got {
		ids = append(ids, o.ID)
		if len(o.Txs) != 1 {
			t.Fatalf("closed row %d without its transaction: %+v", o.ID, o)
		}
	}
	if fmt.Sprint(ids) != fmt.Sprint([]int64{a, c}) {
		t.Fatalf("ClosedFrom(0) %v, want the failed rows %v (not %d open, not %d mined)", ids, []int64{a, c}, b, d)
	}
	if got, _ := f.l.ClosedFrom(f.ctx, f.network, f.signer, 1); len(got) != 1 || got[0].ID != c {
		t.Fatalf("ClosedFrom(1) %+v", got)
	}
}

func claims(t *testing.T, f *fixture) {
	keyed := f.row(0)
	keyed.KeyID = "0123456789ab"
	id, mismatch := f.insert(t, keyed), f.insert(t, f.row(1))
	f.resolve(t, mined(id), facilitator.Resolution{ID: mismatch, State: facilitator.StateMined, TxHash: common.HexToHash("0x2"), BlockNumber: 1,
		ErrorReason: facilitator.ReasonTransferEventMismatch})
	if ok, _ := f.claim(t, id, "", "a"); ok {
		t.Fatal("claimed in open mode a keyed row's success")
	}
	if ok, _ := f.claim(t, id, "ffffffffffff", "b"); ok {
		t.Fatal("claimed with another key id")
	}
	if ok, _ := f.claim(t, id, "0123456789ab", "c"); !ok {
		t.Fatal("the row's own key: want the claim")
	}
	if !f.get(t, id).Delivered {
		t.Fatal("claimed, and not delivered")
	}
	// Until its answer is confirmed written, another caller is told undecided, not settled.
	if ok, undecided := f.claim(t, id, "0123456789ab", "d"); ok || !undecided {
		t.Fatalf("a second claim while the first is undecided: ok %v, undecided %v; want undecided", ok, undecided)
	}
	if err := f.l.ReleaseDelivery(f.ctx, id, []byte("d")); err != nil || !f.get(t, id).Delivered {
		t.Fatalf("another claim's release released it: %v", err)
	}
	if err := f.l.ReleaseDelivery(f.ctx, id, []byte("c")); err != nil || f.get(t, id).Delivered {
		t.Fatalf("the claim's own release: %v", err)
	}
	if ok, _ := f.claim(t, id, "0123456789ab", "f"); !ok {
		t.Fatal("after the release the next caller gets it")
	}
	if lapsed := f.confirm(t, facilitator.Delivery{ID: id, Claim: []byte("f")}); len(lapsed) != 0 {
		t.Fatalf("confirming the live claim: lapsed %v", lapsed)
	}
	if ok, undecided := f.claim(t, id, "0123456789ab", "g"); ok || undecided {
		t.Fatalf("a claim of a confirmed success: ok %v, undecided %v; want neither", ok, undecided)
	}
	if ok, _ := f.claim(t, mismatch, "", "g"); ok {
		t.Fatal("claimed a success with a mismatch")
	}
	// A final row's success is still one to claim, once.
	fin := f.insert(t, f.row(2))
	f.resolve(t, mined(fin))
	f.l.MarkFinal(f.ctx, minedIn(fin))
	if ok, _ := f.claim(t, fin, "", "h"); !ok {
		t.Fatal("a final row's success: want the claim")
	}
	f.confirm(t, facilitator.Delivery{ID: fin, Claim: []byte("h")})
	if ok, _ := f.claim(t, fin, "", "i"); ok {
		t.Fatal("a final row's success claimed twice")
	}
	if lapsed := f.confirm(t, facilitator.Delivery{ID: fin, Claim: []byte("never")}); len(lapsed) != 1 || lapsed[0] != fin {
		t.Fatalf("confirming a token that never held the claim: lapsed %v, want [%d]", lapsed, fin)
	}
}

// claimLeases: a claim left unconfirmed when its lease ends (its process died between the claim
// and the answer) goes to the next claim, which is counted as a takeover; the dead claim's late
// confirmation lapses.
func claimLeases(t *testing.T, f *fixture) {
	id, carried := f.insert(t, f.row(0)), f.insert(t, f.row(1))
	const lease = 300 * time.Millisecond
	c := mined(carried)
	c.Claim = &facilitator.SuccessClaim{Token: []byte("dead-carried"), Lease: lease}
	if _, claimed := f.resolve(t, mined(id), c); !sameSet(claimed, []int64{carried}) {
		t.Fatalf("Resolve claimed %v, want [%d]", claimed, carried)
	}
	if ok, err := f.l.ClaimDelivery(f.ctx, id, "", []byte("dead"), lease); err != nil || !ok {
		t.Fatalf("ClaimDelivery: %v %v", ok, err)
	}
	for _, sid := range []int64{id, carried} {
		if ok, undecided := f.claim(t, sid, "", "early"); ok || !undecided {
			t.Fatalf("settlement %d: a retry inside the lease: ok %v, undecided %v; want undecided", sid, ok, undecided)
		}
	}
	f.h.Pass(f.l, 2*lease)
	for _, sid := range []int64{id, carried} {
		if ok, _ := f.claim(t, sid, "", "retry"); !ok {
			t.Fatalf("settlement %d: a retry past the dead claim's lease: want the claim", sid)
		}
	}
	lapsed := f.confirm(t, facilitator.Delivery{ID: id, Claim: []byte("dead")}, facilitator.Delivery{ID: carried, Claim: []byte("retry")})
	if !sameSet(lapsed, []int64{id}) {
		t.Fatalf("confirming the dead claim and the retry's: lapsed %v, want [%d]", lapsed, id)
	}
	for _, sid := range []int64{id, carried} {
		if s := f.get(t, sid); s.ClaimTakeovers != 1 || !s.Delivered {
			t.Fatalf("settlement %d: %d takeovers counted (delivered %v), want 1", sid, s.ClaimTakeovers, s.Delivered)
		}
	}
	// Confirmed: no lease ends it.
	f.h.Pass(f.l, 2*lease)
	if ok, undecided := f.claim(t, carried, "", "late"); ok || undecided {
		t.Fatalf("a claim of a confirmed success: ok %v, undecided %v", ok, undecided)
	}
}
func claimWithResolve(t *testing.T, f *fixture) {
	keyed := f.row(0)
	keyed.KeyID = "0123456789ab"
	a, b, c, d := f.insert(t, keyed), f.insert(t, f.row(1)), f.insert(t, f.row(2)), f.insert(t, f.row(3))
	withClaim := func(r facilitator.Resolution, key, token string) facilitator.Resolution {
		r.Claim = &facilitator.SuccessClaim{KeyID: key, Token: []byte(token), Lease: claimLease}
		return r
	}
	mismatch := mined(c)
	mismatch.ErrorReason = facilitator.ReasonTransferEventMismatch
	moved, claimed := f.resolve(t,
		withClaim(mined(a), "ffffffffffff", "x"), // another key: moved, not claimed
		withClaim(mined(b), "", "y"),             // claimed
		withClaim(mismatch, "", "z"),             // a mismatch is no success
		withClaim(facilitator.Resolution{ID: d, State: facilitator.StateReverted, ErrorReason: facilitator.ReasonTransactionFailed}, "", "w"))
	if !sameSet(moved, []int64{a, b, c, d}) || !sameSet(claimed, []int64{b}) {
		t.Fatalf("Resolve moved %v and claimed %v, want %v and [%d]", moved, claimed, []int64{a, b, c, d}, b)
	}
	if f.get(t, a).Delivered || !f.get(t, b).Delivered || f.get(t, c).Delivered || f.get(t, d).Delivered {
		t.Fatal("delivered flags do not follow the claims")
	}
	if err := f.l.ReleaseDelivery(f.ctx, b, []byte("y")); err != nil || f.get(t, b).Delivered {
		t.Fatalf("a claim written with its outcome is released by its token: %v", err)
	}
	if ok, _ := f.claim(t, a, "0123456789ab", "v"); !ok {
		t.Fatal("the row's own key claims a success another key's resolve could not")
	}
}

// atOnce calls f(0) to f(n-1) each on a goroutine of its own, all at once, and waits for them:
// callers of one ledger from several processes.
func atOnce(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

func concurrentInserts(t *testing.T, f *fixture) {
	s := f.row(0)
	const n = 8
	errs := make([]error, n)
	atOnce(n, func(i int) {
		c := *s
		c.TxNonce, c.Tx = uint64(i), randomTx()
		_, errs[i] = f.l.InsertSettlement(f.ctx, &c)
	})
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, facilitator.ErrDuplicate):
			t.Fatalf("a concurrent insert of the same authorization: %v, want ErrDuplicate", err)
		}
	}
	if held, _ := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); ok != 1 || len(held) != 1 {
		t.Fatalf("%d concurrent inserts of one authorization succeeded (nonces held %v), want exactly one", ok, held)
	}
}

func concurrentClaims(t *testing.T, f *fixture) {
	id := f.insert(t, f.row(0))
	f.resolve(t, mined(id))
	const n = 8
	got := make([]bool, n)
	atOnce(n, func(i int) {
		ok, err := f.l.ClaimDelivery(f.ctx, id, "", []byte{byte(i)}, claimLease)
		if err != nil && !errors.Is(err, facilitator.ErrClaimUndecided) {
			t.Error(err)
		}
		got[i] = ok
	})
	if k := len(slices.DeleteFunc(slices.Clone(got), func(b bool) bool { return !b })); k != 1 {
		t.Fatalf("%d of %d concurrent claims of one success were granted, want exactly one", k, n)
	}
}

func concurrentResolves(t *testing.T, f *fixture) {
	id := f.insert(t, f.row(0))
	const n = 8
	movedBy := make([]int, n)
	atOnce(n, func(i int) {
		r := mined(id)
		r.BlockNumber = uint64(10 + i)
		moved, _, err := f.l.Resolve(f.ctx, []facilitator.Resolution{r})
		if err != nil {
			t.Error(err)
		}
		movedBy[i] = len(moved)
	})
	total, winner := 0, -1
	for i, k := range movedBy {
		total += k
		if k == 1 {
			winner = i
		}
	}
	if total != 1 {
		t.Fatalf("%d concurrent resolves of one row moved it, want exactly one", total)
	}
	if s := f.get(t, id); s.BlockNumber != uint64(10+winner) {
		t.Fatalf("the row holds block %d, want the winner's %d", s.BlockNumber, 10+winner)
	}
	if got := f.events(t, id); got != "[signed broadcast mined]" {
		t.Fatalf("events %s, want one mined event", got)
	}
}

// edgeCases are the answers the callers rely on at the edges: one call naming a row twice, a
// success claimed before a reorg, ids that do not exist.
func edgeCases(t *testing.T, f *fixture) {
	a := f.insert(t, f.row(0))
	moved, _ := f.resolve(t, mined(a), facilitator.Resolution{ID: a, State: facilitator.StateReverted, ErrorReason: facilitator.ReasonTransactionFailed})
	if len(moved) != 1 || moved[0] != a || f.get(t, a).State != facilitator.StateMined || f.events(t, a) != "[signed broadcast mined]" {
		t.Fatalf("a row named twice in one Resolve: moved %v, %s, events %s; want it moved once, by the first", moved, f.get(t, a).State, f.events(t, a))
	}
	// A success answered before its block was reorganised away stays answered: when the
	// transaction lands again, nobody else is told success for the same authorization.
	b := f.insert(t, f.row(1))
	f.resolve(t, mined(b))
	if ok, _ := f.claim(t, b, "", "c"); !ok {
		t.Fatal("claim: want it")
	}
	f.confirm(t, facilitator.Delivery{ID: b, Claim: []byte("c")})
	if err := f.l.Reopen(f.ctx, minedIn(b)[0], "reorganised away"); err != nil {
		t.Fatal(err)
	}
	if s := f.get(t, b); s.State != facilitator.StateBroadcast || !s.Delivered {
		t.Fatalf("after the reopen: %+v, want broadcast and still delivered", s)
	}
	f.resolve(t, mined(b))
	if ok, _ := f.claim(t, b, "", "d"); ok {
		t.Fatal("a second success for a re-mined settlement")
	}
	if got := f.events(t, b); got != "[signed broadcast mined broadcast mined]" {
		t.Fatalf("events %s", got)
	}
	// An open-mode row's success is not a key's, before or after it is mined.
	c := f.insert(t, f.row(2))
	if ok, _ := f.claim(t, c, "abcdefabcdef", "e"); ok {
		t.Fatal("claimed an open row")
	}
	f.resolve(t, mined(c))
	if ok, _ := f.claim(t, c, "abcdefabcdef", "e"); ok {
		t.Fatal("a key claimed an open-mode row's success")
	}
	d := f.insert(t, f.row(3))
	if err := f.l.MarkBroadcast(f.ctx, []int64{d, d}); err != nil {
		t.Fatal(err)
	}
	if err := f.l.MarkBroadcast(f.ctx, []int64{d}); err != nil {
		t.Fatal(err)
	}
	if got := f.events(t, d); got != "[signed broadcast]" {
		t.Fatalf("MarkBroadcast twice: events %s, want one broadcast", got)
	}
	fin := f.insert(t, f.row(9))
	f.resolve(t, mined(fin))
	if _, err := f.l.MarkFinal(f.ctx, minedIn(fin)); err != nil {
		t.Fatal(err)
	}
	if err := f.l.MoveNonce(f.ctx, fin, 20, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("MoveNonce of a final row: %v, want ErrNotFound", err)
	}
	const unknown = 1 << 40
	if err := f.l.AddTx(f.ctx, unknown, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("AddTx of an unknown id: %v, want ErrNotFound", err)
	}
	if err := f.l.MoveNonce(f.ctx, unknown, 30, randomTx()); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("MoveNonce of an unknown id: %v, want ErrNotFound", err)
	}
	if err := f.l.ReleaseDelivery(f.ctx, unknown, []byte("x")); err != nil {
		t.Errorf("ReleaseDelivery of an unknown id: %v, want nothing done", err)
	}
	if ok, undecided := f.claim(t, unknown, "", "x"); ok || undecided {
		t.Errorf("ClaimDelivery of an unknown id: %v %v, want false", ok, undecided)
	}
	if err := f.l.MarkBroadcast(f.ctx, []int64{unknown}); err != nil {
		t.Errorf("MarkBroadcast of an unknown id: %v, want nothing done", err)
	}
}

func batchMembers(t *testing.T, f *fixture) {
	ids, _ := f.batch(t, 2, 3)
	lone := f.insert(t, f.row(3))
	got, err := f.l.BatchMembers(f.ctx, f.network, f.signer, 2)
	if err != nil || len(got) != 3 {
		t.Fatalf("BatchMembers: %+v %v", got, err)
	}
	for i, s := range got {
		if s.ID != ids[i] || s.BatchSlot != i {
			t.Fatalf("member %d: %+v, want %d in slot %d (the batch's order)", i, s, ids[i], i)
		}
	}
	if got, _ := f.l.BatchMembers(f.ctx, f.network, f.signer, 3); len(got) != 1 || got[0].ID != lone {
		t.Fatalf("a lone settlement's members: %+v", got)
	}
	if got, _ := f.l.BatchMembers(f.ctx, f.network, f.signer, 9); len(got) != 0 {
		t.Fatalf("an empty nonce's members: %+v", got)
	}
	// Moved members belong to their new batch; the ones left behind to the old.
	f.resolve(t, facilitator.Resolution{ID: ids[0], State: facilitator.StateSettledElsewhere, ErrorReason: facilitator.ReasonNonceAlreadyUsed})
	if err := f.l.MoveBatch(f.ctx, []int64{ids[1], ids[2]}, 5, randomTx()); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.l.BatchMembers(f.ctx, f.network, f.signer, 2); len(got) != 1 || got[0].ID != ids[0] {
		t.Fatalf("the old batch after the move: %+v", got)
	}
	if got, _ := f.l.BatchMembers(f.ctx, f.network, f.signer, 5); len(got) != 2 || got[0].ID != ids[1] || got[1].ID != ids[2] || got[1].BatchSlot != 1 {
		t.Fatalf("the new batch: %+v", got)
	}
}

func staleAndTouch(t *testing.T, f *fixture) {
	open, minedRow, failed := f.insert(t, f.row(0)), f.insert(t, f.row(1)), f.insert(t, f.row(2))
	f.resolve(t, mined(minedRow), facilitator.Resolution{ID: failed, State: facilitator.StateReverted, ErrorReason: facilitator.ReasonTransactionFailed})
	fin := f.insert(t, f.row(3))
	f.resolve(t, mined(fin))
	f.l.MarkFinal(f.ctx, minedIn(fin))
	other := f.row(4)
	other.Key.Network = f.network // another network's rows are never listed: the same network, another signer's are
	other.Signer = randomAddress()
	theirs := f.insert(t, other)
	stale := func(before time.Time) []int64 {
		t.Helper()
		rows, err := f.l.StaleSettlements(f.ctx, f.network, before, 100)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, r := range rows {
			ids = append(ids, r.ID)
			if len(r.Txs) == 0 {
				t.Fatalf("stale row %d without its transactions", r.ID)
			}
		}
		return ids
	}
	if got := stale(f.h.Now(f.l).Add(-time.Hour)); len(got) != 0 {
		t.Fatalf("rows updated after the bound: %v", got)
	}
	if got := stale(f.h.Now(f.l).Add(time.Hour)); !sameSet(got, []int64{open, minedRow, theirs}) {
		t.Fatalf("stale %v, want the signed, broadcast and mined rows %v (not failed, not final)", got, []int64{open, minedRow, theirs})
	}
	// A touched row goes to the back of the line, and nothing else about it changes.
	f.h.Pass(f.l, 20*time.Millisecond)
	before := f.events(t, open)
	if err := f.l.Touch(f.ctx, []int64{open}); err != nil {
		t.Fatal(err)
	}
	f.h.Pass(f.l, 20*time.Millisecond)
	got := stale(f.h.Now(f.l).Add(time.Hour))
	if len(got) != 3 || got[len(got)-1] != open {
		t.Fatalf("stale after a touch %v, want %d last (oldest update first)", got, open)
	}
	if s := f.get(t, open); s.State != facilitator.StateSigned || f.events(t, open) != before {
		t.Fatalf("a touch changed the row: %+v, events %s", s, f.events(t, open))
	}
	if rows, _ := f.l.StaleSettlements(f.ctx, f.network, f.h.Now(f.l).Add(time.Hour), 1); len(rows) != 1 || rows[0].ID == open {
		t.Fatalf("a limit of 1: %+v, want the oldest", rows)
	}
	if err := f.l.Touch(f.ctx, []int64{1 << 40}); err != nil {
		t.Fatalf("Touch of an unknown id: %v", err)
	}
}

func settlementEvents(t *testing.T, f *fixture) {
	id := f.insert(t, f.row(0))
	if err := f.l.AddTx(f.ctx, id, randomTx()); err != nil {
		t.Fatal(err)
	}
	f.resolve(t, mined(id))
	f.l.MarkFinal(f.ctx, minedIn(id))
	all, err := f.l.SettlementEvents(f.ctx, id, 0, []string{"signed", "broadcast", "mined", "final", "bumped"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for i, ev := range all {
		states = append(states, string(ev.State))
		if ev.SettlementID != id || (i > 0 && ev.ID <= all[i-1].ID) {
			t.Fatalf("event %d: %+v, want the settlement's, ids ascending", i, ev)
		}
	}
	if fmt.Sprint(states) != "[signed bumped broadcast mined final]" {
		t.Fatalf("events %v", states)
	}
	some, _ := f.l.SettlementEvents(f.ctx, id, all[1].ID, []string{"mined", "final", "signed"}, 1)
	if len(some) != 1 || some[0].State != facilitator.StateMined {
		t.Fatalf("after the second event, of mined/final/signed, limit 1: %+v", some)
	}
}

// signerLeases: one holder per key at a time; a second process gets nothing (wait zero) until the
// holder lets go; writes go through the lease and fail, writing nothing, once it ended (released
// or its session cut); Lost closes when it ends; a process queued for the key is seen by the
// holder (Wanted) and gets the key when the holder lets go, before anyone else.
func signerLeases(t *testing.T, f *fixture) {
	a, b := f.h.Leasers(t, f.l)
	take := func(p settle.Leaser, who string, wait time.Duration) facilitator.SignerLease {
		t.Helper()
		l, err := p.LeaseSigner(f.ctx, f.network, f.signer, wait)
		if err != nil {
			t.Fatalf("%s LeaseSigner: %v", who, err)
		}
		return l
	}
	ended := func(l facilitator.SignerLease, within time.Duration) bool {
		t.Helper()
		select {
		case <-l.Lost():
			return true
		case <-time.After(within):
			return false
		}
	}
	// refused: a write through an ended lease fails, is not one of the Store's answers about the
	// row, and writes nothing.
	refused := func(l facilitator.SignerLease, txNonce uint64) {
		t.Helper()
		row := f.row(txNonce)
		_, err := l.InsertSettlement(f.ctx, row)
		switch {
		case err == nil:
			t.Fatal("a write through an ended lease answered nil")
		case errors.Is(err, facilitator.ErrDuplicate), errors.Is(err, facilitator.ErrNonceTaken), errors.Is(err, facilitator.ErrNotFound):
			t.Fatalf("a write through an ended lease answered %v, a Store answer about the row", err)
		}
		if _, err := f.l.SettlementByKey(f.ctx, row.Key); !errors.Is(err, facilitator.ErrNotFound) {
			t.Fatalf("a write through an ended lease wrote its row (%v)", err)
		}
	}

	la := take(a, "the first process", 0)
	if la == nil {
		t.Fatal("a free key: no lease")
	}
	if l := take(b, "the second process", 0); l != nil {
		t.Fatal("a held key leased to a second process")
	}
	if _, err := la.InsertSettlement(f.ctx, f.row(0)); err != nil {
		t.Fatalf("a write through a held lease: %v", err)
	}
	if ended(la, 0) {
		t.Fatal("a held lease's Lost is closed")
	}
	la.Release()
	la.Release() // safe twice
	if !ended(la, time.Second) {
		t.Fatal("a released lease's Lost is not closed")
	}
	refused(la, 1)

	lb := take(b, "the second process", 0)
	if lb == nil {
		t.Fatal("a released key: no lease for the second process")
	}
	if l := take(a, "the first process", 0); l != nil {
		t.Fatal("a key held by the second process leased to the first")
	}
	f.h.Cut(t, f.l, f.network, f.signer)
	if !ended(lb, 10*time.Second) {
		t.Fatal("a lease whose session was cut: Lost is not closed")
	}
	refused(lb, 1)
	lb.Release()

	// Queued: the holder sees the waiter, and the key goes to it when the holder lets go.
	la = take(a, "the first process", 0)
	if la == nil {
		t.Fatal("a key whose session was cut: no lease")
	}
	got := make(chan facilitator.SignerLease, 1)
	go func() {
		l, err := b.LeaseSigner(f.ctx, f.network, f.signer, 8*time.Second)
		if err != nil {
			t.Errorf("the queued process's LeaseSigner: %v", err)
		}
		got <- l
	}()
	var waited facilitator.SignerLease
	queued := false
	for deadline := time.Now().Add(6 * time.Second); !queued && time.Now().Before(deadline); {
		select {
		case waited = <-got: // the simulator's waiter answers at once (queued all the same)
			got = nil
		case <-time.After(50 * time.Millisecond):
		}
		queued = la.Wanted()
	}
	if !queued || waited != nil {
		t.Fatalf("a process queued for a held key: Wanted %v, leased %v", queued, waited != nil)
	}
	la.Release()
	if got != nil {
		waited = <-got
	}
	if waited == nil {
		if l := take(a, "the first process, while the second queues", 0); l != nil {
			t.Fatal("a key let go while another process queued for it leased to a third")
		}
		waited = take(b, "the queued process", 0)
	}
	if waited == nil {
		t.Fatal("the process queued for the key did not get it when the holder let go")
	}
	if _, err := waited.InsertSettlement(f.ctx, f.row(1)); err != nil {
		t.Fatalf("a write through the queued process's lease: %v", err)
	}
	waited.Release()
}

// adoption is an Adoption of a fresh transaction of the fixture's signer at txNonce for rows'
// authorizations, in their order (slots 0, 1, ...).
func (f *fixture) adoption(txNonce uint64, rows ...*facilitator.NewSettlement) facilitator.Adoption {
	a := facilitator.Adoption{Network: f.network, Signer: f.signer, TxNonce: txNonce, Tx: randomTx(), BlockNumber: 7, BlockHash: common.HexToHash("0x77")}
	for i, r := range rows {
		a.Members = append(a.Members, facilitator.AdoptedMember{Key: r.Key, Slot: i, PayTo: r.PayTo, Value: r.Value, ValidAfter: r.ValidAfter, ValidBefore: r.ValidBefore})
	}
	return a
}

// adopt: a mined transaction of ours the ledger lost is recorded mined and marked adopted, once
// however often it is adopted; an open row of the authorization takes it and is resolved mined;
// a row resolved otherwise, or another settlement at the transaction's nonce, refuses it with
// nothing written; an adopted row no request made is bound to the first request that asks.
func adopt(t *testing.T, f *fixture) {
	lost := f.row(4)
	a := f.adoption(4, lost)
	ids, wrote, err := f.l.AdoptSettlements(f.ctx, a)
	if err != nil || len(ids) != 1 || !wrote {
		t.Fatalf("AdoptSettlements: %v %v %v", ids, wrote, err)
	}
	s := f.get(t, ids[0])
	if s.State != facilitator.StateMined || !s.Adopted || s.TxHash != a.Tx.Hash || s.BlockNumber != 7 || s.BlockHash != a.BlockHash ||
		s.TxNonce != 4 || s.Signer != f.signer || s.Key != lost.Key || s.Value.Cmp(lost.Value) != 0 || s.Delivered {
		t.Fatalf("adopted row %+v", s)
	}
	if byKey, err := f.l.SettlementByKey(f.ctx, lost.Key); err != nil || byKey.ID != ids[0] {
		t.Fatalf("SettlementByKey: %+v %v", byKey, err)
	}
	if byTx, err := f.l.SettlementByTx(f.ctx, a.Tx.Hash); err != nil || byTx.ID != ids[0] {
		t.Fatalf("SettlementByTx: %+v %v", byTx, err)
	}
	if again, wrote, err := f.l.AdoptSettlements(f.ctx, a); err != nil || !slices.Equal(again, ids) || wrote {
		t.Fatalf("adopting again: %v %v %v, want %v and nothing written", again, wrote, err, ids)
	}
	if got := f.events(t, ids[0]); got != "[mined]" {
		t.Fatalf("events %s", got)
	}
	// The nonce is held: a new settlement there is refused, and the key's nonces count it.
	if _, err := f.l.InsertSettlement(f.ctx, f.row(4)); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("insert at the adopted nonce: %v", err)
	}
	if held, err := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); err != nil || !slices.Equal(held, []uint64{4}) {
		t.Fatalf("NoncesHeld %v %v", held, err)
	}
	// The success is unclaimed: the first caller with the row's key gets it.
	if ok, _ := f.claim(t, ids[0], "", "first"); !ok {
		t.Fatal("the adopted row's success could not be claimed")
	}

	// Bound once, to the first request that asks.
	fp := facilitator.Fingerprint{1}
	if ok, err := f.l.BindAdopted(f.ctx, ids[0], fp, "key-a", 2, []byte(`{"a":1}`)); err != nil || !ok {
		t.Fatalf("BindAdopted: %v %v", ok, err)
	}
	if ok, err := f.l.BindAdopted(f.ctx, ids[0], facilitator.Fingerprint{2}, "key-b", 2, nil); err != nil || ok {
		t.Fatalf("BindAdopted a second time: %v %v", ok, err)
	}
	if s := f.get(t, ids[0]); s.Fingerprint != fp {
		t.Fatalf("fingerprint %x", s.Fingerprint)
	}
	// A row the engine wrote before its broadcast is no adopted row to bind.
	own := f.insert(t, f.row(5))
	if ok, err := f.l.BindAdopted(f.ctx, own, fp, "", 2, nil); err != nil || ok {
		t.Fatalf("BindAdopted of a row not adopted: %v %v", ok, err)
	}

	// An open row whose mined variant was lost (here re-signed at nonce 6) takes the transaction.
	open := f.row(5)
	open.TxNonce = 6
	openID := f.insert(t, open)
	b := f.adoption(8, open)
	if ids, wrote, err := f.l.AdoptSettlements(f.ctx, b); err != nil || !slices.Equal(ids, []int64{openID}) || !wrote {
		t.Fatalf("adopting an open row: %v %v %v", ids, wrote, err)
	}
	s = f.get(t, openID)
	if s.State != facilitator.StateMined || !s.Adopted || s.TxHash != b.Tx.Hash || s.TxNonce != 8 || s.BlockHash != b.BlockHash {
		t.Fatalf("open row after adoption %+v", s)
	}
	open8, err := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range open8 {
		if o.ID == openID && !slices.ContainsFunc(o.Txs, func(x facilitator.TxRecord) bool { return x.Hash == b.Tx.Hash }) {
			t.Fatalf("the adopted variant is not among the row's transactions: %+v", o.Txs)
		}
	}

	// Conflicts: a row resolved otherwise, another transaction's mined row, another settlement at
	// the nonce. Nothing is written.
	failed := f.insert(t, f.row(9))
	f.resolve(t, facilitator.Resolution{ID: failed, State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore})
	failedRow := f.get(t, failed)
	fresh := f.row(0)
	c := f.adoption(10, fresh, &facilitator.NewSettlement{Key: failedRow.Key, PayTo: failedRow.PayTo, Value: failedRow.Value, ValidBefore: failedRow.ValidBefore})
	if _, _, err := f.l.AdoptSettlements(f.ctx, c); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Fatalf("adopting over a failed row: %v", err)
	}
	if _, err := f.l.SettlementByKey(f.ctx, fresh.Key); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("a refused adoption wrote its other member: %v", err)
	}
	other := f.adoption(11, lost) // lost is mined by a.Tx
	if _, _, err := f.l.AdoptSettlements(f.ctx, other); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Fatalf("adopting another transaction of a mined row: %v", err)
	}
	if _, _, err := f.l.AdoptSettlements(f.ctx, f.adoption(5, f.row(0))); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("adopting at a nonce another settlement holds: %v", err)
	}
}

// adoptBatch: a batch transaction's members are adopted at their slots, the transaction recorded
// once and read by every member.
func adoptBatch(t *testing.T, f *fixture) {
	rows := []*facilitator.NewSettlement{f.row(0), f.row(0), f.row(0)}
	a := f.adoption(3, rows...)
	ids, _, err := f.l.AdoptSettlements(f.ctx, a)
	if err != nil || len(ids) != 3 {
		t.Fatalf("AdoptSettlements: %v %v", ids, err)
	}
	members, err := f.l.BatchMembers(f.ctx, f.network, f.signer, 3)
	if err != nil || len(members) != 3 {
		t.Fatalf("BatchMembers: %+v %v", members, err)
	}
	for i, m := range members {
		if m.ID != ids[i] || m.BatchSlot != i || m.State != facilitator.StateMined || m.TxHash != a.Tx.Hash || !m.Adopted {
			t.Fatalf("member %d: %+v", i, m)
		}
	}
	open, err := f.l.OpenSettlements(f.ctx, f.network, f.signer)
	if err != nil || len(open) != 3 {
		t.Fatalf("OpenSettlements: %+v %v", open, err)
	}
	for _, o := range open {
		if len(o.Txs) != 1 || o.Txs[0].Hash != a.Tx.Hash {
			t.Fatalf("member %d's transactions: %+v", o.ID, o.Txs)
		}
	}
}

// concurrentAdopts: adoptions of one transaction at once make one row, and exactly one of them
// says it wrote it (what the adoption metric and log count).
func concurrentAdopts(t *testing.T, f *fixture) {
	a := f.adoption(2, f.row(0))
	ids := make([][]int64, 8)
	wrote := make([]bool, 8)
	errs := make([]error, 8)
	atOnce(8, func(i int) { ids[i], wrote[i], errs[i] = f.l.AdoptSettlements(f.ctx, a) })
	writers := 0
	for i := range ids {
		if errs[i] != nil || len(ids[i]) != 1 || ids[i][0] != ids[0][0] {
			t.Fatalf("adoption %d: %v %v (first %v)", i, ids[i], errs[i], ids[0])
		}
		if wrote[i] {
			writers++
		}
	}
	if writers != 1 {
		t.Fatalf("%d adoptions said they wrote the row, want 1", writers)
	}
	if held, err := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); err != nil || !slices.Equal(held, []uint64{2}) {
		t.Fatalf("NoncesHeld %v %v", held, err)
	}
}

// adoptPaymentID: an adopted row takes its request's payment id, as an insert does; an id bound
// already is left to its settlement, and the adoption goes on.
func adoptPaymentID(t *testing.T, f *fixture) {
	bound := f.row(0)
	bound.PaymentID = &facilitator.PaymentIDBinding{Scope: "", ID: randomID(), Fingerprint: facilitator.Fingerprint{7}, Summary: map[string]string{"a": "b"}}
	boundID := f.insert(t, bound)

	a := f.adoption(3, f.row(0), f.row(0))
	fresh := randomID()
	a.Members[0].PaymentID = &facilitator.PaymentIDBinding{ID: fresh, Fingerprint: facilitator.Fingerprint{8}, Summary: map[string]string{"c": "d"}}
	a.Members[1].PaymentID = &facilitator.PaymentIDBinding{ID: bound.PaymentID.ID, Fingerprint: facilitator.Fingerprint{9}}
	ids, _, err := f.l.AdoptSettlements(f.ctx, a)
	if err != nil {
		t.Fatalf("AdoptSettlements: %v", err)
	}
	if rec, err := f.l.PaymentID(f.ctx, "", fresh); err != nil || rec.Settlement.ID != ids[0] || rec.Fingerprint != (facilitator.Fingerprint{8}) {
		t.Fatalf("the adopted row's id: %+v %v", rec, err)
	}
	if rec, err := f.l.PaymentID(f.ctx, "", bound.PaymentID.ID); err != nil || rec.Settlement.ID != boundID {
		t.Fatalf("an id bound already: %+v %v, want still settlement %d", rec, err, boundID)
	}
}

// adoptInPlace: an open row whose mined transaction is at a nonce another settlement holds (one
// signed there after the loss, while the lost transaction waited in a pool) is resolved mined
// where it is, the transaction among its variants, when the caller saw the row's own nonce used
// (MayStay); the other settlement keeps its nonce. Without MayStay the adoption waits
// (ErrNonceTaken), nothing written: resolved at a nonce nothing uses, the row would hold a gap.
func adoptInPlace(t *testing.T, f *fixture) {
	open := f.row(1)
	openID := f.insert(t, open)
	other := f.insert(t, f.row(2))
	a := f.adoption(2, open)
	if _, _, err := f.l.AdoptSettlements(f.ctx, a); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("adopting in place without MayStay: %v, want ErrNonceTaken", err)
	}
	if s := f.get(t, openID); s.State.Succeeded() || s.Adopted {
		t.Fatalf("a refused adoption wrote the row: %+v", s)
	}
	a.MayStay = true
	ids, wrote, err := f.l.AdoptSettlements(f.ctx, a)
	if err != nil || !slices.Equal(ids, []int64{openID}) || !wrote {
		t.Fatalf("AdoptSettlements: %v %v %v", ids, wrote, err)
	}
	s := f.get(t, openID)
	if s.State != facilitator.StateMined || !s.Adopted || s.TxHash != a.Tx.Hash || s.TxNonce != 1 {
		t.Fatalf("the row resolved in place: %+v", s)
	}
	if o := f.get(t, other); o.TxNonce != 2 || o.State.Succeeded() {
		t.Fatalf("the other settlement: %+v", o)
	}
	if byTx, err := f.l.SettlementByTx(f.ctx, a.Tx.Hash); err != nil || byTx.ID != openID {
		t.Fatalf("SettlementByTx: %+v %v", byTx, err)
	}
	if again, wrote, err := f.l.AdoptSettlements(f.ctx, a); err != nil || !slices.Equal(again, ids) || wrote {
		t.Fatalf("adopting again: %v %v %v", again, wrote, err)
	}
}

// adoptOtherKey: an open row signed on one key (a retry after the ledger lost the first
// settlement) whose authorization a lost transaction of another key used moves to that key's
// nonce, key included: left at its own key's nonce it would hold a nonce nothing will send there
// (the simulator's seed 4707: every later transaction of that key waited behind it). Where
// another settlement holds the other key's place, it is resolved where it is, on its own key.
func adoptOtherKey(t *testing.T, f *fixture) {
	open := f.row(4)
	openID := f.insert(t, open)
	a := f.adoption(9, open)
	a.Signer = randomAddress()
	ids, wrote, err := f.l.AdoptSettlements(f.ctx, a)
	if err != nil || !slices.Equal(ids, []int64{openID}) || !wrote {
		t.Fatalf("AdoptSettlements: %v %v %v", ids, wrote, err)
	}
	s := f.get(t, openID)
	if s.State != facilitator.StateMined || !s.Adopted || s.TxHash != a.Tx.Hash || s.Signer != a.Signer || s.TxNonce != 9 {
		t.Fatalf("the row after adopting another key's transaction: %+v", s)
	}
	if held, err := f.l.NoncesHeld(f.ctx, f.network, f.signer, 0); err != nil || len(held) != 0 {
		t.Fatalf("the row's first key still holds nonces %v (%v)", held, err)
	}
	if held, err := f.l.NoncesHeld(f.ctx, f.network, a.Signer, 0); err != nil || !slices.Equal(held, []uint64{9}) {
		t.Fatalf("the transaction's key holds %v (%v), want [9]", held, err)
	}
	// Again: adopted already, nothing written.
	if again, wrote, err := f.l.AdoptSettlements(f.ctx, a); err != nil || !slices.Equal(again, ids) || wrote {
		t.Fatalf("adopting again: %v %v %v", again, wrote, err)
	}

	// The other key's place taken: resolved where it is.
	stay := f.row(5)
	stayID := f.insert(t, stay)
	b := f.adoption(3, stay)
	b.Signer = randomAddress()
	holder := f.row(3)
	holder.Signer = b.Signer
	f.insert(t, holder)
	b.MayStay = true
	if ids, wrote, err := f.l.AdoptSettlements(f.ctx, b); err != nil || !slices.Equal(ids, []int64{stayID}) || !wrote {
		t.Fatalf("AdoptSettlements at a taken place: %v %v %v", ids, wrote, err)
	}
	if s := f.get(t, stayID); s.State != facilitator.StateMined || s.TxHash != b.Tx.Hash || s.Signer != f.signer || s.TxNonce != 5 {
		t.Fatalf("the row resolved in place: %+v", s)
	}
}

// adoptCorrectsElsewhere: a row resolved settled elsewhere by the very transaction now adopted
// (its writer did not know every key of ours and took it for another's) is corrected: mined by
// it, adopted, at its key and nonce. A row settled elsewhere by another transaction still
// refuses the adoption, with nothing written.
func adoptCorrectsElsewhere(t *testing.T, f *fixture) {
	row := f.row(2)
	id := f.insert(t, row)
	a := f.adoption(6, row)
	a.Signer = randomAddress()
	f.resolve(t, facilitator.Resolution{ID: id, State: facilitator.StateSettledElsewhere, TxHash: a.Tx.Hash, BlockNumber: 7,
		BlockHash: a.BlockHash, ErrorReason: facilitator.ReasonNonceAlreadyUsed, ErrorMessage: "not ours"})
	ids, wrote, err := f.l.AdoptSettlements(f.ctx, a)
	if err != nil || !slices.Equal(ids, []int64{id}) || !wrote {
		t.Fatalf("AdoptSettlements over a settled-elsewhere row by the same transaction: %v %v %v", ids, wrote, err)
	}
	s := f.get(t, id)
	if s.State != facilitator.StateMined || !s.Adopted || s.TxHash != a.Tx.Hash || s.Signer != a.Signer || s.TxNonce != 6 ||
		s.ErrorReason != "" || s.ErrorMessage != "" {
		t.Fatalf("the corrected row: %+v", s)
	}

	other := f.row(3)
	otherID := f.insert(t, other)
	b := f.adoption(8, other)
	f.resolve(t, facilitator.Resolution{ID: otherID, State: facilitator.StateSettledElsewhere, TxHash: randomTx().Hash, BlockNumber: 7,
		BlockHash: b.BlockHash, ErrorReason: facilitator.ReasonNonceAlreadyUsed, ErrorMessage: "not ours"})
	if _, _, err := f.l.AdoptSettlements(f.ctx, b); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Fatalf("adopting over a row settled elsewhere by another transaction: %v", err)
	}
	if s := f.get(t, otherID); s.State != facilitator.StateSettledElsewhere {
		t.Fatalf("the refused row: %+v", s)
	}
}
