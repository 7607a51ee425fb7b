package status_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"errors"
	"math/big"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// Each test below is one answer of the status service: its state, what it was read from (basis),
// and, once on chain, the transaction, block, confirmations and finality.

// unused: neither the ledger nor the index knows the authorization; the chain says unused.
func TestStatusUnused(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1), 1)
	h := env.Head(t)
	st, found, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil || found {
		t.Fatalf("found %v, err %v; want not found and no error", found, err)
	}
	if st.State != facilitator.StatusUnused || st.Basis != "chain" || st.Transaction != "" || st.SettledBy != "" || st.Final ||
		st.Confirmations != 0 || st.Head < h {
		t.Fatalf("status: %+v, want unused from the chain", st)
	}
	if st.Network != p.Key().Network || st.Asset != env.Chain.USDC.Address.Hex() || st.Authorizer != p.From().Hex() ||
		st.Nonce != hexutil.Encode(p.Nonce[:]) {
		t.Fatalf("status does not echo the authorization: %+v", st)
	}

	// A network this service does not serve is the caller's mistake, not an outage.
	k := p.Key()
	k.Network = "eip155:1"
	var fe *facilitator.Error
	if _, _, err := env.Status(env.DB, 2).Authorization(ctx, k); !errors.As(err, &fe) || fe.Code != facilitator.EInvalid ||
		fe.Reason != facilitator.ReasonInvalidNetwork {
		t.Fatalf("unknown network: %v, want invalid_network", err)
	}
}

// pending: our transaction is broadcast and not mined: the ledger answers, with the hash.
func TestStatusPending(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 42_000)
	p.ID = stacktest.RandomID(t)
	body := p.Body(t)
	env.ManualMining(t)
	e := env.NewEngine(t, stacktest.EngineOptions{Deadline: pendingDeadline})
	hash := e.SettlePending(t, body)

	svc := env.Status(env.DB, 2)
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	if st.State != facilitator.StatusPending || st.Basis != "ledger" || st.Transaction != hash.Hex() || st.BlockNumber != 0 ||
		st.Confirmations != 0 || st.Final || st.SettledBy != "" || st.To != p.PayTo.Hex() || st.Value != "42000" ||
		st.ValidBefore != p.ValidBefore.String() || st.Finality.Rule != "depth:2" || st.Finality.FinalBlock != st.Head-1 {
		t.Fatalf("status: %+v, want pending from the ledger with %s, finality by depth 2", st, hash)
	}
	bySettlement, err := svc.Settlement(ctx, hash)
	if err != nil || !reflect.DeepEqual(bySettlement, st) {
		t.Fatalf("by transaction: %+v %v, want %+v", bySettlement, err, st)
	}
	byPayment, err := svc.Payment(ctx, "", p.ID)
	want := st
	want.PaymentID = p.ID
	if err != nil || !reflect.DeepEqual(byPayment, want) {
		t.Fatalf("by payment id: %+v %v, want %+v", byPayment, err, want)
	}
}

// settled by the facilitator: the ledger answers, with confirmations counted from the chain's head
// and final at the status service's depth, or when the ledger says final.
func TestStatusSettledByFacilitator(t *testing.T) {
	ctx := context.Background()
	const depth = 3
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 500_000)
	e := env.NewEngine(t, stacktest.EngineOptions{Depth: 10, Deadline: 10 * time.Second}) // the engine keeps it mined, not final
	out := e.MustSucceed(t, p.Body(t))
	hash := common.HexToHash(out.Response.Transaction)
	rc := env.Receipt(t, hash)
	svc := env.Status(env.DB, depth)

	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "facilitator" || st.Basis != "ledger" || st.Transaction != hash.Hex() ||
		st.BlockNumber != rc.BlockNumber.Uint64() || st.Confirmations != 1 || st.Final {
		t.Fatalf("status at 1 confirmation: %+v", st)
	}
	for range depth - 1 {
		env.Mine(t)
	}
	st, _, err = svc.Authorization(ctx, p.Key())
	if err != nil || st.State != facilitator.StatusSettled || st.Confirmations != depth || !st.Final {
		t.Fatalf("status at %d confirmations: %+v %v, want final", depth, st, err)
	}
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined {
		t.Fatalf("ledger: %+v, want mined (the engine's depth is 10)", r)
	}

	// The ledger's final counts even where the service's own depth is not reached.
	q := env.NewPay(t, env.FundedPayer(t, 1_000_000), 600_000)
	e1 := env.NewEngine(t, stacktest.EngineOptions{Depth: 1, Deadline: 10 * time.Second})
	e1.MustSucceed(t, q.Body(t))
	waitState(t, q.Key(), facilitator.StateFinal)
	st, _, err = env.Status(env.DB, 100).Authorization(ctx, q.Key())
	if err != nil || st.State != facilitator.StatusSettled || !st.Final || st.Confirmations >= 100 {
		t.Fatalf("status of a final row at depth 100: %+v %v, want final", st, err)
	}
}

