package settle_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestSettleAdoptsLostSettlement: the ledger loses a settlement's commits (a failover to an
// asynchronous standby, a restore) after its transaction mined. A restarted engine asked for the
// same payment again finds the authorization used by a transaction of its own key, adopts it
// and answers success with that transaction's hash: no terminal "nonce already used", nothing
// sent again, the payee paid once, and the key's next nonce follows the chain's.
func TestSettleAdoptsLostSettlement(t *testing.T) {
	first := env.NewEngine(t, stacktest.EngineOptions{})
	payer := env.FundedPayer(t, 2_000_000)
	p := env.NewPay(t, payer, 400_000)
	p.ID = stacktest.RandomID(t)
	body := p.Body(t)
	out := first.MustSucceed(t, body)
	if err := first.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	env.LoseSettlements(t, out.SettlementID)
	if _, err := first.DB.SettlementByKey(context.Background(), p.Key()); err == nil {
		t.Fatal("the row is still there")
	}

	again := env.NewEngine(t, stacktest.EngineOptions{Signers: first.Signers})
	retry := again.MustSettle(t, body)
	if !retry.Response.Success || retry.Response.Transaction != out.Response.Transaction || !retry.Claimed {
		t.Fatalf("retry after the loss: %+v, want success with %s", retry.Response, out.Response.Transaction)
	}
	row := env.Row(t, p.Key())
	if !row.Adopted || !row.State.Succeeded() || row.TxHash.Hex() != out.Response.Transaction || !row.Delivered {
		t.Fatalf("adopted row %+v", row)
	}
	if rec, err := again.DB.PaymentID(context.Background(), "", p.ID); err != nil || rec.Settlement.ID != row.ID {
		t.Fatalf("the payment id after the adoption: %+v %v, want bound to settlement %d", rec, err, row.ID)
	}
	if rep := again.MustSettle(t, body); rep.Response.Success || rep.Response.ErrorReason != facilitator.ReasonAlreadySettled ||
		rep.Response.Transaction != out.Response.Transaction {
		t.Fatalf("a second retry: %+v", rep.Response)
	}
	if got := env.Balance(t, p.PayTo); got != 400_000 {
		t.Fatalf("payee holds %d, want 400000", got)
	}
	signer := crypto.PubkeyToAddress(first.Signer().PublicKey)
	if n := nonceOf(t, signer, "latest"); n != 1 {
		t.Fatalf("signer sent %d transactions, want 1", n)
	}
	// The key's next settlement takes the next nonce: no gap, no reuse.
	next := env.NewPay(t, payer, 100_000)
	if o := again.MustSucceed(t, next.Body(t)); env.Row(t, next.Key()).TxNonce != 1 {
		t.Fatalf("next settlement %+v at nonce %d, want 1", o.Response, env.Row(t, next.Key()).TxNonce)
	}
}

// TestSettleConcurrentRetriesCountOneAdoption: retries of a lost payment arriving at once (on
// two replicas, several each) all find the authorization used by our key and adopt the same
// transaction; only the one whose write recorded it counts it (the adoption metric and log), so
// that the metric counts transactions, not retries.
func TestSettleConcurrentRetriesCountOneAdoption(t *testing.T) {
	first := env.NewEngine(t, stacktest.EngineOptions{})
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	body := p.Body(t)
	out := first.MustSucceed(t, body)
	if err := first.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	env.LoseSettlements(t, out.SettlementID)

	obs := &recordingObserver{}
	opts := stacktest.EngineOptions{Signers: first.Signers, Config: func(c *settle.Config) { c.Observer = obs }}
	replicas := []*stacktest.Engine{env.NewEngine(t, opts), env.NewEngine(t, opts)}
	const each = 4
	var wg sync.WaitGroup
	for i := range 2 * each {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replicas[i%2].MustSettle(t, body)
		}()
	}
	wg.Wait()
	if row := env.Row(t, p.Key()); !row.Adopted || row.TxHash.Hex() != out.Response.Transaction {
		t.Fatalf("row after the retries %+v", row)
	}
	signer := crypto.PubkeyToAddress(first.Signer().PublicKey)
	if got := obs.count("adopted " + env.Network().ID + " " + signer.Hex()); got != 1 {
		t.Fatalf("the adoption was counted %d times, want 1", got)
	}
}

