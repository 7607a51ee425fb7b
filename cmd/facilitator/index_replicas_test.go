package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

const replicaLeadingMsg = "leading this network's indexer"

// TestIndexerReplicasFailover runs two `facilitator index` processes on one database and one chain:
// exactly one of them takes the network's lease and writes the index, the other waits. SIGKILL the
// leader and the other takes over within seconds, indexing on from the cursor with no gap and no
// duplicate; SIGTERM then stops it cleanly and releases the lease.
//
// Who writes is read from Postgres itself: test-only statement triggers on the index tables record
// the application_name (PGAPPNAME, one per process) of every write, and pg_locks names the
// session holding the advisory lock.
func TestIndexerReplicasFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dbURL, chain := replicaStack(ctx, t)
	bin := buildFacilitator(ctx, t)
	network := facilitator.CAIP2(chain.ChainID)

	// Migrate first, then watch the index tables: the replicas find nothing left to apply.
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Migrate(ctx)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, replicaAuditSQL); err != nil {
		t.Fatalf("installing the write audit triggers: %v", err)
	}

	networks, err := json.Marshal([]map[string]any{{
		"id": network, "rpc": chain.RPCURL, "finality": 1,
		"tokens": []map[string]string{{"address": chain.USDC.Address.Hex(), "name": chain.USDC.Name, "version": chain.USDC.Version}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"DATABASE_URL":              dbURL,
		"FACILITATOR_NETWORKS":      string(networks),
		"FACILITATOR_POLL_INTERVAL": "50ms",
		"FACILITATOR_LOG_FORMAT":    "json",
		"FACILITATOR_LOG_LEVEL":     "info",
	}
	h := &replicaHarness{conn: conn, chain: chain, network: network}

	// 1. Two replicas start together: exactly one leads.
	a := startReplica(t, bin, env, "replica-a")
	b := startReplica(t, bin, env, "replica-b")
	began := time.Now()
	var leader, follower *indexReplica
	for leader == nil {
		aLed, bLed := a.ledCount() > 0, b.ledCount() > 0
		switch {
		case aLed && bLed:
			t.Fatal("both replicas log that they lead the network's indexer")
		case aLed:
			leader, follower = a, b
		case bLed:
			leader, follower = b, a
		}
		a.mustRun(t)
		b.mustRun(t)
		if leader == nil {
			if time.Since(began) > 10*time.Second {
				t.Fatalf("no replica logs %q within 10s", replicaLeadingMsg)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("%s leads after %s; %s waits", leader.name, time.Since(began).Round(time.Millisecond), follower.name)
	// The other keeps waiting: watch it a while.
	for watch := time.Now(); time.Since(watch) < 2*time.Second; time.Sleep(50 * time.Millisecond) {
		if follower.ledCount() > 0 {
			t.Fatalf("%s also logs %q while %s leads", follower.name, replicaLeadingMsg, leader.name)
		}
		leader.mustRun(t)
		follower.mustRun(t)
	}

	// Payments while the first leader leads: mints and EIP-3009 transfers, all indexed.
	for range 3 {
		h.mint(ctx, t)
	}
	for range 2 {
		h.transferWithAuthorization(ctx, t)
	}
	first := h.waitIndexed(ctx, t, 20*time.Second)
	t.Logf("first leader indexed to block %d: %d transfers, %d authorization events", first.head, first.transfers, first.auths)

	// Exactly one writer and one lock holder: the leader. The follower never wrote.
	writes := h.writesByApp(ctx, t)
	if writes[leader.name] == 0 || writes[follower.name] != 0 || len(writes) != 1 {
		t.Fatalf("writes to the index tables by application: %v; want only %s's", writes, leader.name)
	}
	h.wantLockHolder(ctx, t, leader.name)
	if lines := follower.indexerLines(); len(lines) != 0 {
		t.Fatalf("%s logged indexer activity while %s led: %v", follower.name, leader.name, lines)
	}

	// 2. SIGKILL the leader while payments keep coming, so the new leader has blocks to catch up on.
	minted := make(chan error, 1)
	stopMinting := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopMinting:
				minted <- nil
				return
			default:
			}
			var to common.Address
			_, _ = rand.Read(to[:])
			if err := chain.USDC.Mint(ctx, to, big.NewInt(1_000)); err != nil {
				minted <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() {
		select {
		case <-stopMinting:
		default:
			close(stopMinting)
			<-minted
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if n := h.writesByApp(ctx, t)[follower.name]; n != 0 {
		t.Fatalf("%s wrote %d time(s) before the leader died", follower.name, n)
	}
	killedAt := time.Now()
	leader.kill(t)
	var ledAt time.Time
	for {
		follower.mustRun(t)
		if at, ok := follower.ledAt(); ok {
			ledAt = at
			break
		}
		if time.Since(killedAt) > 10*time.Second {
			t.Fatalf("%s does not take over within 10s of the leader's SIGKILL", follower.name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen := time.Since(killedAt)
	takeover := ledAt.Sub(killedAt)
	t.Logf("takeover: %s logged %q %s after the SIGKILL (seen by the test after %s)",
		follower.name, replicaLeadingMsg, takeover.Round(time.Millisecond), seen.Round(time.Millisecond))
	if takeover > 10*time.Second {
		t.Fatalf("takeover took %s, want at most 10s", takeover)
	}

	// More payments after the takeover, then everything on chain must be in the index exactly once.
	time.Sleep(time.Second)
	close(stopMinting)
	if err := <-minted; err != nil {
		t.Fatalf("minting across the failover: %v", err)
	}
	for range 2 {
		h.transferWithAuthorization(ctx, t)
	}
	second := h.waitIndexed(ctx, t, 20*time.Second)
	if second.head <= first.head || second.transfers <= first.transfers {
		t.Fatalf("nothing happened across the failover: head %d -> %d, transfers %d -> %d", first.head, second.head, first.transfers, second.transfers)
	}
	t.Logf("new leader indexed to block %d: %d transfers (%d new), %d authorization events",
		second.head, second.transfers, second.transfers-first.transfers, second.auths)
	writes = h.writesByApp(ctx, t)
	if writes[follower.name] == 0 || len(writes) != 2 {
		t.Fatalf("writes to the index tables by application after the failover: %v; want %s's and %s's", writes, leader.name, follower.name)
	}
	h.wantLockHolder(ctx, t, follower.name)
	if n := follower.ledCount(); n != 1 {
		t.Fatalf("%s logged %q %d times, want once", follower.name, replicaLeadingMsg, n)
	}
	for _, l := range follower.indexerLines() {
		if l.Level != "INFO" {
			t.Fatalf("%s logged %s %q while indexing", follower.name, l.Level, l.Msg)
		}
	}

	// 3. SIGTERM: a clean exit that gives the lease back.
	if err := follower.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	follower.waitExit(t, 10*time.Second)
	if code := follower.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM (%v), want 0", follower.name, code, follower.cmd.ProcessState)
	}
	t.Logf("%s exited 0 %s after SIGTERM", follower.name, time.Since(stopped).Round(time.Millisecond))
	deadline := time.Now().Add(5 * time.Second)
	for {
		holders := h.lockHolders(ctx, t)
		if len(holders) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("advisory locks still held after both replicas are gone: %v", holders)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// replicaAuditSQL records, for every statement writing an index table, which application wrote.
const replicaAuditSQL = `
CREATE TABLE replica_writes (
    id  bigserial PRIMARY KEY,
    app text NOT NULL,
    tbl text NOT NULL,
    op  text NOT NULL,
    at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION replica_write_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replica_writes (app, tbl, op) VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP);
    RETURN NULL;
END $$;
CREATE TRIGGER replica_write_audit AFTER INSERT OR UPDATE OR DELETE ON index_cursors
    FOR EACH STATEMENT EXECUTE FUNCTION replica_write_audit();
CREATE TRIGGER replica_write_audit AFTER INSERT OR UPDATE OR DELETE ON index_blocks
    FOR EACH STATEMENT EXECUTE FUNCTION replica_write_audit();
CREATE TRIGGER replica_write_audit AFTER INSERT OR UPDATE OR DELETE ON transfers
    FOR EACH STATEMENT EXECUTE FUNCTION replica_write_audit();
CREATE TRIGGER replica_write_audit AFTER INSERT OR UPDATE OR DELETE ON authorization_events
    FOR EACH STATEMENT EXECUTE FUNCTION replica_write_audit();
`

// replicaStack returns a fresh database and chain (see freshStack).
func replicaStack(ctx context.Context, t *testing.T) (string, *devchain.Chain) {
	t.Helper()
	return freshStack(ctx, t, "replicas", devchain.Options{})
}

type replicaHarness struct {
	conn    *pgx.Conn
	chain   *devchain.Chain
	network string
}

// mint mints to a fresh address: one Transfer from the zero address.
func (h *replicaHarness) mint(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := h.chain.USDC.Mint(ctx, newAccount(t).Address, big.NewInt(1_000_000)); err != nil {
		t.Fatal(err)
	}
}

// transferWithAuthorization moves USDC from a dev account by EIP-3009, submitted by another: one
// Transfer and one AuthorizationUsed.
func (h *replicaHarness) transferWithAuthorization(ctx context.Context, t *testing.T) {
	t.Helper()
	payer, sender := h.chain.Accounts[1], h.chain.Accounts[0]
	a := devchain.TransferAuthorization{From: payer.Address, To: newAccount(t).Address, Value: big.NewInt(12_345),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 600)}
	if _, err := rand.Read(a.Nonce[:]); err != nil {
		t.Fatal(err)
	}
	sig, err := h.chain.USDC.SignTransferAuthorization(payer.Key, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.chain.USDC.TransferWithAuthorization(ctx, sender, a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig); err != nil {
		t.Fatal(err)
	}
}

type replicaIndexState struct {
	head             uint64
	transfers, auths int
}

// waitIndexed waits until the cursor is at the chain's head and the indexed transfers and
// authorization events are exactly the chain's logs over [0, head]: none missing, none extra.
func (h *replicaHarness) waitIndexed(ctx context.Context, t *testing.T, within time.Duration) replicaIndexState {
	t.Helper()
	head, err := h.chain.Client.BlockNumber(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(within)
	var cursor int64
	for {
		err := h.conn.QueryRow(ctx, `SELECT number FROM index_cursors WHERE network = $1`, h.network).Scan(&cursor)
		if err == nil && uint64(cursor) == head {
			break
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if uint64(cursor) > head {
			t.Fatalf("the cursor (%d) is past the head read before (%d): blocks were mined after it", cursor, head)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index cursor is at %d (err %v), not the head %d, %s later", cursor, err, head, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var hash []byte
	if err := h.conn.QueryRow(ctx, `SELECT hash FROM index_cursors WHERE network = $1`, h.network).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	block, err := h.chain.Client.HeaderByNumber(ctx, new(big.Int).SetUint64(head))
	if err != nil {
		t.Fatal(err)
	}
	if common.BytesToHash(hash) != block.Hash() {
		t.Fatalf("the cursor's hash %x is not block %d's %s", hash, head, block.Hash())
	}
	transfers := h.compare(ctx, t, head, eip3009.TransferTopic, "transfers")
	auths := h.compare(ctx, t, head, eip3009.AuthorizationUsedTopic, "authorization_events")
	return replicaIndexState{head: head, transfers: transfers, auths: auths}
}

// compare checks that table holds exactly the USDC logs with topic over [0, head], by (tx, index).
func (h *replicaHarness) compare(ctx context.Context, t *testing.T, head uint64, topic common.Hash, table string) int {
	t.Helper()
	logs, err := h.chain.Client.FilterLogs(ctx, ethereum.FilterQuery{FromBlock: big.NewInt(0), ToBlock: new(big.Int).SetUint64(head),
		Addresses: []common.Address{h.chain.USDC.Address}, Topics: [][]common.Hash{{topic}}})
	if err != nil {
		t.Fatal(err)
	}
	var onChain []string
	for _, l := range logs {
		onChain = append(onChain, fmt.Sprintf("%d/%s/%d", l.BlockNumber, l.TxHash.Hex(), l.Index))
	}
	rows, err := h.conn.Query(ctx, `SELECT block_number, tx_hash, log_index FROM `+table+` WHERE network = $1`, h.network)
	if err != nil {
		t.Fatal(err)
	}
	indexed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var n int64
		var tx []byte
		var i int32
		err := r.Scan(&n, &tx, &i)
		return fmt.Sprintf("%d/%s/%d", n, common.BytesToHash(tx).Hex(), i), err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(onChain)
	sort.Strings(indexed)
	if strings.Join(onChain, ",") != strings.Join(indexed, ",") {
		t.Fatalf("%s: %d rows indexed, %d logs on chain over [0, %d]\nindexed:  %v\non chain: %v",
			table, len(indexed), len(onChain), head, indexed, onChain)
	}
	if len(onChain) == 0 {
		t.Fatalf("%s: no logs on chain over [0, %d]: the test generated nothing", table, head)
	}
	return len(onChain)
}

// writesByApp counts the audited writes to the index tables by application_name.
func (h *replicaHarness) writesByApp(ctx context.Context, t *testing.T) map[string]int {
	t.Helper()
	rows, err := h.conn.Query(ctx, `SELECT app, count(*) FROM replica_writes GROUP BY app`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var app string
		var n int
		if err := rows.Scan(&app, &n); err != nil {
			t.Fatal(err)
		}
		out[app] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// lockHolders lists the application of each granted advisory lock in this database.
func (h *replicaHarness) lockHolders(ctx context.Context, t *testing.T) []string {
	t.Helper()
	rows, err := h.conn.Query(ctx, `SELECT coalesce(a.application_name, '?') FROM pg_locks l
		LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		t.Fatal(err)
	}
	apps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

// wantLockHolder checks that exactly one advisory lock is held in this database, by app.
func (h *replicaHarness) wantLockHolder(ctx context.Context, t *testing.T, app string) {
	t.Helper()
	if holders := h.lockHolders(ctx, t); len(holders) != 1 || holders[0] != app {
		t.Fatalf("advisory locks held in the database, by application: %v; want exactly one, %s's", holders, app)
	}
}

// indexReplica is one `facilitator index` process.
type indexReplica struct{ *child }

// startReplica runs `facilitator index` with env (and PGAPPNAME=name) and nothing else of the
// test's FACILITATOR_*, DATABASE_URL or PGAPPNAME settings.
func startReplica(t *testing.T, bin string, env map[string]string, name string) *indexReplica {
	t.Helper()
	env = maps.Clone(env)
	env["PGAPPNAME"] = name // also its Postgres application_name
	return &indexReplica{startProcess(t, bin, env, name, []string{"PGAPPNAME="}, "index")}
}

// mustRun fails the test if the replica has exited.
func (r *indexReplica) mustRun(t *testing.T) {
	t.Helper()
	select {
	case <-r.exited:
		t.Fatalf("%s exited: %v", r.name, r.cmd.ProcessState)
	default:
	}
}

type replicaLogLine struct {
	Time      time.Time `json:"time"`
	Level     string    `json:"level"`
	Msg       string    `json:"msg"`
	Component string    `json:"component"`
}

// lines parses the replica's JSON log lines so far (a line still being written is skipped).
func (r *indexReplica) lines() []replicaLogLine {
	var out []replicaLogLine
	sc := bufio.NewScanner(strings.NewReader(r.logs.String()))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var l replicaLogLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// indexerLines are the lines the block indexer logged.
func (r *indexReplica) indexerLines() []replicaLogLine {
	var out []replicaLogLine
	for _, l := range r.lines() {
		if l.Component == "indexer" {
			out = append(out, l)
		}
	}
	return out
}

func (r *indexReplica) ledCount() int {
	n := 0
	for _, l := range r.lines() {
		if l.Msg == replicaLeadingMsg {
			n++
		}
	}
	return n
}

// ledAt is when the replica first logged that it leads.
func (r *indexReplica) ledAt() (time.Time, bool) {
	for _, l := range r.lines() {
		if l.Msg == replicaLeadingMsg {
			return l.Time, true
		}
	}
	return time.Time{}, false
}