// settled by another party: no ledger row; from the chain (used) before the index has it, then from
// the index with the transaction, block, payee and amount.
func TestStatusSettledByOther(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 77_000)
	theirs := p.SubmitElsewhere(t)
	rc := env.Receipt(t, theirs)
	svc := env.Status(env.DB, 2)

	if env.Use(t, p.Key()) == nil {
		st, found, err := svc.Authorization(ctx, p.Key())
		if err != nil || found || st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Basis != "chain" ||
			st.Transaction != "" && st.Transaction != theirs.Hex() {
			t.Fatalf("status before indexing: %+v %v %v, want settled by other from the chain", st, found, err)
		}
	}

	env.StartIndexer(t)
	env.Mine(t)
	env.WaitIndexed(t, env.Head(t))
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Basis != "index" || st.Transaction != theirs.Hex() ||
		st.BlockNumber != rc.BlockNumber.Uint64() || st.Confirmations != 2 || !st.Final || st.To != p.PayTo.Hex() || st.Value != "77000" {
		t.Fatalf("status from the index: %+v, want settled by other with %s", st, theirs)
	}
	if st.IndexedHead < rc.BlockNumber.Uint64() {
		t.Fatalf("indexed head %d below the transfer's block %d", st.IndexedHead, rc.BlockNumber)
	}
	// Not ours: by its hash, status knows no settlement.
	if _, err := svc.Settlement(ctx, theirs); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("Settlement(%s): %v, want ErrNotFound", theirs, err)
	}
}

// canceled: the authorizer canceled it on chain; the index answers canceled. Before the index has it,
// the chain can only say "used", and status must not turn that into a payment.
func TestStatusCanceled(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 10_000)
	tx := env.CancelAuthorization(t, payer, p.Nonce)
	rc := env.Receipt(t, tx)
	svc := env.Status(env.DB, 2)

	env.StartIndexer(t)
	env.WaitIndexed(t, rc.BlockNumber.Uint64())
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	if st.State != facilitator.StatusCanceled || st.Basis != "index" || st.Transaction != tx.Hex() || st.SettledBy != "" ||
		st.BlockNumber != rc.BlockNumber.Uint64() || st.To != "" {
		t.Fatalf("status from the index: %+v, want canceled with %s", st, tx)
	}
}

// TestStatusCanceledNotYetIndexed: a cancellation the index has not reached. authorizationState
// says only "used or canceled"; answering "settled" would tell a merchant to serve for a payment
// that never happened.
func TestStatusCanceledNotYetIndexed(t *testing.T) {
	ctx := context.Background()
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 10_000)
	env.CancelAuthorization(t, payer, p.Nonce) // no indexer runs
	if env.Use(t, p.Key()) != nil {
		t.Fatal("the index has the cancellation although no indexer runs")
	}
	st, _, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	if st.State == facilitator.StatusSettled {
		t.Fatalf("status of a canceled, not yet indexed authorization: %+v; \"settled\" (by %q) claims a transfer that never "+
			"happened", st, st.SettledBy)
	}
}

// failed: our transaction was mined and reverted (the payer's balance went elsewhere first); the
// authorization is still unused. The ledger answers failed, with our transaction, once the chain
// says it is still unused.
func TestStatusFailed(t *testing.T) {
	ctx := context.Background()
	p, hash := revertedSettlement(t)
	st, found, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	// No indexer runs here: the index does not reach the head, so "unused since" is the chain's word.
	if st.State != facilitator.StatusFailed || st.Basis != "ledger+chain" || st.Reason != facilitator.ReasonTransactionFailed ||
		st.Transaction != hash.Hex() || st.SettledBy != "" {
		t.Fatalf("status: %+v, want failed from the ledger with %s", st, hash)
	}
	if used, err := env.Chain.USDC.AuthorizationState(ctx, p.From(), p.Nonce); err != nil || used {
		t.Fatalf("authorizationState: %v %v, want unused", used, err)
	}
}