// TestSettleForeignUseStillFails: an authorization used by a transaction of a key that is not
// ours is still answered nonce_already_used, and nothing is adopted.
func TestSettleForeignUseStillFails(t *testing.T) {
	foreign := env.NewEngine(t, stacktest.EngineOptions{})
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 300_000)
	body := p.Body(t)
	out := foreign.MustSucceed(t, body)
	if err := foreign.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	env.LoseSettlements(t, out.SettlementID) // as if another facilitator had settled it

	ours := env.NewEngine(t, stacktest.EngineOptions{})
	res := ours.MustSettle(t, body)
	if res.Response.Success || res.Response.ErrorReason != facilitator.ReasonNonceAlreadyUsed {
		t.Fatalf("a foreign key's use: %+v, want nonce_already_used", res.Response)
	}
	if _, err := ours.DB.SettlementByKey(context.Background(), p.Key()); err == nil {
		t.Fatal("a foreign key's transaction was adopted")
	}
}

// TestWatcherAdoptsLostVariant: the ledger keeps a settlement's row but loses the record of the
// variant that mined (a fee bump whose AddTx commit a failover lost). The restarted engine's
// pinned reads find the authorization used by a transaction that is none of the row's variants,
// signed by its own key: the variant is adopted and the settlement resolved mined, not
// settled_elsewhere, and a retry gets the success with that variant's hash.
func TestWatcherAdoptsLostVariant(t *testing.T) {
	ctx := context.Background()
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	opts := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: time.Second}
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 250_000)
	body := p.Body(t)
	_, first := env.SettlePendingAndStop(t, body, opts)

	// The lost variant: the same call at the same nonce with higher fees, signed by the key and
	// mined in place of the recorded one.
	row := openRows(t, addr)[p.Key()]
	var old types.Transaction
	if err := old.UnmarshalBinary(row.Txs[0].Raw); err != nil {
		t.Fatal(err)
	}
	bumped, err := types.SignNewTx(signer, types.LatestSignerForChainID(old.ChainId()), &types.DynamicFeeTx{
		ChainID: old.ChainId(), Nonce: old.Nonce(), To: old.To(), Data: old.Data(), Gas: old.Gas(),
		GasTipCap: new(big.Int).Mul(old.GasTipCap(), big.NewInt(2)), GasFeeCap: new(big.Int).Mul(old.GasFeeCap(), big.NewInt(2)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Chain.Client.SendTransaction(ctx, bumped); err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	if r := env.Receipt(t, bumped.Hash()); r == nil || r.Status != 1 {
		t.Fatalf("the bumped variant did not mine: %+v", r)
	}

	env.NewEngine(t, opts)
	got := mineUntilClosed(t, p.Key(), 20*time.Second)
	if !got.State.Succeeded() || got.TxHash != bumped.Hash() || !got.Adopted {
		t.Fatalf("row %+v, want mined by the lost variant %s (first %s), adopted", got, bumped.Hash(), first)
	}
	env.SetAutomine(t, true)
	retry := env.NewEngine(t, opts).MustSettle(t, body)
	if !retry.Response.Success || retry.Response.Transaction != bumped.Hash().Hex() {
		t.Fatalf("retry: %+v, want success with %s", retry.Response, bumped.Hash())
	}
	if got := env.Balance(t, p.PayTo); got != 250_000 {
		t.Fatalf("payee holds %d", got)
	}
}

// TestWatcherAdoptsAnotherKeysTransaction: the ledger lost a settlement signed on one key (B),
// whose transaction mined; a retry made a new row on another key (A), whose transaction never
// mined (dropped from the pool). The restarted engine's watcher finds the authorization used by
// B's transaction and adopts it into A's row, which moves to B's nonce, key included: left at
// A's nonce, it would hold a nonce nothing sends there and A's next settlement would wait behind
// it forever (the simulator's seed 4707).
func TestWatcherAdoptsAnotherKeysTransaction(t *testing.T) {
	ctx := context.Background()
	keyA, keyB := env.NewSigner(t), env.NewSigner(t)
	addrA, addrB := crypto.PubkeyToAddress(keyA.PublicKey), crypto.PubkeyToAddress(keyB.PublicKey)
	payer := env.FundedPayer(t, 1_000_000)
	p := env.NewPay(t, payer, 300_000)
	body := p.Body(t)
	env.SettlePendingAndStop(t, body, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{keyA}, Deadline: time.Second})
	row := openRows(t, addrA)[p.Key()]
	if row == nil || row.TxNonce != 0 {
		t.Fatalf("the retry's row on key A: %+v", row)
	}
	env.DropPool(t)

	// The lost settlement: the same call, signed by B at its third nonce (B's two earlier
	// transactions: B's nonce is not A's), mined.
	var onA types.Transaction
	if err := onA.UnmarshalBinary(row.Txs[0].Raw); err != nil {
		t.Fatal(err)
	}
	chainSigner := types.LatestSignerForChainID(onA.ChainId())
	var onB *types.Transaction
	for nonce := uint64(0); nonce < 3; nonce++ {
		tx := &types.DynamicFeeTx{ChainID: onA.ChainId(), Nonce: nonce, To: &addrB, Gas: 21_000, GasTipCap: onA.GasTipCap(), GasFeeCap: onA.GasFeeCap()}
		if nonce == 2 {
			tx.To, tx.Data, tx.Gas = onA.To(), onA.Data(), onA.Gas()
		}
		signed, err := types.SignNewTx(keyB, chainSigner, tx)
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Chain.Client.SendTransaction(ctx, signed); err != nil {
			t.Fatal(err)
		}
		onB = signed
	}
	env.Mine(t)
	if r := env.Receipt(t, onB.Hash()); r == nil || r.Status != 1 {
		t.Fatalf("B's transaction did not mine: %+v", r)
	}

	both := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{keyA, keyB}, Deadline: time.Second}
	env.NewEngine(t, both)
	got := mineUntilClosed(t, p.Key(), 20*time.Second)
	if !got.State.Succeeded() || !got.Adopted || got.TxHash != onB.Hash() || got.Signer != addrB || got.TxNonce != 2 {
		t.Fatalf("row %+v, want mined by B's transaction %s at B's nonce 2, adopted", got, onB.Hash())
	}

	// A's nonces continue without a gap: its next settlements take 1 and 2 (its variant at 0
	// was resent and reverted, the authorization used) and both mine.
	env.SetAutomine(t, true)
	onlyA := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{keyA}, Deadline: 10 * time.Second})
	for want := uint64(1); want <= 2; want++ {
		next := env.NewPay(t, payer, 100_000)
		out := onlyA.MustSucceed(t, next.Body(t))
		if s := env.Row(t, next.Key()); s.Signer != addrA || s.TxNonce != want {
			t.Fatalf("A's next settlement %+v (%s), want at A's nonce %d", s, out.Response.Transaction, want)
		}
	}
	if retry := env.NewEngine(t, both).MustSettle(t, body); !retry.Response.Success || retry.Response.Transaction != onB.Hash().Hex() {
		t.Fatalf("retry: %+v, want success with %s", retry.Response, onB.Hash())
	}
	if got := env.Balance(t, p.PayTo); got != 300_000 {
		t.Fatalf("payee holds %d", got)
	}
}

