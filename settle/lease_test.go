package settle_test

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// leased makes a rig lease its keys through its own database handle: two rigs are then two
// processes as far as Postgres knows (each its own sessions).
func leased(deadline time.Duration, signers ...*ecdsa.PrivateKey) stacktest.EngineOptions {
	return stacktest.EngineOptions{Signers: signers, Deadline: deadline, Config: func(c *settle.Config) {
		c.Leaser = c.Store.(*postgres.DB)
	}}
}

// holds reports whether r holds k's lease.
func holds(r *stacktest.Engine, k *ecdsa.PrivateKey) bool {
	return slices.Contains(r.Engine.HeldSigners()[env.Network().ID], stacktest.AddressOf(k))
}

// held is how many keys r holds.
func held(r *stacktest.Engine) int { return len(r.Engine.HeldSigners()[env.Network().ID]) }

// waitFor polls cond until it holds, or fails after within; it returns how long it took.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	began := time.Now()
	for !cond() {
		if time.Since(began) > within {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(began)
}

func sqlConn(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// leaseRow is the key's signer_leases row.
func leaseRow(t testing.TB, conn *pgx.Conn, k *ecdsa.PrivateKey) (pid int32, epoch int64) {
	t.Helper()
	if err := conn.QueryRow(context.Background(), `SELECT session_pid, epoch FROM signer_leases WHERE network = $1 AND signer = $2`,
		env.Network().ID, stacktest.AddressOf(k).Bytes()).Scan(&pid, &epoch); err != nil {
		t.Fatal(err)
	}
	return pid, epoch
}

// ledgerNonces are the tx nonces of the signer's ledger rows, in order.
func ledgerNonces(t testing.TB, conn *pgx.Conn, signer common.Address) []uint64 {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT tx_nonce FROM settlements WHERE network = $1 AND signer = $2 ORDER BY tx_nonce`,
		env.Network().ID, signer.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint64, len(ns))
	for i, n := range ns {
		out[i] = uint64(n)
	}
	return out
}

func wantSequence(t testing.TB, got []uint64, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("ledger tx nonces %v, want exactly 0..%d", got, n-1)
	}
	for i, v := range got {
		if v != uint64(i) {
			t.Fatalf("ledger tx nonces %v, want exactly 0..%d (no reuse, no gap)", got, n-1)
		}
	}
}

// TestSignerLeaseOneHolder: two engines on one ledger with the same key: the first to start holds
// it and settles; the other takes no new settlement (503, nothing sent) but answers a repeat of a
// payload the holder settled from the ledger.
func TestSignerLeaseOneHolder(t *testing.T) {
	ctx := context.Background()
	key := env.NewSigner(t)
	a := env.NewEngine(t, leased(10*time.Second, key))
	b := env.NewEngine(t, leased(10*time.Second, key))
	if !holds(a, key) || holds(b, key) {
		t.Fatalf("holders: first engine %v, second %v; want the first alone", a.Engine.HeldSigners(), b.Engine.HeldSigners())
	}

	p := env.NewPay(t, env.FundedPayer(t, 50_000), 50_000)
	body := p.Body(t)
	_, err := b.SettleBody(ctx, t, body)
	if facilitator.ErrorCode(err) != facilitator.EUnavailable || facilitator.ErrorReason(err, "") != facilitator.ReasonSettlerBusy {
		t.Fatalf("the engine without the key: want 503 settlement_capacity_exceeded, got %v", err)
	}
	if _, err := a.DB.SettlementByKey(ctx, p.Key()); err == nil {
		t.Fatal("the engine without the key wrote a ledger row")
	}
	if n := nonceOf(t, stacktest.AddressOf(key), "pending"); n != 0 {
		t.Fatalf("the key sent %d transactions after a refusal", n)
	}

	out, err := a.SettleBody(ctx, t, body)
	if err != nil || !out.Response.Success {
		t.Fatalf("the holder: want success, got %+v %v", out.Response, err)
	}
	again, err := b.SettleBody(ctx, t, body)
	if err != nil || again.Response.Success || again.Response.ErrorReason != facilitator.ReasonAlreadySettled ||
		again.Response.Transaction != out.Response.Transaction {
		t.Fatalf("the other engine, same payload: want already_settled with %s, got %+v %v", out.Response.Transaction, again.Response, err)
	}
	// Still one holder after a few lease rounds.
	time.Sleep(2500 * time.Millisecond)
	if !holds(a, key) || holds(b, key) {
		t.Fatalf("holders after 2.5s: first %v, second %v", a.Engine.HeldSigners(), b.Engine.HeldSigners())
	}
	if n := nonceOf(t, stacktest.AddressOf(key), "latest"); n != 1 {
		t.Fatalf("the key's nonce is %d, want 1", n)
	}
}

// TestSignerLeaseTakeover: the holder of a key with settlements in flight loses its lease (its
// lease session is terminated, as when the process dies or is cut off): it stops using the key at
// once, and the other engine takes the key over within seconds, resumes the open settlements from
// the ledger (rebroadcasting them: the pool lost them), and continues the key's nonces with no
// reuse and no gap. A caller waiting on the first engine gets the outcome from the ledger.
func TestSignerLeaseTakeover(t *testing.T) {
	ctx := context.Background()
	key := env.NewSigner(t)
	addr := stacktest.AddressOf(key)
	const value = 20_000
	pays := make([]stacktest.Pay, 5)
	bodies := make([][]byte, len(pays))
	for i := range pays {
		pays[i] = env.NewPay(t, env.FundedPayer(t, value), value)
		bodies[i] = pays[i].Body(t)
	}
	env.ManualMining(t)
	conn := sqlConn(t)

	a := env.NewEngine(t, leased(20*time.Second, key))
	b := env.NewEngine(t, leased(20*time.Second, key))
	if !holds(a, key) || holds(b, key) {
		t.Fatalf("holders: %v / %v; want the first engine alone", a.Engine.HeldSigners(), b.Engine.HeldSigners())
	}

	// Three settlements in flight on the holder (no mining: they stay pending).
	hashes := make([]string, len(pays))
	for i := range 3 {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		out, err := a.SettleBody(cctx, t, bodies[i])
		cancel()
		if err != nil || out.Response.ErrorReason != facilitator.ReasonSettlementPending || out.Response.Transaction == "" {
			t.Fatalf("payment %d on the holder: want pending with a hash, got %+v %v", i, out.Response, err)
		}
		hashes[i] = out.Response.Transaction
	}
	wantSequence(t, ledgerNonces(t, conn, addr), 3)

	// A caller waits on the holder for payment 0's outcome.
	type answer struct {
		out facilitator.SettleOutcome
		err error
	}
	waiter := make(chan answer, 1)
	go func() {
		out, err := a.SettleBody(ctx, t, bodies[0])
		waiter <- answer{out, err}
	}()
	time.Sleep(200 * time.Millisecond)

	// The holder's lease session ends; the node forgets the pending transactions.
	pid, epoch := leaseRow(t, conn, key)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	lostAt := time.Now()
	if err := env.Chain.RPC.CallContext(ctx, nil, "anvil_dropAllTransactions"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the first engine lets go of the key", func() bool { return !holds(a, key) })
	waitFor(t, 10*time.Second, "the second engine takes the key over", func() bool { return holds(b, key) })
	t.Logf("takeover %s after the lease session ended", time.Since(lostAt).Round(time.Millisecond))
	if _, newEpoch := leaseRow(t, conn, key); newEpoch != epoch+1 {
		t.Fatalf("lease epoch %d after the takeover, want %d", newEpoch, epoch+1)
	}

	// The new holder resent the three from the ledger: the very same signed transactions.
	waitFor(t, 5*time.Second, "the new holder rebroadcasts the open settlements", func() bool {
		for i := range 3 {
			if !env.InPool(t, common.HexToHash(hashes[i])) {
				return false
			}
		}
		return true
	})
	// The old holder takes nothing new.
	if _, err := a.SettleBody(ctx, t, bodies[3]); facilitator.ErrorCode(err) != facilitator.EUnavailable {
		t.Fatalf("the engine that lost the key: want 503, got %v", err)
	}
	// The new holder continues the nonces.
	for i := 3; i < 5; i++ {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		out, err := b.SettleBody(cctx, t, bodies[i])
		cancel()
		if err != nil || out.Response.ErrorReason != facilitator.ReasonSettlementPending {
			t.Fatalf("payment %d on the new holder: want pending, got %+v %v", i, out.Response, err)
		}
		hashes[i] = out.Response.Transaction
	}
	wantSequence(t, ledgerNonces(t, conn, addr), 5)
	if n := poolSize(t); n != 5 {
		t.Fatalf("%d transactions in the pool, want 5", n)
	}
	env.Mine(t)

	// The caller that waited on the old holder gets the success, read from the ledger.
	select {
	case w := <-waiter:
		if w.err != nil || !w.out.Response.Success || w.out.Response.Transaction != hashes[0] {
			t.Fatalf("the caller waiting on the old holder: want success with %s, got %+v %v", hashes[0], w.out.Response, w.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the caller waiting on the old holder got no answer")
	}
	for i := 1; i < 5; i++ {
		waitFor(t, 10*time.Second, "payment settles", func() bool {
			out := b.MustSettle(t, bodies[i])
			if out.Response.Transaction != hashes[i] {
				t.Fatalf("payment %d: transaction %s, want %s", i, out.Response.Transaction, hashes[i])
			}
			return out.Response.Success
		})
	}
	for i, p := range pays {
		if got := env.Balance(t, p.PayTo); got != value {
			t.Fatalf("payee %d holds %d, want %d exactly once", i, got, value)
		}
	}
	if n := nonceOf(t, addr, "latest"); n != 5 {
		t.Fatalf("the key's nonce is %d, want 5: one transaction per settlement", n)
	}
	if n := nonceOf(t, addr, "pending"); n != 5 {
		t.Fatalf("the key's pending nonce is %d, want 5", n)
	}
}

// TestSignerLeaseHandOver: an engine holds both keys of the network; a second engine with the same
// keys starts with none, queues for one, and the first hands one over, so that both settle. One
// payload sent to both at once still settles once.
func TestSignerLeaseHandOver(t *testing.T) {
	ctx := context.Background()
	k1, k2 := env.NewSigner(t), env.NewSigner(t)
	a := env.NewEngine(t, leased(10*time.Second, k1, k2))
	b := env.NewEngine(t, leased(10*time.Second, k1, k2))
	if held(a) != 2 || held(b) != 0 {
		t.Fatalf("at start: first holds %d keys, second %d; want 2 and 0", held(a), held(b))
	}
	took := waitFor(t, 10*time.Second, "each engine holds one key", func() bool { return held(a) == 1 && held(b) == 1 })
	t.Logf("hand-over took %s", took.Round(time.Millisecond))
	time.Sleep(2500 * time.Millisecond)
	if held(a) != 1 || held(b) != 1 {
		t.Fatalf("after the hand-over: %v / %v; want one key each, stable", a.Engine.HeldSigners(), b.Engine.HeldSigners())
	}

	// Payments through both; one payload through both at once.
	p := env.NewPay(t, env.FundedPayer(t, 30_000), 30_000)
	body := p.Body(t)
	var wg sync.WaitGroup
	outs := make([]facilitator.SettleOutcome, 20)
	errs := make([]error, len(outs))
	for i := range outs {
		r := a
		if i%2 == 1 {
			r = b
		}
		wg.Add(1)
		go func() { defer wg.Done(); outs[i], errs[i] = r.SettleBody(ctx, t, body) }()
	}
	wg.Wait()
	success, tx := 0, ""
	for i, out := range outs {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if out.Response.Success {
			success++
		} else if out.Response.ErrorReason != facilitator.ReasonAlreadySettled {
			t.Fatalf("request %d: %+v", i, out.Response)
		}
		if tx == "" {
			tx = out.Response.Transaction
		}
		if out.Response.Transaction != tx {
			t.Fatalf("request %d answers transaction %s, another %s", i, out.Response.Transaction, tx)
		}
	}
	if success != 1 {
		t.Fatalf("%d successes, want 1", success)
	}
	if got := env.Balance(t, p.PayTo); got != 30_000 {
		t.Fatalf("payee holds %d, want 30000 once", got)
	}
	for _, r := range []*stacktest.Engine{a, b} {
		q := env.NewPay(t, env.FundedPayer(t, 1_000), 1_000)
		out, err := r.SettleBody(ctx, t, q.Body(t))
		if err != nil || !out.Response.Success {
			t.Fatalf("a payment through each engine: %+v %v", out.Response, err)
		}
	}
	total := nonceOf(t, stacktest.AddressOf(k1), "latest") + nonceOf(t, stacktest.AddressOf(k2), "latest")
	if total != 3 {
		t.Fatalf("the keys sent %d transactions, want 3", total)
	}
}

// TestSignerLeaseStop: a stopped engine gives its keys back at once, and a waiting engine takes
// them over within a lease round.
func TestSignerLeaseStop(t *testing.T) {
	key := env.NewSigner(t)
	a := env.NewEngine(t, leased(5*time.Second, key))
	b := env.NewEngine(t, leased(5*time.Second, key))
	if !holds(a, key) || holds(b, key) {
		t.Fatal("want the first engine alone to hold the key")
	}
	a.Engine.Stop(context.Background())
	took := waitFor(t, 5*time.Second, "the second engine takes the key", func() bool { return holds(b, key) })
	t.Logf("taken over %s after a clean stop", took.Round(time.Millisecond))
	out, err := b.SettleBody(context.Background(), t, env.NewPay(t, env.FundedPayer(t, 1_000), 1_000).Body(t))
	if err != nil || !out.Response.Success {
		t.Fatalf("settling on the new holder: %+v %v", out.Response, err)
	}
}

// TestSignerLeaseWritesNeedTheLease: a key's settlement rows are committed through its lease's own
// session, so once that session is gone (terminated here, before the lease's check notices) the
// commit fails and nothing is written; no fresh session replaces it; and the lease reports itself
// lost within its check interval.
func TestSignerLeaseWritesNeedTheLease(t *testing.T) {
	ctx := context.Background()
	key := env.NewSigner(t)
	db, err := postgres.Open(ctx, env.DBURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	conn := sqlConn(t)
	l, err := db.LeaseSigner(ctx, env.Network().ID, stacktest.AddressOf(key), 0)
	if err != nil || l == nil {
		t.Fatalf("leasing a free key: %v %v", l, err)
	}
	defer l.Release()
	if other, err := db.LeaseSigner(ctx, env.Network().ID, stacktest.AddressOf(key), 0); err != nil || other != nil {
		t.Fatalf("a second lease of a held key: %v %v; want none", other, err)
	}
	if other, err := db.LeaseSigner(ctx, env.Network().ID, stacktest.AddressOf(key), 300*time.Millisecond); err != nil || other != nil {
		t.Fatalf("queueing for a held key: %v %v; want none after the wait", other, err)
	}

	row := func(nonce uint64) *facilitator.NewSettlement {
		p := env.NewPay(t, env.FundedPayer(t, 1), 1)
		var h common.Hash
		h[0], h[31] = 0xee, byte(nonce)
		return &facilitator.NewSettlement{Key: p.Key(), PayTo: p.PayTo, Value: bigOne(), ValidAfter: bigOne(), ValidBefore: bigOne(),
			X402Version: 2, Request: []byte("{}"), Signer: stacktest.AddressOf(key), TxNonce: nonce,
			Tx: facilitator.TxRecord{Hash: h, Raw: []byte{1}, TipCap: bigOne(), FeeCap: bigOne()}}
	}
	if _, err := l.InsertSettlement(ctx, row(0)); err != nil {
		t.Fatalf("a write through a held lease: %v", err)
	}

	pid, _ := leaseRow(t, conn, key)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the backend exits
	if _, err := l.InsertSettlement(ctx, row(1)); err == nil {
		t.Fatal("a write through a lease whose session ended succeeded")
	}
	if got := ledgerNonces(t, conn, stacktest.AddressOf(key)); len(got) != 1 {
		t.Fatalf("ledger tx nonces %v, want only the one written under the lease", got)
	}
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease does not report itself lost 5s after its session ended")
	}
	if _, err := l.InsertSettlement(ctx, row(2)); err == nil {
		t.Fatal("a write through a lost lease succeeded")
	}
	// The key is free for the next holder, which sees the row written under the first lease.
	next, err := db.LeaseSigner(ctx, env.Network().ID, stacktest.AddressOf(key), 0)
	if err != nil || next == nil {
		t.Fatalf("leasing the key after its holder's session ended: %v %v", next, err)
	}
	next.Release()
}

func bigOne() *big.Int { return big.NewInt(1) }

// raceVerifier runs before once, then answers as the verifier would had the payment's transaction
// been mined between its authorizationState read and its simulation: a reverted simulation.
type raceVerifier struct {
	settle.Verifier
	once   sync.Once
	before func()
}

func (v *raceVerifier) SettleCheck(ctx context.Context, p *facilitator.Payment, signer common.Address) (facilitator.VerifyResponse, uint64, bool, error) {
	raced := false
	v.once.Do(func() { v.before(); raced = true })
	if raced {
		return facilitator.VerifyResponse{IsValid: false, InvalidReason: facilitator.ReasonSimulationFailed,
			InvalidMessage: "execution reverted: FiatTokenV2: authorization is used or canceled"}, 0, false, nil
	}
	return v.Verifier.SettleCheck(ctx, p, signer)
}

// TestSettleDuplicateMinedDuringVerify: a request for a payload another process settles (and
// mines) while this one verifies it: the verdict is a reverted simulation, not "nonce used", and
// the answer must still be the other settlement's (already_settled with its transaction), not a
// failure that would make the merchant think the payment failed.
func TestSettleDuplicateMinedDuringVerify(t *testing.T) {
	ctx := context.Background()
	k1, k2 := env.NewSigner(t), env.NewSigner(t)
	p := env.NewPay(t, env.FundedPayer(t, 40_000), 40_000)
	body := p.Body(t)
	other := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{k1}})
	var first facilitator.SettleOutcome
	r := env.NewEngine(t, stacktest.EngineOptions{Signers: []*ecdsa.PrivateKey{k2}, Config: func(c *settle.Config) {
		c.Verifier = &raceVerifier{Verifier: c.Verifier, before: func() {
			var err error
			if first, err = other.SettleBody(ctx, t, body); err != nil || !first.Response.Success {
				t.Errorf("the other process: want success, got %+v %v", first.Response, err)
			}
		}}
	}})
	out, err := r.SettleBody(ctx, t, body)
	if err != nil || out.Response.Success || out.Response.ErrorReason != facilitator.ReasonAlreadySettled ||
		out.Response.Transaction != first.Response.Transaction {
		t.Fatalf("want already_settled with %s, got %+v %v", first.Response.Transaction, out.Response, err)
	}
	if got := env.Balance(t, p.PayTo); got != 40_000 {
		t.Fatalf("payee holds %d, want 40000 once", got)
	}
}
