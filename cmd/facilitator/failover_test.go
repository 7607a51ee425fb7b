package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The database drills (issue #26): the ledger's Postgres fails over to a streaming standby, or is
// restored from a base backup, while the facilitator settles; the ledger then misses the last
// settlements its keys sent. The service is restarted against the new primary, every caller
// retries, and the chain is the oracle: no authorization moves twice, no caller is told a
// terminal failure for a payment that moved (or success naming another transaction), and every
// signer key's nonces run on without a gap.

var drillFlag = flag.Bool("drill", false, "run TestDatabaseFailoverDrill (or FACILITATOR_DRILL=1): Postgres failover and restore drills, about 150 s")

// The load of one drill: payments from drillPayers payers through drillWorkers concurrent callers,
// half of them with a payment identifier. The fault comes once drillBeforeCut payments have their
// answer; the async drill cuts the standby off there and lets drillAfterCut more settle on the
// primary alone (those are lost), the restore drill takes its backup there and likewise.
const (
	drillPayments  = 70
	drillPayers    = 6
	drillWorkers   = 8
	drillBeforeCut = 20
	drillAfterCut  = 15
	drillKeys      = 2
	// drillFindWithin is how long the payments held back from the retries wait for the service to
	// adopt their lost rows unasked: three reconcile periods (FACILITATOR_RECONCILE_SCHEDULE).
	drillFindWithin = 15 * time.Second
)

// TestDatabaseFailoverDrill runs the drills: async (the standby is cut off mid-load, so the
// commits after that are lost when it is promoted), sync (synchronous_standby_names: nothing
// committed is lost), restore (a base backup taken mid-load) and inplace (async, but the service
// keeps running while the promoted standby takes the primary's address, so no operator step
// runs before it writes). Each prints its figures; duplicates, wrong terminal answers, nonce
// gaps and payments without a true final answer must be 0.
//
//	make drill (CI=true go test ./cmd/facilitator -run '^TestDatabaseFailoverDrill$' -drill -v)
func TestDatabaseFailoverDrill(t *testing.T) {
	if !*drillFlag && os.Getenv("FACILITATOR_DRILL") != "1" {
		t.Skip("the database drills run with -drill or FACILITATOR_DRILL=1 (about 150 s; make drill)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	site := newPgSite(t)
	_, chain := faultStack(ctx, t, "")
	bin := buildFacilitator(ctx, t)
	var reports []drillReport
	for _, kind := range []string{"async", "sync", "restore", "inplace"} {
		t.Run(kind, func(t *testing.T) {
			d := &drill{t: t, kind: kind, site: site, chain: chain, bin: bin}
			reports = append(reports, d.run(ctx))
		})
	}
	t.Logf("database drills:\n%s", drillTable(reports))
}

// advanceSequences moves every id sequence of the ledger a million past its value, as the
// operator does on a recovered database before the service starts on it: the ids the old
// primary gave after the recovery point (settlements, their events: webhook event ids that
// merchants deduplicate on) would otherwise be given again to other payments.
const advanceSequences = `SELECT setval(format('%I.%I', schemaname, sequencename), coalesce(last_value, 0) + 1000000)
	FROM pg_sequences WHERE schemaname = 'public'`

// drill is one run: its clusters, keys, payers and payments.
type drill struct {
	t     *testing.T
	kind  string
	site  *pgSite
	chain *devchain.Chain
	bin   string

	keys     []*ecdsa.PrivateKey
	signers  map[common.Address]bool
	payers   []*devchain.Account
	merchant common.Address
	payments []*drillPayment
	answered atomic.Int64 // payments with a final answer
}

// drillPayment is one authorization and every answer its caller got.
type drillPayment struct {
	key   authKey
	value *big.Int
	body  []byte
	id    string

	mu      sync.Mutex
	answers []drillAnswer
}

// drillAnswer is one /settle answer; phase 0 is before the fault, 1 after the recovery.
type drillAnswer struct {
	phase   int
	status  int // 0: no HTTP answer
	success bool
	replay  bool // a success replayed for the payment identifier
	reason  string
	tx      common.Hash
}

// final reports whether the answer ends the caller's retries: settled, or a failure it is not
// told to retry.
func (a drillAnswer) final() bool {
	switch {
	case a.status != http.StatusOK:
		return a.status >= 400 && a.status < 500
	case a.success || a.reason == facilitator.ReasonAlreadySettled:
		return true
	default:
		return a.reason != facilitator.ReasonSettlementPending && a.reason != facilitator.ReasonPaymentInFlight
	}
}

// settled reports whether the answer says the payment moved, naming tx.
func (a drillAnswer) settled() bool {
	return a.status == http.StatusOK && (a.success || a.reason == facilitator.ReasonAlreadySettled)
}

func (d *drill) run(ctx context.Context) drillReport {
	t := d.t
	began := time.Now()
	d.fund(ctx)

	primary := d.site.initdb(d.kind+"-primary", "x402_drill")
	primary.exec(`CREATE ROLE replicator WITH REPLICATION LOGIN`)
	var standby *privatePostgres
	if d.kind != "restore" {
		standby = d.standby(primary)
		if d.kind == "sync" {
			primary.exec(`ALTER SYSTEM SET synchronous_standby_names = '*'`)
			primary.exec(`SELECT pg_reload_conf()`)
			d.waitReplication(primary, "sync")
		}
	}

	env := serveEnv(t, primary.URL, d.chain, d.chain.RPCURL, d.keys...)
	env["FACILITATOR_NETWORKS"] = editNetworks(t, env["FACILITATOR_NETWORKS"], func(n map[string]any) {
		n["batch"] = map[string]any{"max": 5, "wait": "100ms"}
	})
	env["FACILITATOR_LOG_LEVEL"] = "info"
	env["FACILITATOR_RECONCILE_SCHEDULE"] = "@every 5s"
	env["FACILITATOR_RECONCILE_STALE"] = "10s"
	first := startServe(ctx, t, d.bin, env, d.kind+"-before")

	backup, gave := d.fault(ctx, first, primary, standby)
	if d.kind != "inplace" {
		halt(t, first)
	}
	before := len(d.payments) - d.unsent()
	next := d.recover(primary, standby, backup)
	// What the new primary's ledger holds before the service touches it, and how far the dead
	// service's transactions go: each key's pending nonce (the first service, without a database,
	// commits no row and so sends no new transaction).
	snap := ledgerSnapshot(ctx, t, next.URL)
	snap.sent = d.pendingNonces(ctx)
	// What a process could tell the change by: the timeline (promotion starts a new one; a backup
	// started without archive recovery keeps its own) and the system identifier (kept by both).
	t.Logf("new primary: timeline and system identifier %s (the old primary's: %s)", d.timeline(next), gave.timeline)

	second := first
	if d.kind == "inplace" {
		// The promoted standby takes the old primary's address: the running service's database
		// went back in time under it, at the same URL, and no operator step comes first.
		next.stop("fast")
		next.port, next.URL = primary.port, primary.URL
		next.start()
	} else {
		// The runbook's step (docs/operating.md): ids the lost commits took must not be given again.
		next.execIn("x402_drill", advanceSequences)
		env["DATABASE_URL"] = next.URL
		second = startServe(ctx, t, d.bin, env, d.kind+"-after")
	}

	recovered := time.Now()
	lost, found, wrongStatus := d.retryAll(ctx, second, next.URL, snap)
	retried := time.Since(recovered)
	rep := d.measure(ctx, second, next.URL, snap, gave)
	rep.heldLost, rep.heldFound, rep.statusWrong = lost, found, wrongStatus
	rep.kind, rep.sentBefore, rep.took, rep.retried = d.kind, before, time.Since(began), retried
	second.stop(t)
	t.Logf("%s drill: %s", d.kind, rep)
	if rep.duplicates != 0 || rep.wrong != 0 || rep.gaps != 0 || rep.unanswered != 0 {
		t.Errorf("%s drill: %d duplicates, %d wrong terminal answers, %d nonce gaps, %d payments without a true final answer; want 0 each",
			d.kind, rep.duplicates, rep.wrong, rep.gaps, rep.unanswered)
	}
	// What the ledger lost is recorded again: every row, those nobody retried by the reconcile
	// job alone, and each transaction counted once however many callers retried it at once.
	if rep.marked != rep.lostRows || rep.heldFound != rep.heldLost || rep.statusWrong != 0 || rep.adoptedMetric != rep.lostTxs {
		t.Errorf("%s drill: %d of %d lost rows marked adopted, %d of %d found before any retry (%d with a wrong status), metric %d for %d lost transactions",
			d.kind, rep.marked, rep.lostRows, rep.heldFound, rep.heldLost, rep.statusWrong, rep.adoptedMetric, rep.lostTxs)
	}
	return rep
}

// fault drives the load through svc on primary and strikes mid-load: the async drills cut the
// standby off, the restore drill takes its base backup, and once more payments are answered
// (lost to the standby or the backup) the primary dies. It returns the backup's directory and
// what the old primary's ledger held as late as it answered.
func (d *drill) fault(ctx context.Context, svc *child, primary, standby *privatePostgres) (backup string, gave ledgerRows) {
	stop := make(chan struct{})
	load := d.drive(ctx, svc, 0, d.payments, stop)
	d.waitAnswered(ctx, drillBeforeCut)
	switch d.kind {
	case "async", "inplace":
		d.cutOff(primary, standby)
		d.waitAnswered(ctx, drillBeforeCut+drillAfterCut)
	case "restore":
		backup = d.baseBackup(primary)
		d.waitAnswered(ctx, drillBeforeCut+drillAfterCut)
	}
	gave = ledgerSnapshot(ctx, d.t, primary.URL) // a few commits may follow
	gave.timeline = d.timeline(primary)
	primary.stop("immediate")
	time.Sleep(time.Second) // requests keep coming to a service without its database
	close(stop)
	load.Wait()
	return backup, gave
}

// recover makes the new primary: the standby promoted, or the backup copied into a new data
// directory and started.
func (d *drill) recover(primary, standby *privatePostgres, backup string) *privatePostgres {
	if d.kind != "restore" {
		standby.exec(`SELECT pg_promote(true, 60)`)
		return standby
	}
	next := d.site.cluster(d.kind+"-restored", "x402_drill")
	if out, err := next.asPostgres("cp", "-a", backup, next.dir).CombinedOutput(); err != nil {
		d.t.Fatalf("copying the base backup: %v\n%s", err, out)
	}
	next.start()
	return next
}

// retryAll has every caller send its payment again to svc until it has a final answer. The
// payments of every other lost transaction are held back at first, all of a batch's together
// (a retry of one member adopts the whole transaction): the service must find those on its own
// (from the chain and the index), since a caller may never come back. It returns what waitFound
// counted of those.
func (d *drill) retryAll(ctx context.Context, svc *child, dbURL string, snap ledgerRows) (lost, found, wrongStatus int) {
	d.waitPoolEmpty(ctx) // the dead service's last transactions mine, or the loss is not known yet
	c := d.chainUses(ctx, snap)
	heldTx := map[common.Hash]bool{}
	var lostTxs int
	for _, p := range d.payments {
		if !c.lost(snap, p.key) {
			continue
		}
		tx := c.used[p.key][0]
		if _, seen := heldTx[tx]; !seen {
			heldTx[tx] = lostTxs%2 == 0
			lostTxs++
		}
	}
	var held, rest []*drillPayment
	for _, p := range d.payments {
		if txs := c.used[p.key]; len(txs) == 1 && heldTx[txs[0]] {
			held = append(held, p)
		} else {
			rest = append(rest, p)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d.drive(ctx, svc, 1, rest, nil).Wait()
	lost, found, wrongStatus = d.waitFound(ctx, svc, dbURL, snap, held, drillFindWithin)
	d.drive(ctx, svc, 1, held, nil).Wait()
	return lost, found, wrongStatus
}

// waitPoolEmpty waits (up to 10 s) until no transaction of the drill's keys waits in the pool.
func (d *drill) waitPoolEmpty(ctx context.Context) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		pending := d.pendingNonces(ctx)
		empty := true
		for addr, n := range pending {
			latest, err := d.chain.Client.NonceAt(ctx, addr, nil)
			if err != nil {
				d.t.Fatal(err)
			}
			empty = empty && latest == n
		}
		if empty {
			return
		}
	}
}

// measure is the oracle's figures (check), the ids the recovered sequences gave again, and what
// the service says it adopted (adopted_at, its log, its metric).
func (d *drill) measure(ctx context.Context, svc *child, dbURL string, snap, gave ledgerRows) drillReport {
	rep := d.check(ctx, dbURL, snap)
	end := ledgerSnapshot(ctx, d.t, dbURL)
	rep.reusedIDs, rep.reusedEvents = snap.reused(gave, end)
	rep.marked = end.marked
	rep.adoptedBy = adoptionsLogged(svc.logs.String())
	if f := scrape(d.t, svc.base)["facilitator_adopted_transactions_total"]; f != nil {
		for _, m := range f.GetMetric() {
			rep.adoptedMetric += int(m.GetCounter().GetValue())
		}
	}
	return rep
}

// fund makes the drill's signer keys (with ether), payers (with USDC), merchant and payments.
func (d *drill) fund(ctx context.Context) {
	t := d.t
	d.signers = map[common.Address]bool{}
	for range drillKeys {
		k, err := crypto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		addr := crypto.PubkeyToAddress(k.PublicKey)
		if err := d.chain.SetBalance(ctx, addr, new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))); err != nil {
			t.Fatal(err)
		}
		d.keys, d.signers[addr] = append(d.keys, k), true
	}
	for range drillPayers {
		p := newAccount(t)
		if err := d.chain.USDC.Mint(ctx, p.Address, big.NewInt(1_000_000_000_000)); err != nil {
			t.Fatal(err)
		}
		d.payers = append(d.payers, p)
	}
	d.merchant = newAccount(t).Address
	h := &crashHarness{chain: d.chain, network: facilitator.CAIP2(d.chain.ChainID)}
	for i := range drillPayments {
		var nonce [32]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			t.Fatal(err)
		}
		payer := d.payers[i%len(d.payers)]
		p := &drillPayment{key: authKey{payer.Address, nonce}, value: big.NewInt(1_000 + mrand.Int64N(100_000))}
		p.body = h.payment(t, payer, d.merchant, p.value, nonce)
		if i%2 == 0 {
			p.id = "drill_" + hex.EncodeToString(nonce[:12])
			p.body = withPaymentID(t, p.body, p.id)
		}
		d.payments = append(d.payments, p)
	}
}

