package reconcile_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/reconcile"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// jobsOf is jobs with the network's signer keys named (as the facilitator names every key of
// the network), and their adoptions counted.
func jobsOf(t testing.TB, depth uint64, signers []common.Address, obs *adoptions) *reconcile.Jobs {
	t.Helper()
	return reconcile.New(reconcile.Config{
		Store:      env.DB,
		Networks:   []reconcile.Network{{Network: network(facilitator.Finality{Depth: depth}), Chain: env.Chain.RPC, Signers: signers}},
		StaleAfter: time.Minute,
		Now:        later,
		Logger:     stacktest.Logger(t),
		Observer:   obs,
	})
}

// adoptions counts the jobs' adoptions by signer (reconcile.Observer).
type adoptions struct {
	mu sync.Mutex
	by map[string]int
}

func (a *adoptions) Adopted(network, signer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by = map[string]int{}
	}
	a.by[signer]++
}

// TestReconcileAdoptsLostTransactions: the ledger and the index go back in time (a restore): the
// rows of a lone settlement and of a two-member batch, all mined, are lost, and the index rolls
// back to the block of the settlement that survived. Nobody asks for those payments again. Once
// the index is back at the head, one run of the Settlements job sees the key's chain count
// beyond what the ledger accounts for, finds the transactions among the indexed uses, and
// adopts them: three rows, mined by their transactions, the batch's members at their slots. A
// retry of a batch member's payload then gets its success with the batch's hash.
func TestReconcileAdoptsLostTransactions(t *testing.T) {
	ctx := context.Background()
	ix := env.StartIndexer(t)
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	n := env.Network()
	n.Batch = facilitator.BatchPolicy{Max: 2, Wait: 2 * time.Second}
	opts := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Network: &n, Deadline: 10 * time.Second}
	e := env.NewEngine(t, opts)

	kept := env.NewPay(t, env.FundedPayer(t, 1_000_000), 100_000)
	e.MustSucceed(t, kept.Body(t))
	keptBlock := env.Row(t, kept.Key()).BlockNumber
	lone := env.NewPay(t, env.FundedPayer(t, 1_000_000), 200_000)
	e.MustSucceed(t, lone.Body(t))
	batch := []stacktest.Pay{env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000), env.NewPay(t, env.FundedPayer(t, 1_000_000), 400_000)}
	outs := make([]facilitator.SettleOutcome, len(batch))
	var wg sync.WaitGroup
	for i, p := range batch {
		wg.Add(1)
		go func() { defer wg.Done(); outs[i] = e.MustSucceed(t, p.Body(t)) }()
	}
	wg.Wait()
	batchTx := outs[0].Response.Transaction
	if outs[1].Response.Transaction != batchTx {
		t.Fatalf("the two payments went out as %s and %s, want one batch", batchTx, outs[1].Response.Transaction)
	}
	loneTx := env.Row(t, lone.Key()).TxHash
	e.Stop(ctx)
	env.WaitIndexed(t, env.Head(t))
	if err := ix.Stop(); err != nil {
		t.Fatal(err)
	}

	// The restore: the rows after the kept one, and the index above its block.
	var lost []int64
	for _, p := range append([]stacktest.Pay{lone}, batch...) {
		lost = append(lost, env.Row(t, p.Key()).ID)
	}
	env.LoseSettlements(t, lost...)
	env.LoseIndexAbove(t, keptBlock)
	env.StartIndexer(t)
	env.WaitIndexed(t, env.Head(t))

	var obs adoptions
	ch := runSettlements(t, jobsOf(t, 2, []common.Address{addr}, &obs))
	if ch.Adopted != 2 || obs.by[addr.Hex()] != 2 {
		t.Fatalf("adopted %d transactions (observer %v), want 2", ch.Adopted, obs.by)
	}
	if r := env.Row(t, lone.Key()); !r.Adopted || !r.State.Succeeded() || r.TxHash != loneTx || r.Signer != addr || r.Value.Int64() != 200_000 {
		t.Fatalf("the lone settlement's row: %+v", r)
	}
	for i, p := range batch {
		r := env.Row(t, p.Key())
		if !r.Adopted || !r.State.Succeeded() || r.TxHash.Hex() != batchTx || r.PayTo != p.PayTo {
			t.Fatalf("batch member %d's row: %+v", i, r)
		}
	}
	members, err := env.DB.BatchMembers(ctx, n.ID, addr, env.Row(t, batch[0].Key()).TxNonce)
	if err != nil || len(members) != 2 || members[0].BatchSlot != 0 || members[1].BatchSlot != 1 {
		t.Fatalf("the batch's members: %+v %v", members, err)
	}
	// Nothing more to adopt: the next run finds the ledger accounting for every nonce.
	if ch := runSettlements(t, jobsOf(t, 2, []common.Address{addr}, &obs)); ch.Adopted != 0 {
		t.Fatalf("a second run adopted %d", ch.Adopted)
	}

	// The adopted member's payload, sent again, is its own: the success with the batch's hash.
	retry := env.NewEngine(t, opts).MustSettle(t, batch[1].Body(t))
	if !retry.Response.Success || retry.Response.Transaction != batchTx {
		t.Fatalf("retry of a batch member: %+v, want success with %s", retry.Response, batchTx)
	}
	for i, p := range batch {
		if got := env.Balance(t, p.PayTo); got != p.Value {
			t.Fatalf("payee %d holds %d, want %d", i, got, p.Value)
		}
	}
}