// TestWatcherAdoptsInPlaceOnlyOnceItsNonceIsUsed: the ledger lost a settlement whose transaction
// T (the key's nonce 0) still waited in the pool. After the restart another payment H was signed
// at nonce 0 (the ledger no longer held it), and the lost payment's retry R at nonce 1; R's
// transaction then left the pool, and T mined in a block past H's validBefore, so H expired
// holding nonce 0. R's watcher finds T, ours, used its authorization, but H holds T's place: R
// could only be resolved where it is, at nonce 1, which nothing used then, a gap every later
// transaction of the key would wait behind forever. The adoption waits instead, R's own
// transaction goes out again and uses nonce 1 (it reverts: the authorization is used), and only
// once that is final is R adopted where it is; the next payment settles at nonce 2, and the
// lost payment's payee is paid once.
func TestWatcherAdoptsInPlaceOnlyOnceItsNonceIsUsed(t *testing.T) {
	ctx := context.Background()
	key := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(key.PublicKey)
	opts := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{key}, Deadline: time.Second,
		Config: func(c *settle.Config) { c.BumpAfter = 300 * time.Millisecond }}
	payer := env.FundedPayer(t, 2_000_000)
	lost := env.NewPay(t, payer, 200_000)
	body := lost.Body(t)
	_, tx := env.SettlePendingAndStop(t, body, opts)
	env.LoseSettlements(t, env.Row(t, lost.Key()).ID)

	e := env.NewEngine(t, opts)
	h := env.NewPay(t, payer, 50_000)
	h.ValidBefore = big.NewInt(env.TimeBase(t) + 120)
	e.SettlePending(t, h.Body(t))
	retry := e.SettlePending(t, body)
	if hr, rr := env.Row(t, h.Key()), env.Row(t, lost.Key()); hr.TxNonce != 0 || rr.TxNonce != 1 || rr.Signer != addr {
		t.Fatalf("after the restart: H %+v, the retry %+v; want H at nonce 0, the retry at 1", hr, rr)
	}
	if err := env.Chain.RPC.CallContext(ctx, nil, "anvil_dropTransaction", retry); err != nil {
		t.Fatal(err)
	}
	if !env.InPool(t, tx) || env.InPool(t, retry) {
		t.Fatalf("the pool: lost transaction %v, retry %v; want only the lost one", env.InPool(t, tx), env.InPool(t, retry))
	}
	if err := env.Chain.IncreaseTime(ctx, 600); err != nil { // mines T past H's validBefore
		t.Fatal(err)
	}
	if r := env.Receipt(t, tx); r == nil || r.Status != 1 {
		t.Fatalf("the lost transaction did not mine: %+v", r)
	}

	rr := mineUntilClosed(t, lost.Key(), 30*time.Second)
	if !rr.State.Succeeded() || rr.TxHash != tx || !rr.Adopted || rr.Signer != addr || rr.TxNonce != 1 {
		t.Fatalf("the retry's row %+v, want mined by the lost transaction %s, adopted where it was (nonce 1)", rr, tx)
	}
	if n := nonceOf(t, addr, "latest"); n != 2 {
		t.Fatalf("the key's nonce is %d, want 2: nonce 1 (the retry's own transaction, reverted) used", n)
	}
	if hr := env.Row(t, h.Key()); hr.State != facilitator.StateExpired || hr.TxNonce != 0 {
		t.Fatalf("H %+v, want expired at nonce 0", hr)
	}
	env.SetAutomine(t, true)
	next := env.NewPay(t, payer, 10_000)
	e.MustSucceed(t, next.Body(t))
	if s := env.Row(t, next.Key()); s.TxNonce != 2 {
		t.Fatalf("the next settlement %+v, want at nonce 2", s)
	}
	if got := env.Balance(t, lost.PayTo); got != 200_000 {
		t.Fatalf("the lost payment's payee holds %d, want 200000", got)
	}
}

// mineUntilClosed mines a block every 100 ms until the authorization's row leaves the open
// states (signed, broadcast) or the time is up, and returns the row as it then is.
func mineUntilClosed(t *testing.T, key facilitator.AuthorizationKey, within time.Duration) *facilitator.Settlement {
	t.Helper()
	limit := time.Now().Add(within)
	for {
		row := env.Row(t, key)
		if !row.State.Open() || time.Now().After(limit) {
			return row
		}
		env.Mine(t)
		time.Sleep(100 * time.Millisecond)
	}
}
