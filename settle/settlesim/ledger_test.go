package settlesim

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// newStore is settle.Store with the contract being changed in parallel (store_contract.go):
// the Ledger must satisfy it now, and settle.Store once it has changed.
type newStore interface {
	SettlementByKey(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error)
	SettlementByID(ctx context.Context, id int64) (*facilitator.Settlement, error)
	InsertSettlement(ctx context.Context, s *facilitator.NewSettlement) (int64, error)
	InsertSettlements(ctx context.Context, rows []*facilitator.NewSettlement) ([]int64, error)
	AddTx(ctx context.Context, settlementID int64, tx facilitator.TxRecord) error
	MoveNonce(ctx context.Context, settlementID int64, txNonce uint64, tx facilitator.TxRecord) error
	MarkBroadcast(ctx context.Context, ids []int64) error
	Resolve(ctx context.Context, rs []facilitator.Resolution) ([]int64, []int64, error)
	Reopen(ctx context.Context, id int64, detail string) error
	MarkFinal(ctx context.Context, ids []int64) ([]int64, error)
	ClaimDelivery(ctx context.Context, id int64, keyID string, claim []byte, lease time.Duration) (bool, error)
	ConfirmDeliveries(ctx context.Context, ds []facilitator.Delivery) ([]int64, error)
	ReleaseDelivery(ctx context.Context, id int64, claim []byte) error
	OpenSettlements(ctx context.Context, network string, signer common.Address) ([]facilitator.OpenSettlement, error)
	MaxTxNonce(ctx context.Context, network string, signer common.Address) (nonce uint64, ok bool, err error)
	WalletCapWait(ctx context.Context, network string, asset, payer common.Address, value *big.Int, g facilitator.Limits) (time.Duration, error)
}

var _ newStore = (*Ledger)(nil)

const network = "eip155:1337"

var (
	signerA = common.HexToAddress("0x000000000000000000000000000000000000a001")
	signerB = common.HexToAddress("0x000000000000000000000000000000000000a002")
)

func newLedger(faults LedgerFaults) (*Ledger, *Clock) {
	clock := NewClock(start)
	return NewLedger(clock, faults, rand.New(rand.NewPCG(3, 4))), clock
}