// TestReconcileAdoptsLostUnderNewTraffic: the ledger loses a mined settlement's rows (a
// failover), and the recovered service goes on settling new payments on the same key, at higher
// nonces: the ledger's highest tx nonce accounts for the chain's count again, and the lost
// transaction is a hole below it. Nobody asks for the lost payment again; one run of the
// Settlements job finds the hole and adopts the transaction, and the next finds nothing.
func TestReconcileAdoptsLostUnderNewTraffic(t *testing.T) {
	env.StartIndexer(t)
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	opts := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}}
	e := env.NewEngine(t, opts)
	e.MustSucceed(t, env.NewPay(t, env.FundedPayer(t, 1_000_000), 100_000).Body(t))
	lost := env.NewPay(t, env.FundedPayer(t, 1_000_000), 200_000)
	e.MustSucceed(t, lost.Body(t))
	lostRow := env.Row(t, lost.Key())
	e.Stop(context.Background())
	env.LoseSettlements(t, lostRow.ID)

	// The recovered service settles a new payment on the key, after the lost one.
	next := env.NewPay(t, env.FundedPayer(t, 1_000_000), 300_000)
	env.NewEngine(t, opts).MustSucceed(t, next.Body(t))
	if r := env.Row(t, next.Key()); r.TxNonce <= lostRow.TxNonce {
		t.Fatalf("the new payment went out at nonce %d, want above the lost one's %d", r.TxNonce, lostRow.TxNonce)
	}
	env.WaitIndexed(t, env.Head(t))

	var obs adoptions
	j := jobsOf(t, 2, []common.Address{addr}, &obs)
	if ch := runSettlements(t, j); ch.Adopted != 1 || obs.by[addr.Hex()] != 1 {
		t.Fatalf("adopted %d transactions (observer %v), want 1", ch.Adopted, obs.by)
	}
	if r := env.Row(t, lost.Key()); !r.Adopted || !r.State.Succeeded() || r.TxHash != lostRow.TxHash || r.TxNonce != lostRow.TxNonce {
		t.Fatalf("the lost settlement's row: %+v", r)
	}
	if ch := runSettlements(t, j); ch.Adopted != 0 {
		t.Fatalf("a second run adopted %d", ch.Adopted)
	}
}

// TestReconcileRemembersForeignHole: a transaction of our key that carries no authorization of
// ours (sent by hand from the key) is a hole in the ledger's nonces that no adoption fills. The
// first run looks for it among the indexed uses and finds nothing to adopt; the runs after do
// not look again.
func TestReconcileRemembersForeignHole(t *testing.T) {
	ctx := context.Background()
	env.StartIndexer(t)
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	opts := stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}}
	e := env.NewEngine(t, opts)
	e.MustSucceed(t, env.NewPay(t, env.FundedPayer(t, 1_000_000), 100_000).Body(t))
	e.Stop(ctx)

	nonce, err := env.Chain.Client.PendingNonceAt(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	head, err := env.Chain.Client.HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	tip := big.NewInt(1_000_000_000)
	self, err := types.SignNewTx(signer, types.LatestSignerForChainID(new(big.Int).SetUint64(env.Chain.ChainID)), &types.DynamicFeeTx{
		ChainID: new(big.Int).SetUint64(env.Chain.ChainID), Nonce: nonce, To: &addr, Gas: 21_000, GasTipCap: tip,
		GasFeeCap: new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Chain.Client.SendTransaction(ctx, self); err != nil {
		t.Fatal(err)
	}
	env.Mine(t)
	env.NewEngine(t, opts).MustSucceed(t, env.NewPay(t, env.FundedPayer(t, 1_000_000), 200_000).Body(t))
	env.WaitIndexed(t, env.Head(t))

	looks := func(store *countingUses) int32 {
		j := reconcile.New(reconcile.Config{
			Store:      store,
			Networks:   []reconcile.Network{{Network: network(facilitator.Finality{Depth: 2}), Chain: env.Chain.RPC, Signers: []common.Address{addr}}},
			StaleAfter: time.Minute,
			Now:        later,
			Logger:     stacktest.Logger(t),
		})
		for run := range 3 {
			if ch := runSettlements(t, j); ch.Adopted != 0 {
				t.Fatalf("run %d adopted %d", run, ch.Adopted)
			}
		}
		return store.looks.Load()
	}
	if got := looks(&countingUses{Store: env.DB}); got != 1 {
		t.Fatalf("the index's uses were read %d times for the hole, want 1", got)
	}
	// While the index is behind the chain, the hole's transaction may not be indexed yet: it is
	// looked for again.
	if got := looks(&countingUses{Store: env.DB, behind: true}); got != 3 {
		t.Fatalf("with the index behind, the uses were read %d times in 3 runs, want 3", got)
	}
}

// countingUses counts the jobs' reads of the index's uses (the look for lost transactions).
// behind: the index's cursor is answered at block 0.
type countingUses struct {
	reconcile.Store
	behind bool
	looks  atomic.Int32
}

func (c *countingUses) Cursor(ctx context.Context, network string) (facilitator.Block, bool, error) {
	b, ok, err := c.Store.Cursor(ctx, network)
	if c.behind {
		b.Number = 0
	}
	return b, ok, err
}

func (c *countingUses) AuthorizationUsesFrom(ctx context.Context, network string, from uint64, limit int) ([]facilitator.AuthorizationEvent, error) {
	c.looks.Add(1)
	return c.Store.AuthorizationUsesFrom(ctx, network, from, limit)
}

// TestReconcileAdoptsLostVariant: an open row whose variant that mined the ledger lost (a fee
// bump's record) is resolved mined by that variant, adopted, when the index shows the
// authorization used by it: it is the row's key's transaction, not a transaction that is not ours.
func TestReconcileAdoptsLostVariant(t *testing.T) {
	ctx := context.Background()
	env.StartIndexer(t)
	signer := env.NewSigner(t)
	addr := crypto.PubkeyToAddress(signer.PublicKey)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 150_000)
	_, first := env.SettlePendingAndStop(t, p.Body(t), stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{signer}, Deadline: pendingDeadline})

	old := recordedTx(t, first)
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
	for range 4 {
		env.Mine(t)
	}
	env.WaitIndexed(t, env.Head(t))
	if u := env.Use(t, p.Key()); u == nil || u.TxHash != bumped.Hash() {
		t.Fatalf("the index's use: %+v, want %s", u, bumped.Hash())
	}

	ch := runSettlements(t, jobsOf(t, 2, nil, &adoptions{}))
	r := env.Row(t, p.Key())
	if ch.Elsewhere != 0 || !r.State.Succeeded() || r.TxHash != bumped.Hash() || !r.Adopted || r.Signer != addr {
		t.Fatalf("after the job (changes %+v): %+v, want mined by the lost variant %s, adopted", ch, r, bumped.Hash())
	}
}