// TestStatusFailedThenSettledElsewhere: our transaction reverted (failed), and later another party
// settles the very same authorization. The index is the memory of the chain: status must say
// settled (by other), not "failed: sign anew", which would have the payer pay twice.
func TestStatusFailedThenSettledElsewhere(t *testing.T) {
	ctx := context.Background()
	p, _ := revertedSettlement(t)
	if err := env.Chain.USDC.Mint(ctx, p.From(), big.NewInt(p.Value)); err != nil {
		t.Fatal(err)
	}
	theirs := p.SubmitElsewhere(t)
	env.StartIndexer(t)
	env.WaitIndexed(t, env.Receipt(t, theirs).BlockNumber.Uint64())
	st, _, err := env.Status(env.DB, 2).Authorization(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	if st.State != facilitator.StatusSettled || st.SettledBy != "other" || st.Transaction != theirs.Hex() {
		t.Fatalf("status: %+v, want settled by other with %s (the ledger's reverted row is older news than the index's use)", st, theirs)
	}
}

// expired, and the ledger's other outcomes, read from rows as the engine and the jobs write them.
func TestStatusLedgerOutcomes(t *testing.T) {
	ctx := context.Background()
	svc := env.Status(env.DB, 2)
	for _, tc := range []struct {
		res    facilitator.Resolution
		state  string
		reason string
	}{
		{facilitator.Resolution{State: facilitator.StateExpired, ErrorReason: facilitator.ReasonValidBefore}, facilitator.StatusExpired, facilitator.ReasonValidBefore},
		{facilitator.Resolution{State: facilitator.StateReverted, ErrorReason: facilitator.ReasonTransactionFailed}, facilitator.StatusFailed, facilitator.ReasonTransactionFailed},
		{facilitator.Resolution{State: facilitator.StateCanceled, ErrorReason: facilitator.ReasonNonceAlreadyUsed}, facilitator.StatusCanceled, facilitator.ReasonNonceAlreadyUsed},
		{facilitator.Resolution{State: facilitator.StateSigned}, facilitator.StatusPending, ""},
	} {
		t.Run(string(tc.res.State), func(t *testing.T) {
			k, hash := insertRow(t, nil)
			if tc.res.State != facilitator.StateSigned {
				tc.res.ID = env.Row(t, k).ID
				if _, _, err := env.DB.Resolve(ctx, []facilitator.Resolution{tc.res}); err != nil {
					t.Fatal(err)
				}
			}
			st, found, err := svc.Authorization(ctx, k)
			if err != nil || !found {
				t.Fatalf("found %v, err %v", found, err)
			}
			if st.State != tc.state || st.Reason != tc.reason || st.Basis != "ledger" || st.SettledBy != "" || st.Final {
				t.Fatalf("status: %+v, want %s (%s) from the ledger", st, tc.state, tc.reason)
			}
			if tc.res.State == facilitator.StateSigned && st.Transaction != hash.Hex() {
				t.Fatalf("pending status names %q, want %s", st.Transaction, hash)
			}
		})
	}
}

// Payment and Settlement lookups: by payment id (scoped), and by any of our transactions' hashes
// (a fee-bumped variant too); unknown ones are facilitator.ErrNotFound.
func TestStatusLookups(t *testing.T) {
	ctx := context.Background()
	svc := env.Status(env.DB, 2)
	id := stacktest.RandomID(t)
	k, first := insertRow(t, &facilitator.PaymentIDBinding{ID: id, Summary: map[string]string{}})
	bumped := common.Hash{0xb0}
	bumped[31] = 1
	var rnd [31]byte
	_, _ = rand.Read(rnd[:])
	copy(bumped[1:], rnd[:])
	if err := env.DB.AddTx(ctx, env.Row(t, k).ID, facilitator.TxRecord{Hash: bumped, Raw: []byte{0x02}, TipCap: big.NewInt(2), FeeCap: big.NewInt(4)}); err != nil {
		t.Fatal(err)
	}
	want, found, err := svc.Authorization(ctx, k)
	if err != nil || !found || want.State != facilitator.StatusPending {
		t.Fatalf("status: %+v %v %v", want, found, err)
	}

	for _, h := range []common.Hash{first, bumped} {
		st, err := svc.Settlement(ctx, h)
		if err != nil || !reflect.DeepEqual(st, want) {
			t.Fatalf("Settlement(%s): %+v %v, want %+v", h, st, err, want)
		}
	}
	st, err := svc.Payment(ctx, "", id)
	if err != nil || st.PaymentID != id || st.State != want.State || st.Transaction != want.Transaction {
		t.Fatalf("Payment(%s): %+v %v", id, st, err)
	}

	if _, err := svc.Payment(ctx, "", stacktest.RandomID(t)); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("unknown payment id: %v, want ErrNotFound", err)
	}
	if _, err := svc.Payment(ctx, "merchant-7", id); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("payment id in another scope: %v, want ErrNotFound", err)
	}
	if _, err := svc.Settlement(ctx, common.Hash{0xde, 0xad}); !errors.Is(err, facilitator.ErrNotFound) {
		t.Fatalf("unknown transaction: %v, want ErrNotFound", err)
	}
}

