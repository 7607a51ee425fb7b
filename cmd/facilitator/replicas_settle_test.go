package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// TestSettleReplicas runs two `facilitator serve` processes on one database and one chain, with the
// same two signer keys (ARCHITECTURE.md invariant 7: a key is leased to one process at a time):
//
//  1. They share the keys out, one each (the second queues, the first hands one over).
//  2. 100 concurrent /settle of one payload, split across both: one transfer, one success, every
//     other answer already_settled with the same transaction.
//  3. 60 distinct payments across both while blocks come every second; the holder of a key is
//     killed (SIGKILL) mid-load: the other takes the key over within seconds, resumes its open
//     settlements from the ledger, and the callers whose request died with it retry the same
//     payload against the survivor. Every payment settles exactly once; each key's on-chain nonce
//     equals its ledger rows, whose tx nonces run 0..n-1 with no reuse and no gap.
func TestSettleReplicas(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	dbURL, chain := freshStack(ctx, t, "settle_replicas", devchain.Options{})
	bin := buildFacilitator(ctx, t)
	network := facilitator.CAIP2(chain.ChainID)

	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	// Two keys of their own, with ETH for gas.
	keys := make([]*ecdsa.PrivateKey, 2)
	signers := make([]common.Address, 2)
	for i := range keys {
		if keys[i], err = crypto.GenerateKey(); err != nil {
			t.Fatal(err)
		}
		signers[i] = crypto.PubkeyToAddress(keys[i].PublicKey)
		if err := chain.SetBalance(ctx, signers[i], new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))); err != nil {
			t.Fatal(err)
		}
	}
	env := serveEnv(t, dbURL, chain, chain.RPCURL, keys...)
	env["FACILITATOR_SETTLE_TIMEOUT"] = "10s"
	env["FACILITATOR_LOG_FORMAT"] = "json"
	env["FACILITATOR_LOG_LEVEL"] = "info"
	h := &crashHarness{bin: bin, chain: chain, db: db, network: network, env: env}
	r := &settleReplicas{t: t, conn: conn, network: network, signers: signers, chain: chain}

	// 1. Two replicas with the same keys: each ends up holding one.
	a := h.start(ctx, t, "replica-a", "")
	b := h.start(ctx, t, "replica-b", "")
	procs := []*child{a, b}
	shared := time.Now()
	for {
		held := r.holders(ctx)
		if len(held) == 2 && held[signers[0]] != held[signers[1]] {
			t.Logf("the keys are shared out after %s: %s holds %s, %s holds %s", time.Since(shared).Round(time.Millisecond),
				r.name(procs, held[signers[0]]), signers[0].Hex()[:10], r.name(procs, held[signers[1]]), signers[1].Hex()[:10])
			break
		}
		if time.Since(shared) > 15*time.Second {
			t.Fatalf("the two replicas do not hold one key each after 15s: holders %v", held)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// 2. One payload, 100 concurrent /settle split across both replicas.
	payer := newAccount(t)
	if err := chain.USDC.Mint(ctx, payer.Address, big.NewInt(1_000_000_000)); err != nil {
		t.Fatal(err)
	}
	nonces := func() map[common.Address]uint64 {
		out := map[common.Address]uint64{}
		for _, s := range signers {
			n, err := chain.Client.NonceAt(ctx, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			out[s] = n
		}
		return out
	}
	before := nonces()
	one := r.pay(t, h, payer)
	type answer struct {
		res      facilitator.SettleResponse
		attempts int
		pending  int
	}
	answers := make([]answer, 100)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := procs[i%2]
			for attempt := 1; ; attempt++ {
				res, status, err := c.settle(one.body)
				switch {
				case err != nil || status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests:
					time.Sleep(200 * time.Millisecond) // Retry-After: 1, shortened
					continue
				case status == http.StatusOK && res.ErrorReason == facilitator.ReasonSettlementPending:
					answers[i].pending++
					time.Sleep(100 * time.Millisecond)
					continue
				case status != http.StatusOK:
					t.Errorf("request %d: %d %+v", i, status, res)
				}
				answers[i].res, answers[i].attempts = res, attempt
				return
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	successes, retried, pendings := 0, 0, 0
	tx := answers[0].res.Transaction
	for i, a := range answers {
		switch {
		case a.res.Success:
			successes++
		case a.res.ErrorReason != facilitator.ReasonAlreadySettled:
			t.Fatalf("request %d: want success or already_settled, got %+v", i, a.res)
		}
		if a.res.Transaction != tx || tx == "" {
			t.Fatalf("request %d answers transaction %q, request 0 %q", i, a.res.Transaction, tx)
		}
		if a.attempts > 1 {
			retried++
		}
		pendings += a.pending
	}
	if successes != 1 {
		t.Fatalf("%d successes among 100 requests of one payload, want exactly 1", successes)
	}
	if got := r.balance(ctx, h, one.payTo); got.Cmp(one.value) != 0 {
		t.Fatalf("payee holds %s, want %s once", got, one.value)
	}
	after := nonces()
	if sent := after[signers[0]] + after[signers[1]] - before[signers[0]] - before[signers[1]]; sent != 1 {
		t.Fatalf("the keys sent %d transactions for one payload, want 1", sent)
	}
	t.Logf("one payload x100 across both replicas: 1 success, 99 already_settled, tx %s; %d requests retried (503 or pending), %d pending answers",
		tx[:10], retried, pendings)

	// 3. 60 distinct payments across both, blocks every second, and the holder of a key killed
	// mid-load.
	if err := chain.RPC.CallContext(ctx, nil, "evm_setIntervalMining", 1); err != nil {
		t.Fatalf("evm_setIntervalMining: %v", err)
	}
	t.Cleanup(func() { _ = chain.RPC.CallContext(context.Background(), nil, "anvil_setAutomine", true) })
	const total = 60
	pays := make([]replicaPayment, total)
	for i := range pays {
		pays[i] = r.pay(t, h, payer)
	}
	held := r.holders(ctx)
	victim, survivor := a, b
	if held[signers[0]] == b.cmd.Process.Pid {
		victim, survivor = b, a
	}
	var victimKey common.Address
	for s, pid := range held {
		if pid == victim.cmd.Process.Pid {
			victimKey = s
		}
	}
	var (
		dead       atomic.Bool
		inFlightAt [2]atomic.Int64 // requests in flight at a, b
		hitKilled  atomic.Int64    // requests that died with the victim
		started    atomic.Int64
	)
	index := func(c *child) int {
		if c == a {
			return 0
		}
		return 1
	}
	type outcome struct {
		res       facilitator.SettleResponse
		attempts  int
		hitKilled bool // a request of the payment died with the victim
		lost      bool // a request of the payment got no answer (the victim's death, a client timeout)
	}
	outcomes := make([]outcome, total)
	sem := make(chan struct{}, 12)
	for i := range pays {
		wg.Add(1)
		sem <- struct{}{}
		started.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c := procs[i%2]
			deadline := time.Now().Add(90 * time.Second)
			for attempt := 1; ; attempt++ {
				if c == victim && dead.Load() {
					c = survivor
				}
				inFlightAt[index(c)].Add(1)
				res, status, err := c.settle(pays[i].body)
				inFlightAt[index(c)].Add(-1)
				if time.Now().After(deadline) {
					t.Errorf("payment %d: no final answer after 90s (last %d %+v %v)", i, status, res, err)
					return
				}
				switch {
				case err != nil && c == victim:
					// The process died under the request: the same payload, to the survivor.
					outcomes[i].hitKilled, outcomes[i].lost = true, true
					hitKilled.Add(1)
					c = survivor
					continue
				case err != nil || status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests:
					outcomes[i].lost = outcomes[i].lost || err != nil
					time.Sleep(200 * time.Millisecond)
					continue
				case status == http.StatusOK && res.ErrorReason == facilitator.ReasonSettlementPending:
					time.Sleep(200 * time.Millisecond)
					continue
				case status == http.StatusOK && (res.Success || res.ErrorReason == facilitator.ReasonAlreadySettled):
					// already_settled: the victim may have claimed the success as it died.
					o := outcomes[i]
					o.res, o.attempts = res, attempt
					outcomes[i] = o
					return
				default:
					t.Errorf("payment %d: %d %+v", i, status, res)
					return
				}
			}
		}()
		if i == total/3 {
			// Mid-load, with requests in flight at the victim: SIGKILL it.
			for inFlightAt[index(victim)].Load() == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			// Away from the block boundary, when answers are written: mostly waiting on receipts.
			time.Sleep(400 * time.Millisecond)
			var open int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE signer = $1 AND state IN ('signed', 'broadcast')`,
				victimKey[:]).Scan(&open); err != nil {
				t.Fatal(err)
			}
			killedAt := time.Now()
			inFlight := inFlightAt[index(victim)].Load()
			dead.Store(true)
			victim.kill(t)
			t.Logf("killed %s (holder of %s) with %d of its requests in flight, %d open settlements of its key in the ledger, %d payments started",
				victim.name, victimKey.Hex()[:10], inFlight, open, started.Load())
			go func() {
				for {
					if at, ok := leaseTakenAt(survivor, victimKey, killedAt); ok {
						t.Logf("takeover: %s took %s over %s after the SIGKILL (lease and recovery %s; seen by the test after %s)", survivor.name,
							victimKey.Hex()[:10], at.Sub(killedAt).Round(time.Millisecond), time.Duration(leaseTook.Load()),
							time.Since(killedAt).Round(time.Millisecond))
						return
					}
					if time.Since(killedAt) > 10*time.Second {
						t.Errorf("%s does not take %s over within 10s of the SIGKILL", survivor.name, victimKey.Hex()[:10])
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if held := r.holders(ctx); len(held) != 2 || held[signers[0]] != survivor.cmd.Process.Pid || held[signers[1]] != survivor.cmd.Process.Pid {
		t.Fatalf("after the kill: holders %v, want both keys with %s (pid %d)", held, survivor.name, survivor.cmd.Process.Pid)
	}
	r.live = []*child{survivor}

	// Every payment settled exactly once.
	if err := chain.RPC.CallContext(ctx, nil, "anvil_setAutomine", true); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	successes, already := 0, 0
	for i, o := range outcomes {
		if o.res.Transaction == "" {
			t.Fatalf("payment %d: no transaction in %+v", i, o.res)
		}
		if j, dup := seen[o.res.Transaction]; dup {
			t.Fatalf("payments %d and %d answered with one transaction %s", j, i, o.res.Transaction)
		}
		seen[o.res.Transaction] = i
		if o.res.Success {
			successes++
		} else {
			already++
			if !o.lost {
				t.Fatalf("payment %d: already_settled although every request of it was answered: %+v", i, o.res)
			}
		}
		if got := r.balance(ctx, h, pays[i].payTo); got.Cmp(pays[i].value) != 0 {
			t.Fatalf("payment %d: payee holds %s, want %s exactly once", i, got, pays[i].value)
		}
		rcpt, err := chain.Client.TransactionReceipt(ctx, common.HexToHash(o.res.Transaction))
		if err != nil || rcpt.Status != 1 {
			t.Fatalf("payment %d: receipt of %s: %v %+v", i, o.res.Transaction, err, rcpt)
		}
	}
	t.Logf("%d payments: %d success, %d already_settled (success claimed by a request whose answer was lost); %d requests died with the killed process and were retried on %s",
		total, successes, already, hitKilled.Load(), survivor.name)
	if hitKilled.Load() == 0 {
		t.Fatal("no request died with the killed process: the kill did not happen mid-load")
	}

	r.checkLedger(ctx, total+1)

	// 4. A frozen holder (SIGSTOP) loses its key when its lease session times out; thawed, it has
	// stopped using the key, and it settles again once it holds one.
	r.frozenHolder(ctx, h, survivor, payer)

	// A clean stop gives the keys back.
	for _, c := range r.live {
		c.stop(t)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if held := r.holders(ctx); len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys still held after the last replica stopped: %v", r.holders(ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var released int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM signer_leases WHERE released_at IS NOT NULL`).Scan(&released); err != nil {
		t.Fatal(err)
	}
	if released != 2 {
		t.Fatalf("%d signer_leases rows marked released after SIGTERM, want 2", released)
	}
	var epochs int64
	if err := conn.QueryRow(ctx, `SELECT sum(epoch) FROM signer_leases`).Scan(&epochs); err != nil {
		t.Fatal(err)
	}
	t.Logf("the two keys changed holder %d times in all", epochs-2)
	t.Logf("replica settlement test took %s", time.Since(began).Round(time.Millisecond))
}

type settleReplicas struct {
	t       *testing.T
	conn    *pgx.Conn
	network string
	signers []common.Address
	chain   *devchain.Chain
	live    []*child // running at the end, to stop cleanly
	rows    int      // payments settled so far: one ledger row each
}

type replicaPayment struct {
	body  []byte
	payTo common.Address
	value *big.Int
}

// pay is a fresh payment from payer to a fresh payee.
func (r *settleReplicas) pay(t *testing.T, h *crashHarness, payer *devchain.Account) replicaPayment {
	var nonce [32]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		t.Fatal(err)
	}
	v, err := rand.Int(rand.Reader, big.NewInt(100_000))
	if err != nil {
		t.Fatal(err)
	}
	value := v.Add(v, big.NewInt(1_000))
	payTo := newAccount(t).Address
	return replicaPayment{body: h.payment(t, payer, payTo, value, nonce), payTo: payTo, value: value}
}

func (r *settleReplicas) balance(ctx context.Context, h *crashHarness, a common.Address) *big.Int {
	return h.balance(ctx, r.t, a)
}

// holders maps each key whose lease is held now (its lease session alive) to the OS pid of the
// facilitator holding it, read from signer_leases.
func (r *settleReplicas) holders(ctx context.Context) map[common.Address]int {
	rows, err := r.conn.Query(ctx, `SELECT l.signer, l.holder FROM signer_leases l
		JOIN pg_stat_activity a ON a.pid = l.session_pid
		WHERE l.network = $1 AND l.released_at IS NULL`, r.network)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[common.Address]int{}
	for rows.Next() {
		var signer []byte
		var holder string
		if err := rows.Scan(&signer, &holder); err != nil {
			r.t.Fatal(err)
		}
		_, pid, _ := strings.Cut(holder, " pid ")
		n, err := strconv.Atoi(pid)
		if err != nil {
			r.t.Fatalf("signer_leases.holder %q names no pid", holder)
		}
		out[common.BytesToAddress(signer)] = n
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

func (r *settleReplicas) name(procs []*child, pid int) string {
	for _, c := range procs {
		if c.cmd.Process.Pid == pid {
			return c.name
		}
	}
	return fmt.Sprintf("pid %d", pid)
}

// ledgerNonces are the signer's ledger tx nonces, in order.
func (r *settleReplicas) ledgerNonces(ctx context.Context, signer common.Address) []uint64 {
	rows, err := r.conn.Query(ctx, `SELECT tx_nonce FROM settlements WHERE network = $1 AND signer = $2 ORDER BY tx_nonce`, r.network, signer[:])
	if err != nil {
		r.t.Fatal(err)
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([]uint64, len(ns))
	for i, n := range ns {
		out[i] = uint64(n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// leaseTook is the last "took" (lease and recovery) leaseTakenAt read.
var leaseTook atomic.Int64

// leaseTakenAt is when c logged taking signer's lease after since.
func leaseTakenAt(c *child, signer common.Address, since time.Time) (time.Time, bool) {
	sc := bufio.NewScanner(strings.NewReader(c.logs.String()))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var l struct {
			Time   time.Time     `json:"time"`
			Msg    string        `json:"msg"`
			Signer string        `json:"signer"`
			Took   time.Duration `json:"took"` // slog's JSON writes a duration in nanoseconds
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "signer lease taken" &&
			strings.EqualFold(l.Signer, signer.Hex()) && l.Time.After(since) {
			leaseTook.Store(int64(l.Took)) // the lease and the key's recovery, of the takeover
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// checkLedger checks, once every ledger row is mined or final, that the ledger has rows ledger
// rows and that each key's on-chain nonce equals its ledger rows, whose tx nonces run 0..n-1: no
// nonce used twice, none skipped. (UNIQUE (network, signer, tx_nonce) guarantees the first; it is
// checked anyway.)
func (r *settleReplicas) checkLedger(ctx context.Context, rows int) {
	t := r.t
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var unsettled int
		if err := r.conn.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE state NOT IN ('mined', 'final') OR error_reason IS NOT NULL`).Scan(&unsettled); err != nil {
			t.Fatal(err)
		}
		if unsettled == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ledger rows not mined or final after 20s", unsettled)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var got, dupNonces int
	if err := r.conn.QueryRow(ctx, `SELECT count(*) FROM settlements`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != rows {
		t.Fatalf("%d ledger rows, want %d (one per payment)", got, rows)
	}
	if err := r.conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM settlements GROUP BY network, signer, tx_nonce HAVING count(*) > 1) d`).Scan(&dupNonces); err != nil {
		t.Fatal(err)
	}
	if dupNonces != 0 {
		t.Fatalf("%d (signer, tx_nonce) pairs have more than one ledger row", dupNonces)
	}
	var summary []string
	for _, s := range r.signers {
		latest, err := r.chain.Client.NonceAt(ctx, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		pending, err := r.chain.Client.PendingNonceAt(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		nonces := r.ledgerNonces(ctx, s)
		if pending != latest || uint64(len(nonces)) != latest {
			t.Fatalf("signer %s: on-chain nonce %d (pending %d), %d ledger rows; want equal", s.Hex()[:10], latest, pending, len(nonces))
		}
		for i, n := range nonces {
			if n != uint64(i) {
				t.Fatalf("signer %s: ledger tx nonces %v, want 0..%d (no reuse, no gap)", s.Hex()[:10], nonces, len(nonces)-1)
			}
		}
		summary = append(summary, fmt.Sprintf("%s: %d txs, nonces 0..%d", s.Hex()[:10], latest, latest-1))
	}
	t.Logf("ledger: %d rows, no (signer, tx_nonce) twice; %s", got, strings.Join(summary, "; "))
	r.rows = rows
}

// settleAll settles each payment through c (retrying 503s and pending answers) and checks one
// success each and the payee's balance.
func (r *settleReplicas) settleAll(ctx context.Context, h *crashHarness, c *child, pays []replicaPayment) {
	t := r.t
	t.Helper()
	var wg sync.WaitGroup
	for i, p := range pays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(30 * time.Second)
			for {
				res, status, err := c.settle(p.body)
				if err == nil && status == http.StatusOK && res.Success {
					return
				}
				retry := err != nil || status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests ||
					(status == http.StatusOK && res.ErrorReason == facilitator.ReasonSettlementPending)
				if !retry || time.Now().After(deadline) {
					t.Errorf("payment %d through %s: %d %+v %v", i, c.name, status, res, err)
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i, p := range pays {
		if got := r.balance(ctx, h, p.payTo); got.Cmp(p.value) != 0 {
			t.Fatalf("payment %d through %s: payee holds %s, want %s once", i, c.name, got, p.value)
		}
	}
}

func (r *settleReplicas) payments(h *crashHarness, payer *devchain.Account, n int) []replicaPayment {
	out := make([]replicaPayment, n)
	for i := range out {
		out[i] = r.pay(r.t, h, payer)
	}
	return out
}

// frozenHolder: a third replica gets a key from holder (which holds both), settles with it, and is
// frozen with SIGSTOP: Postgres ends its idle lease session and holder takes the key back; thawed,
// the replica finds its lease lost, and settles again only once it holds a key again.
func (r *settleReplicas) frozenHolder(ctx context.Context, h *crashHarness, holder *child, payer *devchain.Account) {
	t := r.t
	c := h.start(ctx, t, "replica-c", "")
	r.live = append(r.live, c)
	began := time.Now()
	for {
		held := r.holders(ctx)
		if len(held) == 2 && held[r.signers[0]] != held[r.signers[1]] {
			break
		}
		if time.Since(began) > 15*time.Second {
			t.Fatalf("replica-c and %s do not hold one key each after 15s: %v", holder.name, held)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var frozenKey common.Address
	for s, pid := range r.holders(ctx) {
		if pid == c.cmd.Process.Pid {
			frozenKey = s
		}
	}
	t.Logf("replica-c holds %s after %s", frozenKey.Hex()[:10], time.Since(began).Round(time.Millisecond))
	r.settleAll(ctx, h, c, r.payments(h, payer, 5))
	r.settleAll(ctx, h, holder, r.payments(h, payer, 5))

	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	t.Cleanup(func() { _ = c.cmd.Process.Signal(syscall.SIGCONT) })
	for {
		if leaseTakenAtOK(holder, frozenKey, frozenAt) {
			break
		}
		if time.Since(frozenAt) > 20*time.Second {
			t.Fatalf("%s does not take %s back within 20s of replica-c freezing", holder.name, frozenKey.Hex()[:10])
		}
		time.Sleep(20 * time.Millisecond)
	}
	at, _ := leaseTakenAt(holder, frozenKey, frozenAt)
	t.Logf("frozen holder: %s took %s over %s after replica-c froze (its lease session timed out)", holder.name,
		frozenKey.Hex()[:10], at.Sub(frozenAt).Round(time.Millisecond))
	r.settleAll(ctx, h, holder, r.payments(h, payer, 5))

	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawedAt := time.Now()
	for !strings.Contains(c.logs.String(), `"msg":"signer lease lost`) {
		if time.Since(thawedAt) > 10*time.Second {
			t.Fatal("replica-c does not log its lease lost within 10s of thawing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("replica-c noticed its lease lost %s after thawing", time.Since(thawedAt).Round(time.Millisecond))
	// It queues again, is handed a key, and settles.
	r.settleAll(ctx, h, c, r.payments(h, payer, 5))
	r.checkLedger(ctx, r.rows+20)
}

func leaseTakenAtOK(c *child, signer common.Address, since time.Time) bool {
	_, ok := leaseTakenAt(c, signer, since)
	return ok
}