// row is a new settlement of authorization nonce n, signed by signer at txNonce.
func row(n byte, signer common.Address, txNonce uint64) *facilitator.NewSettlement {
	return &facilitator.NewSettlement{
		Key:   facilitator.AuthorizationKey{Network: network, Asset: common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3"), Payer: common.HexToAddress("0xbeef"), Nonce: [32]byte{n}},
		Value: big.NewInt(10), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(2_000_000_000), X402Version: 2, Request: []byte("{}"),
		Signer: signer, TxNonce: txNonce, Tx: txRec(fmt.Sprintf("%d/%s/%d", n, signer, txNonce)), GasReserved: big.NewInt(1),
	}
}

func txRec(seed string) facilitator.TxRecord {
	return facilitator.TxRecord{Hash: crypto.Keccak256Hash([]byte(seed)), Raw: []byte(seed), TipCap: big.NewInt(1), FeeCap: big.NewInt(3), Gas: 120_000}
}

func mustInsert(t *testing.T, l *Ledger, s *facilitator.NewSettlement) int64 {
	t.Helper()
	id, err := l.InsertSettlement(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func states(l *Ledger, id int64) string {
	r, _ := l.Row(id)
	var out []string
	for _, e := range r.Events {
		out = append(out, e.State)
	}
	return fmt.Sprint(out)
}

// TestLedgerUniqueKeys: the ledger refuses what the Postgres ledger's unique keys refuse, with
// the Store's sentinels, and writes nothing then.
func TestLedgerUniqueKeys(t *testing.T) {
	tests := []struct {
		name string
		row  func() *facilitator.NewSettlement
		want error
	}{
		{"same authorization", func() *facilitator.NewSettlement { return row(1, signerA, 7) }, facilitator.ErrDuplicate},
		{"same signer nonce", func() *facilitator.NewSettlement { return row(2, signerA, 0) }, facilitator.ErrNonceTaken},
		{"same nonce, other signer", func() *facilitator.NewSettlement { return row(2, signerB, 0) }, nil},
		{"same nonce, other network", func() *facilitator.NewSettlement {
			s := row(1, signerA, 0)
			s.Key.Network, s.Tx = "eip155:1", txRec("other network")
			return s
		}, nil},
		{"same transaction hash", func() *facilitator.NewSettlement {
			s := row(2, signerA, 1)
			s.Tx = row(1, signerA, 0).Tx
			return s
		}, facilitator.ErrDuplicate},
		{"same payment id", func() *facilitator.NewSettlement {
			s := row(2, signerA, 1)
			s.PaymentID = &facilitator.PaymentIDBinding{Scope: "key1", ID: "pay_0123456789abcdef"}
			return s
		}, facilitator.ErrPaymentIDTaken},
		{"same payment id, other scope", func() *facilitator.NewSettlement {
			s := row(2, signerA, 1)
			s.PaymentID = &facilitator.PaymentIDBinding{Scope: "key2", ID: "pay_0123456789abcdef"}
			return s
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newLedger(LedgerFaults{})
			first := row(1, signerA, 0)
			first.PaymentID = &facilitator.PaymentIDBinding{Scope: "key1", ID: "pay_0123456789abcdef"}
			mustInsert(t, l, first)
			_, err := l.InsertSettlement(context.Background(), tt.row())
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("insert: %v, want %v", err, tt.want)
			}
			if want := map[bool]int{true: 2, false: 1}[tt.want == nil]; len(l.Rows()) != want {
				t.Fatalf("%d rows, want %d", len(l.Rows()), want)
			}
		})
	}
}

// TestLedgerGroupCommit: a group is written all or none; its error is its first failing row's,
// counting the group's own earlier rows; failed inserts use up ids, as a sequence does.
func TestLedgerGroupCommit(t *testing.T) {
	l, _ := newLedger(LedgerFaults{})
	ctx := context.Background()
	_, err := l.InsertSettlements(ctx, []*facilitator.NewSettlement{row(1, signerA, 0), row(2, signerA, 1), row(3, signerA, 1)})
	if !errors.Is(err, facilitator.ErrNonceTaken) || len(l.Rows()) != 0 {
		t.Fatalf("colliding group: %v, %d rows", err, len(l.Rows()))
	}
	ids, err := l.InsertSettlements(ctx, []*facilitator.NewSettlement{row(1, signerA, 0), row(2, signerA, 1)})
	if err != nil || len(ids) != 2 || ids[0] != 4 || ids[1] != 5 {
		t.Fatalf("group: %v %v, want ids 4 and 5", ids, err)
	}
	if top, ok, err := l.MaxTxNonce(ctx, network, signerA); top != 1 || !ok || err != nil {
		t.Fatalf("max nonce %d %v %v", top, ok, err)
	}
	if _, ok, _ := l.MaxTxNonce(ctx, network, signerB); ok {
		t.Fatal("a nonce for a signer without rows")
	}
}

// TestLedgerTransitions: each write moves only the rows in the state it moves from, and writes
// the events the Postgres ledger writes.
func TestLedgerTransitions(t *testing.T) {
	l, clock := newLedger(LedgerFaults{})
	ctx := context.Background()
	early, normal, expired := mustInsert(t, l, row(1, signerA, 0)), mustInsert(t, l, row(2, signerA, 1)), mustInsert(t, l, row(3, signerA, 2))
	if err := l.MarkBroadcast(ctx, []int64{normal}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	mined := func(id int64) facilitator.Resolution {
		return facilitator.Resolution{ID: id, State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 5, BlockHash: common.HexToHash("0x2")}
	}
	moved, _, err := l.Resolve(ctx, []facilitator.Resolution{mined(normal), mined(early), {ID: expired, State: facilitator.StateExpired, ErrorReason: "invalid_exact_evm_payload_authorization_valid_before"}})
	if err != nil || fmt.Sprint(moved) != fmt.Sprint([]int64{normal, early, expired}) {
		t.Fatalf("resolve moved %v %v", moved, err)
	}
	if moved, _, _ := l.Resolve(ctx, []facilitator.Resolution{mined(normal)}); len(moved) != 0 {
		t.Fatalf("a second resolve moved %v", moved)
	}
	if err := l.MarkBroadcast(ctx, []int64{early}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int64]string{early: "[signed broadcast mined]", normal: "[signed broadcast mined]", expired: "[signed expired]"} {
		if got := states(l, id); got != want {
			t.Errorf("settlement %d: events %s, want %s", id, got, want)
		}
	}
	r, _ := l.Row(expired)
	if d := r.Events[1].Detail; d != "no transaction of ours landed invalid_exact_evm_payload_authorization_valid_before" {
		t.Errorf("expired detail %q", d)
	}
	r, _ = l.Row(early)
	if d := r.Events[2].Detail; d != "tx 0x0000000000000000000000000000000000000000000000000000000000000001 block 5" || !r.UpdatedAt.Equal(start.Add(time.Second)) {
		t.Errorf("mined detail %q, updated %s", d, r.UpdatedAt)
	}

	if err := l.AddTx(ctx, early, txRec("bump")); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("AddTx on a mined row: %v, want ErrNotFound", err)
	}
	if err := l.Reopen(ctx, expired, "gone"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("Reopen of an expired row: %v, want ErrNotFound", err)
	}
	if err := l.Reopen(ctx, early, "receipt disappeared: reorganised"); err != nil {
		t.Fatal(err)
	}
	s, _ := l.SettlementByID(ctx, early)
	if s.State != facilitator.StateBroadcast || s.BlockNumber != 0 || s.TxHash != row(1, signerA, 0).Tx.Hash {
		t.Fatalf("reopened %+v: want broadcast, no block, the latest variant's hash", s)
	}
	bump := txRec("bump")
	bump.FeeCap = big.NewInt(1_000_000)
	if err := l.AddTx(ctx, early, bump); err != nil {
		t.Fatal(err)
	}
	if err := l.AddTx(ctx, early, bump); !errors.Is(err, facilitator.ErrDuplicate) {
		t.Errorf("the same variant twice: %v", err)
	}
	r, _ = l.Row(early)
	if s, _ := l.SettlementByID(ctx, early); s.TxHash != bump.Hash || len(r.Txs) != 2 || r.GasReserved.Int64() != 120_000*1_000_000 {
		t.Fatalf("after the bump: hash %s, %d txs, reserved %s", s.TxHash, len(r.Txs), r.GasReserved)
	}

	finals, err := l.MarkFinal(ctx, []int64{early, normal, expired})
	if err != nil || fmt.Sprint(finals) != fmt.Sprint([]int64{normal}) {
		t.Fatalf("MarkFinal moved %v %v, want only the mined one", finals, err)
	}
	if got := states(l, early); got != "[signed broadcast mined broadcast bumped]" {
		t.Errorf("events %s", got)
	}
	if got := states(l, normal); got != "[signed broadcast mined final]" {
		t.Errorf("events %s", got)
	}

	open, err := l.OpenSettlements(ctx, network, signerA)
	if err != nil || len(open) != 1 || open[0].ID != early || len(open[0].Txs) != 2 || open[0].Txs[1].Hash != bump.Hash || open[0].Txs[1].Gas != 0 {
		t.Fatalf("open %+v %v", open, err)
	}
}

// TestLedgerMoveNonce: a re-signed transaction moves an open settlement to a free nonce.
func TestLedgerMoveNonce(t *testing.T) {
	l, _ := newLedger(LedgerFaults{})
	ctx := context.Background()
	moved, other := mustInsert(t, l, row(1, signerA, 0)), mustInsert(t, l, row(2, signerA, 1))
	if err := l.MoveNonce(ctx, moved, 1, txRec("x")); !errors.Is(err, facilitator.ErrNonceTaken) {
		t.Fatalf("onto another's nonce: %v", err)
	}
	if err := l.MoveNonce(ctx, moved, 2, txRec("resigned")); err != nil {
		t.Fatal(err)
	}
	open, _ := l.OpenSettlements(ctx, network, signerA)
	if len(open) != 2 || open[0].ID != other || open[1].ID != moved || open[1].TxHash != txRec("resigned").Hash || len(open[1].Txs) != 2 {
		t.Fatalf("open %+v", open)
	}
	if _, err := l.InsertSettlement(ctx, row(3, signerA, 0)); err != nil {
		t.Fatalf("the old nonce is free again: %v", err)
	}
	// A failed settlement still moves (its nonce may be a gap to fill); a mined one does not.
	if _, _, err := l.Resolve(ctx, []facilitator.Resolution{{ID: other, State: facilitator.StateExpired}}); err != nil {
		t.Fatal(err)
	}
	if err := l.MoveNonce(ctx, other, 9, txRec("y")); err != nil {
		t.Fatalf("a failed settlement: %v", err)
	}
	minedRow := mustInsert(t, l, row(4, signerA, 10))
	if _, _, err := l.Resolve(ctx, []facilitator.Resolution{{ID: minedRow, State: facilitator.StateMined, TxHash: common.HexToHash("0x9"), BlockNumber: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := l.MoveNonce(ctx, minedRow, 11, txRec("z")); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("a mined settlement: %v", err)
	}
	if got := states(l, moved); got != "[signed renonced]" {
		t.Fatalf("events %s", got)
	}
}

// TestLedgerClaimDelivery: success goes to one caller, with the row's key id, of a settlement
// that succeeded without a mismatch; a release hands it on.
func TestLedgerClaimDelivery(t *testing.T) {
	l, _ := newLedger(LedgerFaults{})
	ctx := context.Background()
	keyed := row(1, signerA, 0)
	keyed.KeyID = "0123456789ab"
	id, open, mismatch := mustInsert(t, l, keyed), mustInsert(t, l, row(2, signerA, 1)), mustInsert(t, l, row(3, signerA, 2))
	if _, _, err := l.Resolve(ctx, []facilitator.Resolution{
		{ID: id, State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 1},
		{ID: mismatch, State: facilitator.StateMined, TxHash: common.HexToHash("0x2"), BlockNumber: 1, ErrorReason: facilitator.ReasonTransferEventMismatch},
	}); err != nil {
		t.Fatal(err)
	}
	claim := func(id int64, key string) bool {
		ok, err := l.ClaimDelivery(ctx, id, key, []byte(key), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if claim(id, "") || claim(id, "ffffffffffff") {
		t.Fatal("claimed with another key id")
	}
	if !claim(id, "0123456789ab") {
		t.Fatal("want the claim")
	}
	if ok, err := l.ClaimDelivery(ctx, id, "0123456789ab", []byte("second"), time.Minute); ok || !errors.Is(err, facilitator.ErrClaimUndecided) {
		t.Fatalf("a second claim while the first is undecided = %v, %v; want ErrClaimUndecided", ok, err)
	}
	if s, _ := l.SettlementByID(ctx, id); !s.Delivered {
		t.Fatal("not delivered")
	}
	if lapsed, err := l.ConfirmDeliveries(ctx, []facilitator.Delivery{{ID: id, Claim: []byte("0123456789ab")}}); err != nil || len(lapsed) != 0 {
		t.Fatalf("confirming = %v, %v", lapsed, err)
	}
	if claim(id, "0123456789ab") {
		t.Fatal("claimed a confirmed success")
	}
	if err := l.ReleaseDelivery(ctx, id, []byte("another claim")); err != nil || claim(id, "0123456789ab") {
		t.Fatalf("another claim's release released it: %v", err)
	}
	if err := l.ReleaseDelivery(ctx, id, []byte("0123456789ab")); err != nil || !claim(id, "0123456789ab") {
		t.Fatalf("after a release: %v", err)
	}
	if claim(open, "") || claim(mismatch, "") {
		t.Fatal("claimed an open settlement, or one with a mismatch")
	}
}

// TestLedgerClaimLease: a claim counts once confirmed; one left unconfirmed (its process died
// before the answer was written) holds the success only until its lease ends, then the next claim
// takes it, and the dead claim's late confirmation reports it lapsed. Resolve's claims follow the
// same rule. The Postgres ledger's TestClaimLease holds the same.
func TestLedgerClaimLease(t *testing.T) {
	l, clock := newLedger(LedgerFaults{})
	ctx := context.Background()
	id, carried := mustInsert(t, l, row(1, signerA, 0)), mustInsert(t, l, row(2, signerA, 1))
	if _, claimed, err := l.Resolve(ctx, []facilitator.Resolution{
		{ID: id, State: facilitator.StateMined, TxHash: common.HexToHash("0x1"), BlockNumber: 1},
		{ID: carried, State: facilitator.StateMined, TxHash: common.HexToHash("0x2"), BlockNumber: 1,
			Claim: &facilitator.SuccessClaim{Token: []byte("dead waiter"), Lease: 10 * time.Second}},
	}); err != nil || len(claimed) != 1 {
		t.Fatalf("resolve: claimed %v, %v", claimed, err)
	}
	if ok, err := l.ClaimDelivery(ctx, id, "", []byte("dead"), 10*time.Second); err != nil || !ok {
		t.Fatalf("first claim = %v, %v", ok, err)
	}
	clock.Advance(10 * time.Second) // the lease's last instant: still undecided
	for _, sid := range []int64{id, carried} {
		if ok, err := l.ClaimDelivery(ctx, sid, "", []byte("early"), 10*time.Second); ok || !errors.Is(err, facilitator.ErrClaimUndecided) {
			t.Fatalf("settlement %d: a retry within the lease = %v, %v; want ErrClaimUndecided", sid, ok, err)
		}
	}
	clock.Advance(time.Millisecond)
	for _, sid := range []int64{id, carried} {
		if ok, err := l.ClaimDelivery(ctx, sid, "", []byte("retry"), 10*time.Second); err != nil || !ok {
			t.Fatalf("settlement %d: a retry past the dead claim's lease = %v, %v; want the claim", sid, ok, err)
		}
	}
	lapsed, err := l.ConfirmDeliveries(ctx, []facilitator.Delivery{{ID: id, Claim: []byte("dead")}, {ID: carried, Claim: []byte("retry")}})
	if err != nil || len(lapsed) != 1 || lapsed[0] != id {
		t.Fatalf("confirming the dead claim and the retry's = %v, %v; want %d lapsed", lapsed, err, id)
	}
	for _, sid := range []int64{id, carried} {
		if s, _ := l.SettlementByID(ctx, sid); s.ClaimTakeovers != 1 {
			t.Fatalf("settlement %d: %d takeovers counted, want 1", sid, s.ClaimTakeovers)
		}
	}
	// Confirmed: no lease ends it.
	clock.Advance(time.Hour)
	if ok, err := l.ClaimDelivery(ctx, carried, "", []byte("late"), 10*time.Second); err != nil || ok {
		t.Fatalf("a claim of a confirmed success = %v, %v; want false", ok, err)
	}
}

// TestLedgerFaults: a failed call writes nothing; an ambiguous one writes and errs; a slow one
// takes the clock forward; reads only fail; faults switch off.
func TestLedgerFaults(t *testing.T) {
	ctx := context.Background()
	l, _ := newLedger(LedgerFaults{Fail: 1})
	if _, err := l.InsertSettlement(ctx, row(1, signerA, 0)); !errors.Is(err, ErrLedgerDown) || len(l.Rows()) != 0 {
		t.Fatalf("failed insert: %v, %d rows", err, len(l.Rows()))
	}
	if _, err := l.SettlementByID(ctx, 1); !errors.Is(err, ErrLedgerDown) {
		t.Fatalf("failed read: %v", err)
	}

	l, clock := newLedger(LedgerFaults{Ambiguous: 1, Slow: 1, SlowBy: 3 * time.Second})
	_, err := l.InsertSettlement(ctx, row(1, signerA, 0))
	if !errors.Is(err, ErrLedgerAmbiguous) || len(l.Rows()) != 1 {
		t.Fatalf("ambiguous insert: %v, %d rows", err, len(l.Rows()))
	}
	if clock.Now() != start.Add(3*time.Second) {
		t.Fatalf("clock %s after a slow call", clock.Now())
	}
	// The engine's check after an ambiguous commit: the row is there, with our transaction.
	s, err := l.SettlementByKey(ctx, row(1, signerA, 0).Key)
	if err != nil || s.TxHash != row(1, signerA, 0).Tx.Hash {
		t.Fatalf("read after the ambiguous commit: %+v %v", s, err)
	}
	if _, err := l.InsertSettlement(ctx, row(1, signerA, 0)); !errors.Is(err, ErrLedgerAmbiguous) {
		t.Fatalf("a duplicate whose answer is lost: %v", err)
	}
	if moved, err := l.MarkFinal(ctx, []int64{1}); err == nil || len(moved) != 0 {
		t.Fatalf("MarkFinal of a signed row: %v %v", moved, err)
	}

	l.SetFaults(LedgerFaults{})
	if _, err := l.InsertSettlement(ctx, row(2, signerA, 1)); err != nil {
		t.Fatalf("faults off: %v", err)
	}

	// At a rate, some calls fail and the rest pass, the same ones for the same seed.
	run := func() string {
		l, _ := newLedger(LedgerFaults{Fail: 0.3, Ambiguous: 0.2})
		out := ""
		for i := range 30 {
			_, err := l.InsertSettlement(ctx, row(byte(i), signerA, uint64(i)))
			switch {
			case errors.Is(err, ErrLedgerDown):
				out += "F"
			case errors.Is(err, ErrLedgerAmbiguous):
				out += "A"
			case err == nil:
				out += "."
			}
		}
		return out
	}
	a, b := run(), run()
	if a != b {
		t.Fatalf("same seed, different faults: %s %s", a, b)
	}
	for _, c := range "FA." {
		if !containsRune(a, c) {
			t.Fatalf("faults %s: want some of each", a)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.SettlementByID(done, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled context: %v", err)
	}
}

func containsRune(s string, r rune) bool {
	for _, c := range s {
		if c == r {
			return true
		}
	}
	return false
}