// When the node cannot be read, the ledger and the index still answer; confirmations then count
// from the indexed head.
func TestStatusHeadUnavailable(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 9_000)
	e := env.NewEngine(t, stacktest.EngineOptions{Depth: 10, Deadline: 10 * time.Second})
	e.MustSucceed(t, p.Body(t))
	env.StartIndexer(t)
	env.Mine(t)
	env.WaitIndexed(t, env.Head(t))
	cur, _, _ := env.DB.Cursor(ctx, env.Network().ID)
	n := env.Network()
	n.Finality.Depth = 2
	svc := status.New(env.DB, []status.Network{{Network: n, Head: downHead{}}}, nil)
	st, found, err := svc.Authorization(ctx, p.Key())
	if err != nil || !found {
		t.Fatalf("found %v, err %v", found, err)
	}
	b := env.Row(t, p.Key()).BlockNumber
	if st.State != facilitator.StatusSettled || st.Head != cur.Number || st.IndexedHead != cur.Number || st.Confirmations != cur.Number-b+1 {
		t.Fatalf("status with the node down: %+v, want confirmations from the indexed head %d", st, cur.Number)
	}
}

type downHead struct{}

func (downHead) CallContext(context.Context, any, string, ...any) error {
	return errors.New("connection refused")
}

func (downHead) BatchCallContext(context.Context, []rpc.BatchElem) error {
	return errors.New("connection refused")
}

// --- helpers ---

