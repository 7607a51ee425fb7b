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
	if err := l.Reopen(ctx, facilitator.MinedIn{ID: expired}, "gone"); !errors.Is(err, facilitator.ErrNotFound) {
		t.Errorf("Reopen of an expired row: %v, want ErrNotFound", err)
	}
	if err := l.Reopen(ctx, facilitator.MinedIn{ID: early, BlockHash: mined(early).BlockHash}, "receipt disappeared: reorganised"); err != nil {
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

	finals, err := l.MarkFinal(ctx, []facilitator.MinedIn{{ID: early, BlockHash: common.HexToHash("0x2")}, {ID: normal, BlockHash: common.HexToHash("0x2")}, {ID: expired, BlockHash: common.HexToHash("0x2")}})
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
	if moved, err := l.MarkFinal(ctx, []facilitator.MinedIn{{ID: 1}}); err == nil || len(moved) != 0 {
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