// standby makes a streaming replica of primary with pg_basebackup -R and waits until it streams.
func (d *drill) standby(primary *privatePostgres) *privatePostgres {
	s := d.site.cluster(d.kind+"-standby", "x402_drill")
	d.basebackup(primary, s.dir, "-R")
	s.start()
	d.waitReplication(primary, "async")
	return s
}

// basebackup runs pg_basebackup from primary into dir (WAL streamed along, so dir starts alone).
func (d *drill) basebackup(primary *privatePostgres, dir string, args ...string) {
	d.t.Helper()
	args = append([]string{"-h", "127.0.0.1", "-p", fmt.Sprint(primary.port), "-U", "replicator", "-D", dir, "-X", "stream", "-c", "fast", "--no-sync"}, args...)
	if out, err := primary.asPostgres(filepath.Join(primary.bin, "pg_basebackup"), args...).CombinedOutput(); err != nil {
		d.t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
}

// baseBackup takes a base backup of primary now, under load, and returns its directory.
func (d *drill) baseBackup(primary *privatePostgres) string {
	dir := filepath.Join(d.site.root, d.kind+"-backup")
	d.basebackup(primary, dir)
	d.t.Logf("base backup taken with %d payments answered", d.answered.Load())
	return dir
}

// waitReplication waits until primary has a standby streaming with sync_state state.
func (d *drill) waitReplication(primary *privatePostgres, state string) {
	d.t.Helper()
	d.waitSQL(primary, `SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, state)
}

// cutOff stops standby's WAL receiver (its primary_conninfo emptied): from here on the primary's
// commits are not replicated, and a promotion loses them, as an asynchronous standby that fell
// behind does.
func (d *drill) cutOff(primary, standby *privatePostgres) {
	standby.exec(`ALTER SYSTEM SET primary_conninfo = ''`)
	standby.exec(`SELECT pg_reload_conf()`)
	d.waitSQL(primary, `SELECT count(*) = 0 FROM pg_stat_replication WHERE $1 <> ''`, "-")
	d.t.Logf("standby cut off with %d payments answered", d.answered.Load())
}

// timeline is p's current WAL timeline and its system identifier, as the ledger's own role can
// read them.
func (d *drill) timeline(p *privatePostgres) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.url("postgres"))
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tl, id string
	if err := conn.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::text,
		(SELECT system_identifier::text FROM pg_control_system())`).Scan(&tl, &id); err != nil {
		d.t.Fatal(err)
	}
	return tl + "/" + id
}

// waitSQL polls a boolean query on p's postgres database for up to 30 s.
func (d *drill) waitSQL(p *privatePostgres, query string, args ...any) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.url("postgres"))
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var ok bool
		if err := conn.QueryRow(ctx, query, args...).Scan(&ok); err != nil {
			d.t.Fatalf("%s: %v", query, err)
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAnswered waits (up to a minute) until n payments have a final answer.
func (d *drill) waitAnswered(ctx context.Context, n int64) {
	d.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for d.answered.Load() < n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.t.Fatalf("only %d of %d payments answered within a minute", d.answered.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sent reports whether a request was made for p.
func (p *drillPayment) sent() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.answers) > 0
}

// unsent is how many payments no request was made for.
func (d *drill) unsent() int {
	n := 0
	for _, p := range d.payments {
		if !p.sent() {
			n++
		}
	}
	return n
}

// drive has drillWorkers callers take pays in order and send each (same payload) to c until it
// has a final answer in this phase, stop is closed or ctx ends. In phase 0 the callers stop
// taking payments at stop; in phase 1 each is sent again, answered before or not.
func (d *drill) drive(ctx context.Context, c *child, phase int, pays []*drillPayment, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range drillWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if int(i) >= len(pays) {
					return
				}
				p := pays[i]
				for {
					select {
					case <-stop:
						return
					case <-ctx.Done():
						return
					default:
					}
					a := d.send(c, p, phase)
					if a.final() {
						if phase == 0 {
							d.answered.Add(1)
						}
						break
					}
					time.Sleep(time.Duration(100+mrand.IntN(150)) * time.Millisecond)
				}
			}
		}()
	}
	return &wg
}