// TestReconcileAdoptsAnotherKeysTransactionUnindexed: an open row on one key (a retry after a
// ledger loss) whose authorization a lost transaction of another of our keys used, with no
// index to name the use (the job judges from the chain, settle.Judge): the job adopts that
// transaction into the row, which moves to its key and nonce. Judged with only the row's own
// key as ours, the job answered it settled elsewhere, "not ours" (the simulator's seed 1469).
func TestReconcileAdoptsAnotherKeysTransactionUnindexed(t *testing.T) {
	ctx := context.Background()
	keyA, keyB := env.NewSigner(t), env.NewSigner(t)
	addrA, addrB := crypto.PubkeyToAddress(keyA.PublicKey), crypto.PubkeyToAddress(keyB.PublicKey)
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 175_000)
	_, onAHash := env.SettlePendingAndStop(t, p.Body(t), stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{keyA}, Deadline: pendingDeadline})
	env.DropPool(t)

	onA := recordedTx(t, onAHash)
	onB, err := types.SignNewTx(keyB, types.LatestSignerForChainID(onA.ChainId()), &types.DynamicFeeTx{
		ChainID: onA.ChainId(), Nonce: 0, To: onA.To(), Data: onA.Data(), Gas: onA.Gas(), GasTipCap: onA.GasTipCap(), GasFeeCap: onA.GasFeeCap(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Chain.Client.SendTransaction(ctx, onB); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		env.Mine(t)
	}
	if r := env.Receipt(t, onB.Hash()); r == nil || r.Status != 1 {
		t.Fatalf("B's transaction: %+v", r)
	}

	obs := &adoptions{}
	ch := runSettlements(t, jobsOf(t, 2, []common.Address{addrA, addrB}, obs))
	r := env.Row(t, p.Key())
	if ch.Elsewhere != 0 || !r.State.Succeeded() || r.TxHash != onB.Hash() || !r.Adopted || r.Signer != addrB || r.TxNonce != 0 {
		t.Fatalf("after the job (changes %+v): %+v, want mined by B's transaction %s at B's nonce 0, adopted", ch, r, onB.Hash())
	}
	if obs.by[addrB.Hex()] != 1 || ch.Adopted != 1 {
		t.Fatalf("adoptions counted %v (changes %+v), want one for %s", obs.by, ch, addrB)
	}
}

// recordedTx is the transaction the ledger recorded under hash, decoded.
func recordedTx(t *testing.T, hash common.Hash) *types.Transaction {
	t.Helper()
	var raw []byte
	if err := env.Pool.QueryRow(context.Background(), `SELECT raw FROM settlement_txs WHERE tx_hash = $1`, hash[:]).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	tx := new(types.Transaction)
	if err := tx.UnmarshalBinary(raw); err != nil {
		t.Fatal(err)
	}
	return tx
}
