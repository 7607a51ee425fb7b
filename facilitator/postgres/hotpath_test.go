package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// recorder is a pgx tracer that keeps the first arguments of every distinct statement, so that
// the statements a path really sends can be explained with real arguments.
type recorder struct {
	mu    sync.Mutex
	label string // the store method being called; "" records nothing
	seen  map[string]bool
	stmts []recorded
}

type recorded struct {
	label, sql string
	args       []any
}

// as labels the statements of the calls that follow (the first of each distinct one is kept).
func (r *recorder) as(label string) {
	r.mu.Lock()
	r.label = label
	r.mu.Unlock()
}

func (r *recorder) keep(sql string, args []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.label == "" || r.seen[r.label+"\x00"+sql] {
		return
	}
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	r.seen[r.label+"\x00"+sql] = true
	r.stmts = append(r.stmts, recorded{label: r.label, sql: sql, args: slices.Clone(args)})
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.keep(d.SQL, d.Args)
	return ctx
}
func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *recorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *recorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.keep(d.SQL, d.Args)
}
func (r *recorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// bigTables are the tables that grow with the ledger: a hot statement must never scan one.
var bigTables = []string{"settlements", "settlement_txs", "settlement_events", "payment_ids", "transfers",
	"authorization_events", "webhook_deliveries"}

// planSummary is what one EXPLAIN (ANALYZE, BUFFERS) showed.
type planSummary struct {
	indexes  []string // index scans, by index
	seqScans []string // sequential scans, by table
	buffers  int64    // shared buffers hit + read, the whole statement
	read     int64    // of which read (not in shared buffers)
	ms       float64
}

func summarize(node map[string]any, s *planSummary) {
	switch node["Node Type"] {
	case "Seq Scan":
		s.seqScans = append(s.seqScans, fmt.Sprint(node["Relation Name"]))
	}
	if ix, ok := node["Index Name"].(string); ok && !slices.Contains(s.indexes, ix) {
		s.indexes = append(s.indexes, ix)
	}
	for _, c := range asNodes(node["Plans"]) {
		summarize(c, s)
	}
}

func asNodes(v any) []map[string]any {
	l, _ := v.([]any)
	var out []map[string]any
	for _, x := range l {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of a recorded statement with its arguments inside a
// transaction that is rolled back (after before, if set): writes are measured and undone.
func explain(ctx context.Context, conn *pgx.Conn, st recorded, before string) (planSummary, error) {
	var s planSummary
	tx, err := conn.Begin(ctx)
	if err != nil {
		return s, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if before != "" {
		if _, err := tx.Exec(ctx, before); err != nil {
			return s, err
		}
	}
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+st.sql, st.args...).Scan(&raw); err != nil {
		return s, err
	}
	var out []struct {
		Plan          map[string]any `json:"Plan"`
		ExecutionTime float64        `json:"Execution Time"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		return s, fmt.Errorf("plan %s: %v", raw, err)
	}
	summarize(out[0].Plan, &s)
	hit, _ := out[0].Plan["Shared Hit Blocks"].(float64)
	read, _ := out[0].Plan["Shared Read Blocks"].(float64)
	s.buffers, s.read, s.ms = int64(hit+read), int64(read), out[0].ExecutionTime
	return s, nil
}

// TestHotPathPlans records the statements that settling, looking up and notifying send, through
// the store's own methods, and explains each with the arguments it was sent with on a ledger much
// larger than the path's own rows: none may scan a table that grows with the ledger, and each
// reads a bounded number of buffers. On a fresh database with 20,000 synthetic settlements (CI);
// with PLAN_DATABASE_URL set, on that ledger instead (x402_scale_10m: the table in
// docs/benchmark-history.md, "as the ledger grows"), writing its rows under a network id of its own.
func TestHotPathPlans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	url := os.Getenv("PLAN_DATABASE_URL")
	if url == "" {
		url = freshDB(ctx, t, "hotpath")
	}
	rec := &recorder{}
	db, conn := migratedDB(ctx, t, url, postgres.WithTracer(rec))
	deliveries := 200_000
	if os.Getenv("PLAN_DATABASE_URL") == "" {
		fill := fmt.Sprintf("fill:hotpath:%d", time.Now().UnixNano())
		if err := db.FillSynthetic(ctx, postgres.Fill{Network: fill, Rows: 20_000, Payers: 200, Payees: 20, Chunk: 10_000}); err != nil {
			t.Fatal(err)
		}
		deliveries = 20_000
	}
	// The fill writes no webhook deliveries; a retention's worth of finished ones (of a webhook
	// since disabled) grows that table as a month of a busy merchant's would.
	var old [16]byte
	_, _ = rand.Read(old[:])
	if _, err := conn.Exec(ctx, `
		WITH w AS (INSERT INTO webhooks (id, url, secret, disabled_at, cursor_xid, cursor_event_id) VALUES ($1, 'http://127.0.0.1:1/old', 's', now(), '0', 0) RETURNING id)
		INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, delivered_at, last_status)
		SELECT w.id, e.id, 1, now(), 204 FROM w, (SELECT id FROM settlement_events ORDER BY id DESC LIMIT $2) e`,
		fmt.Sprintf("wh_%x", old), deliveries); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	// The path's own network: its rows are few, as a young network's beside a big ledger are.
	network := fmt.Sprintf("eip155:%d", 1_000_000_000+time.Now().UnixNano()%1_000_000_000)
	if err := db.BindNetwork(ctx, network, 31337, common.HexToHash("0x03")); err != nil {
		t.Fatal(err)
	}
	signer, asset, payer, payTo := randomAddress(), randomAddress(), randomAddress(), randomAddress()
	var nonce [32]byte
	_, _ = rand.Read(nonce[:])
	key := facilitator.AuthorizationKey{Network: network, Asset: asset, Payer: payer, Nonce: nonce}
	tx := txRecord()

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// A webhook, so that enqueue and claim have work.
	var wid [16]byte
	_, _ = rand.Read(wid[:])
	webhook := &facilitator.Webhook{ID: fmt.Sprintf("wh_%x", wid), URL: "http://127.0.0.1:1/hook", Secret: "s"}
	_, err := db.InsertWebhook(ctx, webhook, 100) // not labeled: setup
	must(err)
	// Left disabled, so that no dispatcher sharing the database sends to it.
	t.Cleanup(func() { _ = db.DisableWebhook(context.Background(), "", webhook.ID) })
	// /settle: the lookup by key (nothing yet), the insert, the claim, the outcome writes.
	rec.as("SettlementByKey (new payment)")
	_, err = db.SettlementByKey(ctx, key)
	if err != nil && err != facilitator.ErrNotFound {
		t.Fatal(err)
	}
	rec.as("InsertSettlements")
	ids, err := db.InsertSettlements(ctx, []*facilitator.NewSettlement{{
		Key: key, PayTo: payTo, Value: big.NewInt(1000), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1 << 40),
		X402Version: 2, Request: []byte(`{}`), Signer: signer, TxNonce: 1, Tx: tx,
	}})
	must(err)
	id := ids[0]
	rec.as("MarkBroadcast")
	must(db.MarkBroadcast(ctx, []int64{id}))
	rec.as("Resolve (mined)")
	_, _, err = db.Resolve(ctx, []facilitator.Resolution{{ID: id, State: facilitator.StateMined, TxHash: tx.Hash, BlockNumber: 5, BlockHash: common.HexToHash("0x05")}})
	must(err)
	rec.as("ClaimDelivery")
	_, err = db.ClaimDelivery(ctx, id, "", []byte("claim"), time.Minute)
	must(err)
	rec.as("ConfirmDeliveries")
	_, err = db.ConfirmDeliveries(ctx, []facilitator.Delivery{{ID: id, Claim: []byte("claim")}})
	must(err)
	rec.as("MarkFinal")
	_, err = db.MarkFinal(ctx, []facilitator.MinedIn{{ID: id, BlockHash: common.HexToHash("0x05")}})
	must(err)
	// The watcher's and reconcile's per-tick reads.
	rec.as("OpenSettlements (watcher tick)")
	_, err = db.OpenSettlements(ctx, network, signer)
	must(err)
	rec.as("NoncesHeld (nonce audit)")
	_, err = db.NoncesHeld(ctx, network, signer, 0)
	must(err)
	rec.as("MaxTxNonce (signer start)")
	_, _, err = db.MaxTxNonce(ctx, network, signer)
	must(err)
	rec.as("ClosedFrom (nonce audit)")
	_, err = db.ClosedFrom(ctx, network, signer, 0)
	must(err)
	rec.as("StaleSettlements (reconcile tick)")
	_, err = db.StaleSettlements(ctx, network, time.Now().Add(-time.Minute), 100)
	must(err)
	// Status lookups: by key, by transaction, by payment id, and the index's answer.
	rec.as("SettlementByKey (status by key)")
	_, err = db.SettlementByKey(ctx, key)
	must(err)
	rec.as("SettlementByTx (status by tx)")
	_, err = db.SettlementByTx(ctx, tx.Hash)
	must(err)
	rec.as("PaymentID (status by payment id)")
	if _, err := db.PaymentID(ctx, "", "pay_hotpath_missing"); err != nil && err != facilitator.ErrNotFound {
		t.Fatal(err)
	}
	rec.as("AuthorizationUse (the path's network)")
	if _, err := db.AuthorizationUse(ctx, network, asset, payer, nonce); err != nil && err != facilitator.ErrNotFound {
		t.Fatal(err)
	}
	// Webhook dispatch: enqueue by the xid cursor, claim, record the attempt.
	// Events are enqueued once no older transaction is open on the server (another database's
	// included), so the path's may take a few tries.
	var dels []facilitator.WebhookDelivery
	for deadline := time.Now().Add(time.Minute); len(dels) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no delivery of the path's events to claim after a minute")
		}
		rec.as("EnqueueWebhookEvents")
		_, err = db.EnqueueWebhookEvents(ctx, []string{"broadcast", "mined", "final"}, 500)
		must(err)
		rec.as("ClaimWebhookDeliveries")
		dels, err = db.ClaimWebhookDeliveries(ctx, facilitator.DeliveryClaim{Limit: 16, PerWebhook: 4, PerOwner: 4, Lease: time.Minute})
		must(err)
		time.Sleep(50 * time.Millisecond)
	}
	rec.as("RecordWebhookAttempt")
	must(db.RecordWebhookAttempt(ctx, facilitator.DeliveryAttempt{WebhookID: dels[0].WebhookID, EventID: dels[0].Event.ID, Delivered: true, HTTPStatus: 204}))
	// The index's answer on a network with a long indexed history (the fill's): a payer's known
	// authorization, and one it never used (what a lookup of an unknown payment asks).
	var bigNet string
	var bigToken, bigPayer, bigNonce []byte
	must(conn.QueryRow(ctx, `SELECT network, token, authorizer, nonce FROM authorization_events ORDER BY network DESC, block_number DESC LIMIT 1`).
		Scan(&bigNet, &bigToken, &bigPayer, &bigNonce))
	rec.as("AuthorizationUse (long history, used nonce)")
	_, err = db.AuthorizationUse(ctx, bigNet, common.BytesToAddress(bigToken), common.BytesToAddress(bigPayer), [32]byte(bigNonce))
	must(err)
	rec.as("AuthorizationUse (long history, unused nonce)")
	_, err = db.AuthorizationUse(ctx, bigNet, common.BytesToAddress(bigToken), common.BytesToAddress(bigPayer), nonce)
	must(err)
	rec.as("")

	rec.mu.Lock()
	stmts := slices.Clone(rec.stmts)
	rec.mu.Unlock()
	var table strings.Builder
	table.WriteString("| call | statement | indexes | buffers (read) | ms |\n| --- | --- | --- | --- | --- |\n")
	for _, st := range stmts {
		name := st.label + " | " + strings.ReplaceAll(postgres.StatementName(st.sql), "|", "/")
		var aside string
		if strings.Contains(st.sql, "INSERT INTO settlements") {
			// Explaining runs the insert again: move the path's row (its key, nonce and
			// transaction) aside first, in the same rolled-back transaction.
			aside = fmt.Sprintf(`WITH s AS (UPDATE settlements SET auth_nonce = sha256(auth_nonce), tx_nonce = tx_nonce + 1000000000
				WHERE id = %d RETURNING id) UPDATE settlement_txs t SET tx_hash = sha256(tx_hash) FROM s WHERE t.settlement_id = s.id`, id)
		}
		s, err := explain(ctx, conn, st, aside)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		fmt.Fprintf(&table, "| %s | %s | %d (%d) | %.2f |\n", name, strings.Join(s.indexes, ", "), s.buffers, s.read, s.ms)
		for _, tbl := range s.seqScans {
			if slices.Contains(bigTables, tbl) {
				t.Errorf("%s scans %s sequentially", name, tbl)
			}
		}
		// A bound well above what an index probe reads (a few buffers per index level and row),
		// far below a scan of the filled tables.
		if s.buffers > 500 {
			t.Errorf("%s read %d buffers", name, s.buffers)
		}
	}
	t.Logf("plans (EXPLAIN (ANALYZE, BUFFERS), custom plans, the arguments sent):\n%s", table.String())
}

func randomAddress() common.Address {
	var a common.Address
	_, _ = rand.Read(a[:])
	return a
}