// send makes one /settle request for p and records its answer.
func (d *drill) send(c *child, p *drillPayment, phase int) drillAnswer {
	a := drillAnswer{phase: phase}
	res, err := c.client.Post(c.base+"/settle", "application/json", strings.NewReader(string(p.body)))
	if err == nil {
		raw, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		var out facilitator.SettleResponse
		if rerr == nil && json.Unmarshal(raw, &out) == nil {
			a.status, a.success, a.reason, a.tx = res.StatusCode, out.Success, out.ErrorReason, common.HexToHash(out.Transaction)
			a.replay = facilitator.IsReplay(out.Extensions)
		} else if rerr == nil {
			a.status, a.reason = res.StatusCode, "unparsed: "+string(raw)
		}
	}
	p.mu.Lock()
	p.answers = append(p.answers, a)
	p.mu.Unlock()
	return a
}

// halt stops a facilitator whose database died under it: SIGTERM, then SIGKILL after 15 s.
func halt(t *testing.T, c *child) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		t.Logf("%s did not stop within 15s of SIGTERM without its database; killed", c.name)
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// ledgerRows is what a ledger holds: its rows by authorization, with every transaction each
// signed.
type ledgerRows struct {
	rows     map[authKey]*auditRow
	byID     map[int64]authKey
	events   map[int64]bool // settlement_events ids
	maxEvent int64
	maxID    int64
	states   map[facilitator.State]int
	// marked is how many rows carry adopted_at (-1: the ledger has no such column): the service's
	// own count of the rows it rebuilt from the chain.
	marked int
	// timeline is the cluster's timeline and system identifier, as read by the drill.
	timeline string
	// sent is each signer key's pending nonce when the ledger was read: the transactions below it
	// were sent by the service before the fault.
	sent map[common.Address]uint64
}