// waitState waits until the ledger has the authorization's settlement in state s.
func waitState(t testing.TB, k facilitator.AuthorizationKey, s facilitator.State) {
	t.Helper()
	limit := time.Now().Add(10 * time.Second)
	for {
		r := env.Row(t, k)
		if r.State == s {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("settlement %d is %s, want %s", r.ID, r.State, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// revertedSettlement makes a settlement whose transaction is mined and reverts: the engine signs it
// with mining off and stops, the node drops it, the payer's whole balance goes elsewhere through
// another authorization, and a restarted engine's recovery resends it into the revert. It returns
// the payment and our transaction's hash, once the ledger says reverted.
func revertedSettlement(t *testing.T) (stacktest.Pay, common.Hash) {
	t.Helper()
	payer := env.FundedPayer(t, 100_000)
	p := env.NewPay(t, payer, 100_000)
	drain := env.NewPay(t, payer, 100_000)
	body := p.Body(t)
	e, hash := env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Deadline: pendingDeadline})
	env.DropPool(t)
	env.SetAutomine(t, true)
	drain.SubmitElsewhere(t)
	env.NewEngine(t, stacktest.EngineOptions{Signers: e.Signers, Deadline: pendingDeadline}) // recovery resends the ledger's transaction
	waitState(t, p.Key(), facilitator.StateReverted)
	rc := env.Receipt(t, hash)
	if rc == nil || rc.Status != types.ReceiptStatusFailed {
		t.Fatalf("receipt of %s: %+v, want a revert", hash, rc)
	}
	return p, hash
}

// insertRow writes a settlement row as the engine does before a broadcast (signed, one transaction),
// for a fresh authorization; it returns the key and the transaction's hash. Nothing is sent.
func insertRow(t testing.TB, id *facilitator.PaymentIDBinding) (facilitator.AuthorizationKey, common.Hash) {
	t.Helper()
	p := env.NewPay(t, mustKey(t), 1_000)
	var fp facilitator.Fingerprint
	_, _ = rand.Read(fp[:])
	var hash common.Hash
	_, _ = rand.Read(hash[:])
	n := &facilitator.NewSettlement{Key: p.Key(), Fingerprint: fp, PayTo: p.PayTo, Value: big.NewInt(p.Value), ValidAfter: big.NewInt(0),
		ValidBefore: p.ValidBefore, X402Version: 2, Request: []byte("{}"), Signer: stacktest.AddressOf(mustKey(t)), TxNonce: 0,
		Tx: facilitator.TxRecord{Hash: hash, Raw: []byte{0x01}, TipCap: big.NewInt(1), FeeCap: big.NewInt(2)}, PaymentID: id}
	if _, err := env.DB.InsertSettlement(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	return p.Key(), hash
}

func mustKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The timeline is our settlement's life from the ledger, oldest first, with times; an
// authorization we never settled has none, and a network not served is refused.
func TestStatusTimeline(t *testing.T) {
	ctx := context.Background()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 7_000)
	e := env.NewEngine(t, stacktest.EngineOptions{})
	e.MustSettle(t, p.Body(t))
	svc := env.Status(env.DB, 2)
	evs, err := svc.Timeline(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	var states []facilitator.State
	for i, ev := range evs {
		states = append(states, ev.State)
		if ev.At.IsZero() || (i > 0 && (ev.ID <= evs[i-1].ID || ev.At.Before(evs[i-1].At))) {
			t.Fatalf("events out of order or without times: %+v", evs)
		}
	}
	want := []facilitator.State{facilitator.StateSigned, facilitator.StateBroadcast, facilitator.StateMined}
	if len(states) < len(want) || !slices.Equal(states[:len(want)], want) {
		t.Fatalf("timeline %v, want it to start %v", states, want)
	}

	other := env.NewPay(t, env.FundedPayer(t, 1), 1)
	if evs, err := svc.Timeline(ctx, other.Key()); err != nil || len(evs) != 0 {
		t.Fatalf("never settled: %v %v, want no events", evs, err)
	}
	k := p.Key()
	k.Network = "eip155:1"
	if _, err := svc.Timeline(ctx, k); facilitator.ErrorCode(err) != facilitator.EInvalid {
		t.Fatalf("unknown network: %v, want invalid", err)
	}
}

// TestStatusMinedRowReorganisedAway: a mined row whose block a reorganisation replaced, before
// any engine noticed (its process died), is deep enough by its block number; the answer must
// not call it final, since the transfer is not on the chain any more. (The simulator found it:
// status promoted any mined row to final by the depth of the number the ledger recorded.)
func TestStatusMinedRowReorganisedAway(t *testing.T) {
	ctx := context.Background()
	const depth = 3
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	out := env.SettleAndStop(t, p.Body(t)) // nothing watches the row from here on
	rc := env.Receipt(t, common.HexToHash(out.Response.Transaction))
	env.Reorg(t, env.Head(t)-rc.BlockNumber.Uint64()+1) // our block, and any after it, replaced by empty ones
	for range depth {
		env.Mine(t)
	}
	if r := env.Receipt(t, rc.TxHash); r != nil {
		t.Fatalf("the transaction is still mined after the reorg: %+v", r)
	}
	if r := env.Row(t, p.Key()); r.State != facilitator.StateMined || r.BlockNumber != rc.BlockNumber.Uint64() {
		t.Fatalf("ledger: %+v, want the stale mined row", r)
	}
	st, _, err := env.Status(env.DB, depth).Authorization(ctx, p.Key())
	if err != nil {
		t.Fatal(err)
	}
	if st.Final || st.Confirmations < depth {
		t.Fatalf("status of a transfer reorganised away: %+v, want not final (and the row's confirmations by number)", st)
	}
}