// pendingNonces is each signer key's pending nonce.
func (d *drill) pendingNonces(ctx context.Context) map[common.Address]uint64 {
	out := map[common.Address]uint64{}
	for addr := range d.signers {
		n, err := d.chain.Client.PendingNonceAt(ctx, addr)
		if err != nil {
			d.t.Fatal(err)
		}
		out[addr] = n
	}
	return out
}

func ledgerSnapshot(ctx context.Context, t *testing.T, dbURL string) ledgerRows {
	t.Helper()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	out := ledgerRows{rows: map[authKey]*auditRow{}, byID: map[int64]authKey{}, events: map[int64]bool{}, states: map[facilitator.State]int{}}
	var migrated bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('settlements') IS NOT NULL`).Scan(&migrated); err != nil || !migrated {
		return out
	}
	var network string
	if err := conn.QueryRow(ctx, `SELECT coalesce(min(network), '') FROM settlements`).Scan(&network); err != nil {
		t.Fatal(err)
	}
	out.marked = -1
	var marker bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'settlements' AND column_name = 'adopted_at')`).Scan(&marker); err != nil {
		t.Fatal(err)
	}
	if marker {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM settlements WHERE adopted_at IS NOT NULL`).Scan(&out.marked); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := conn.Query(ctx, `SELECT id FROM settlement_events`)
	if err != nil {
		t.Fatal(err)
	}
	for evs.Next() {
		var id int64
		if err := evs.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out.events[id], out.maxEvent = true, max(out.maxEvent, id)
	}
	if err := evs.Err(); err != nil {
		t.Fatal(err)
	}
	rows := auditRows(ctx, t, conn, network)
	// A batch's transactions are recorded under its first member (slot 0); the others find them
	// by the signer and tx nonce they share.
	type at struct {
		signer common.Address
		nonce  uint64
	}
	shared := map[at][]common.Hash{}
	for _, r := range rows {
		shared[at{r.signer, r.txNonce}] = append(shared[at{r.signer, r.txNonce}], r.txs...)
	}
	for _, r := range rows {
		r.txs = shared[at{r.signer, r.txNonce}]
		out.rows[r.key] = r
		out.byID[r.id] = r.key
		out.maxID = max(out.maxID, r.id)
		out.states[r.state]++
	}
	return out
}

// reused counts the settlement ids that gave (the old primary's ledger) had given to one payment
// and end (the recovered ledger, later) gives to another, and the settlement event ids both
// gave: ids past what the recovered ledger started with (snap) come from its sequences, which
// went back with the database.
func (snap ledgerRows) reused(gave, end ledgerRows) (settlements, events int) {
	for id, k := range end.byID {
		if was, ok := gave.byID[id]; ok && id > snap.maxID && was != k {
			settlements++
		}
	}
	for id := range end.events {
		if gave.events[id] && id > snap.maxEvent {
			events++
		}
	}
	return settlements, events
}

// signs reports whether the row signed tx.
func (r *auditRow) signs(tx common.Hash) bool {
	for _, h := range r.txs {
		if h == tx {
			return true
		}
	}
	return r.txHash == tx
}

// adoptionsLogged counts the service's log lines of adopted authorizations by their "by"
// attribute (which path adopted: a retry, the watcher, the reconcile job).
func adoptionsLogged(logs string) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, "adopted a transaction of our key the ledger lacked") {
			continue
		}
		by := "?"
		if _, rest, ok := strings.Cut(line, " by="); ok {
			by, _, _ = strings.Cut(rest, " ")
		}
		out[by]++
	}
	return out
}

// drillReport is one drill's figures.
type drillReport struct {
	kind                      string
	payments, sentBefore      int
	successes                 int            // payments answered settled (success or already_settled) with the chain's transaction
	moved                     int            // payments whose authorization a transaction of our keys used
	lostRows                  int            // those the ledger had no row with that transaction for when it came back
	adopted                   int            // of those, rows the recovered ledger has with that transaction at the end
	duplicates                int            // authorizations used more than once, or money moved beyond the payments
	wrong                     int            // answers telling a terminal failure for a payment that moved, or success naming another transaction
	gaps                      int            // stuck nonces and rows open at a nonce the chain will not reach
	unanswered                int            // payments whose last answer is not the truth (no final answer, or failure for an unused authorization)
	heldLost, heldFound       int            // lost rows of payments nobody retried yet, and those the service adopted unasked
	statusWrong               int            // of those not adopted, the status API's answers that are not the chain's truth
	adoptedBy                 map[string]int // the service's adoption log lines, by what adopted
	adoptedMetric             int            // facilitator_adopted_transactions_total (absent: 0)
	lostTxs                   int            // distinct transactions of the lost rows
	marked                    int            // rows the service marked adopted (adopted_at; -1: no such column)
	reusedIDs                 int            // settlement ids the old primary gave one payment that the recovered ledger gave another
	reusedEvents              int            // settlement event ids (webhook event ids) both gave
	repeatedSuccess           int            // payments answered success:true more than once, not as a payment identifier's replay (the success claim was lost)
	answers, lostAnswers      int
	took, retried             time.Duration
	wrongSamples, gapsSamples []string
}

func (r drillReport) String() string {
	return fmt.Sprintf("%d payments (%d sent before the fault), %d moved on chain, %d answered settled with the chain's transaction; "+
		"ledger lost %d rows (%d transactions), adopted %d (%d marked adopted_at; %d of %d found before any retry, %d of the others with a wrong status); %d duplicates, %d wrong terminal answers, %d nonce gaps, %d without a true final answer; "+
		"adoptions logged %v, counted in the metric %d; %d payments told success twice, %d settlement ids and %d event ids reused; %d answers (%d without HTTP answer); retries took %s, drill %s",
		r.payments, r.sentBefore, r.moved, r.successes, r.lostRows, r.lostTxs, r.adopted, r.marked, r.heldFound, r.heldLost, r.statusWrong, r.duplicates, r.wrong, r.gaps, r.unanswered,
		r.adoptedBy, r.adoptedMetric, r.repeatedSuccess, r.reusedIDs, r.reusedEvents, r.answers, r.lostAnswers, r.retried.Round(time.Millisecond), r.took.Round(time.Second))
}

func drillTable(reports []drillReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %8s %8s %9s %8s %10s %6s %5s %10s %13s %10s %16s %28s\n", "drill", "payments", "settled", "lost rows", "adopted", "duplicates", "wrong", "gaps", "unanswered", "success twice", "ids reused", "event ids reused", "found unasked (wrong status)")
	for _, r := range reports {
		fmt.Fprintf(&b, "%-8s %8d %8d %9d %8d %10d %6d %5d %10d %13d %10d %16d %28s\n", r.kind, r.payments, r.successes, r.lostRows, r.adopted, r.duplicates, r.wrong, r.gaps, r.unanswered, r.repeatedSuccess, r.reusedIDs, r.reusedEvents, fmt.Sprintf("%d of %d (%d)", r.heldFound, r.heldLost, r.statusWrong))
	}
	return b.String()
}

// chainUses is the chain's word on the drill's authorizations.
type chainUses struct {
	used map[authKey][]common.Hash // the transactions whose AuthorizationUsed each has
	ours map[common.Hash]bool      // those one of our keys signed
	// before: those the service sent before the fault (below the nonce the recovery began at).
	before map[common.Hash]bool
	from   map[common.Hash]common.Address
	nonce  map[common.Hash]uint64
}

// lost reports whether k moved by a transaction the service sent before the fault, which the
// recovered ledger (snap) had no row with.
func (c chainUses) lost(snap ledgerRows, k authKey) bool {
	txs := c.used[k]
	if len(txs) != 1 || !c.before[txs[0]] {
		return false
	}
	r := snap.rows[k]
	return r == nil || !r.signs(txs[0])
}

// chainUses reads the AuthorizationUsed logs of the drill's payers and who sent each transaction.
func (d *drill) chainUses(ctx context.Context, snap ledgerRows) chainUses {
	t := d.t
	payers := make([]common.Hash, len(d.payers))
	for i, p := range d.payers {
		payers[i] = common.BytesToHash(p.Address.Bytes())
	}
	logs, err := d.chain.Client.FilterLogs(ctx, ethereum.FilterQuery{FromBlock: big.NewInt(0), Addresses: []common.Address{d.chain.USDC.Address},
		Topics: [][]common.Hash{{eip3009.AuthorizationUsedTopic}, payers}})
	if err != nil {
		t.Fatal(err)
	}
	c := chainUses{used: map[authKey][]common.Hash{}, ours: map[common.Hash]bool{}, before: map[common.Hash]bool{},
		from: map[common.Hash]common.Address{}, nonce: map[common.Hash]uint64{}}
	for _, l := range logs {
		if !l.Removed {
			k := authKey{common.BytesToAddress(l.Topics[1][:]), l.Topics[2]}
			c.used[k] = append(c.used[k], l.TxHash)
		}
	}
	signer := types.LatestSignerForChainID(new(big.Int).SetUint64(d.chain.ChainID))
	for _, txs := range c.used {
		for _, h := range txs {
			if _, seen := c.ours[h]; seen {
				continue
			}
			tx, _, err := d.chain.Client.TransactionByHash(ctx, h)
			if err != nil {
				t.Fatal(err)
			}
			from, err := types.Sender(signer, tx)
			if err != nil {
				t.Fatal(err)
			}
			c.ours[h], c.before[h] = d.signers[from], d.signers[from] && tx.Nonce() < snap.sent[from]
			c.from[h], c.nonce[h] = from, tx.Nonce()
		}
	}
	return c
}

// waitFound waits (up to within) for the service to adopt, without being asked, the lost rows of
// held (payments whose callers have not retried yet), and returns how many of them were lost and
// how many it found.
// Those it did not find are looked up in the status API, whose answers are logged and counted
// in statusWrong unless they say settled by the facilitator with the chain's transaction.
func (d *drill) waitFound(ctx context.Context, svc *child, dbURL string, snap ledgerRows, held []*drillPayment, within time.Duration) (lost, found, statusWrong int) {
	c := d.chainUses(ctx, snap)
	var missing []*drillPayment
	for deadline := time.Now().Add(within); ; time.Sleep(500 * time.Millisecond) {
		end := ledgerSnapshot(ctx, d.t, dbURL)
		lost, found, missing = 0, 0, nil
		for _, p := range held {
			if !c.lost(snap, p.key) {
				continue
			}
			lost++
			if r := end.rows[p.key]; r != nil && r.state.Succeeded() && r.txHash == c.used[p.key][0] {
				found++
			} else {
				missing = append(missing, p)
			}
		}
		if found == lost || time.Now().After(deadline) {
			break
		}
	}
	api := client.New(svc.base, client.WithRetries(5))
	network := facilitator.CAIP2(d.chain.ChainID)
	for _, p := range missing {
		tx := c.used[p.key][0]
		st, ok, err := api.Authorization(ctx, facilitator.AuthorizationKey{Network: network, Asset: d.chain.USDC.Address, Payer: p.key.payer, Nonce: p.key.nonce})
		right := err == nil && ok && st.State == facilitator.StatusSettled && st.SettledBy == "facilitator" && common.HexToHash(st.Transaction) == tx
		if !right {
			statusWrong++
		}
		d.t.Logf("lost payment %s/%s (tx %s at nonce %d of %s) not adopted unasked within %s; its status reads %s by %q with %s (found %v, %v; the chain's truth: %v)",
			p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], tx.Hex()[:10], c.nonce[tx], c.from[tx].Hex()[:10], within, st.State, st.SettledBy, st.Transaction, ok, err, right)
	}
	return lost, found, statusWrong
}

// check is the oracle: it waits for the service to settle what it took, reads the chain's
// AuthorizationUsed logs of the drill's payers, and holds every answer and the ledger against
// them.
func (d *drill) check(ctx context.Context, dbURL string, snap ledgerRows) drillReport {
	t := d.t
	rep := drillReport{payments: len(d.payments)}
	rep.gaps, rep.gapsSamples = d.waitSettledNonces(ctx, dbURL)

	c := d.chainUses(ctx, snap)
	used, ours := c.used, c.ours
	end := ledgerSnapshot(ctx, t, dbURL)
	moved := new(big.Int)
	lostTxs := map[common.Hash]bool{}
	for _, p := range d.payments {
		txs := used[p.key]
		if len(txs) > 1 {
			rep.duplicates++
		}
		if len(txs) > 0 {
			moved.Add(moved, p.value)
		}
		ourTx := len(txs) == 1 && ours[txs[0]]
		if ourTx {
			rep.moved++
			if c.lost(snap, p.key) {
				rep.lostRows++
				lostTxs[txs[0]] = true
				if r := end.rows[p.key]; r != nil && r.state.Succeeded() && r.txHash == txs[0] {
					rep.adopted++
				}
			}
		}
		p.mu.Lock()
		answers := append([]drillAnswer(nil), p.answers...)
		p.mu.Unlock()
		successes := 0
		for _, a := range answers {
			rep.answers++
			if a.status == 0 {
				rep.lostAnswers++
			}
			if a.status == http.StatusOK && a.success && !a.replay {
				successes++
			}
			var why string
			switch {
			case a.settled() && (len(txs) != 1 || a.tx != txs[0]):
				why = fmt.Sprintf("settled naming %s; the chain has %v", a.tx.Hex()[:10], txs)
			case !a.settled() && a.final() && ourTx:
				why = fmt.Sprintf("a terminal %d %q; the chain has it moved by %s", a.status, a.reason, txs[0].Hex()[:10])
			default:
				continue
			}
			rep.wrong++
			if len(rep.wrongSamples) < 10 {
				rep.wrongSamples = append(rep.wrongSamples, fmt.Sprintf("phase %d, payment %s/%s (id %q): %s", a.phase, p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], p.id, why))
			}
		}
		if successes > 1 {
			rep.repeatedSuccess++
		}
		var last drillAnswer
		if len(answers) > 0 {
			last = answers[len(answers)-1]
		}
		switch {
		case last.settled() && len(txs) == 1 && last.tx == txs[0]:
			rep.successes++
		default:
			rep.unanswered++
			if len(rep.wrongSamples) < 10 {
				rep.wrongSamples = append(rep.wrongSamples, fmt.Sprintf("payment %s/%s (id %q): last answer %+v; the chain has %v", p.key.payer.Hex()[:10], p.key.nonce.Hex()[:10], p.id, last, txs))
			}
		}
	}
	rep.lostTxs = len(lostTxs)
	bal, err := d.chain.USDC.BalanceOf(ctx, d.merchant)
	if err != nil {
		t.Fatal(err)
	}
	if bal.Cmp(moved) != 0 {
		rep.duplicates++
		t.Errorf("the merchant holds %s, the authorizations used add up to %s", bal, moved)
	}
	for _, s := range rep.wrongSamples {
		t.Log(s)
	}
	for _, s := range rep.gapsSamples {
		t.Log(s)
	}
	t.Logf("ledger on the new primary before recovery: %d rows %v (max id %d); after: %d rows %v", len(snap.rows), snap.states, snap.maxID, len(end.rows), end.states)
	return rep
}

// waitSettledNonces waits (up to 90 s) until the ledger holds no open settlement and each signer
// key's pending nonce equals its mined one, then counts what is left: a key whose pending nonce
// is past its mined one has a transaction stuck behind a gap, and a row still open at a nonce the
// chain has not reached waits for a nonce nobody will send.
func (d *drill) waitSettledNonces(ctx context.Context, dbURL string) (gaps int, samples []string) {
	t := d.t
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(90 * time.Second)
	for {
		gaps, samples = 0, nil
		for addr := range d.signers {
			latest, err := d.chain.Client.NonceAt(ctx, addr, nil)
			if err != nil {
				t.Fatal(err)
			}
			pending, err := d.chain.Client.PendingNonceAt(ctx, addr)
			if err != nil {
				t.Fatal(err)
			}
			if pending > latest {
				gaps++
				samples = append(samples, fmt.Sprintf("signer %s: pending nonce %d, mined %d", addr.Hex()[:10], pending, latest))
			}
			rows, err := conn.Query(ctx, `SELECT id, tx_nonce, state FROM settlements WHERE signer = $1 AND state IN ('signed', 'broadcast')`, addr.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id int64
				var nonce uint64
				var state string
				if err := rows.Scan(&id, &nonce, &state); err != nil {
					t.Fatal(err)
				}
				gaps++
				samples = append(samples, fmt.Sprintf("signer %s: settlement %d %s at nonce %d, mined nonce %d", addr.Hex()[:10], id, state, nonce, latest))
			}
			rows.Close()
		}
		if gaps == 0 || time.Now().After(deadline) {
			return gaps, samples
		}
		time.Sleep(250 * time.Millisecond)
	}
}
