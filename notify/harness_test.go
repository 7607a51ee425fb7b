package notify_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/notify"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// The package's tests share one anvil with real USDC and one database of their own. They run one
// after another: a webhook without a payTo filter hears every settlement in the database.
var env *stacktest.Env

func TestMain(m *testing.M) {
	stacktest.Main(m, "notify", func(e *stacktest.Env) int { env = e; return m.Run() })
}

// rig is a settle engine (one fresh signer, finality 1) and the status service over the shared
// chain and database: what produces settlement events and what messages carry.
type rig struct {
	db     *postgres.DB
	engine *settle.Engine
	status *status.Service
}

func newRig(t *testing.T) *rig {
	t.Helper()
	db := env.OpenDB(t)
	e := env.NewEngine(t, stacktest.EngineOptions{DB: db})
	st := env.Status(db, 1)
	return &rig{db: db, engine: e.Engine, status: st}
}

// dispatcher is a started Dispatcher on db with test-speed polling and backoff; edit changes its
// configuration. It is stopped at cleanup.
func (r *rig) dispatcher(t *testing.T, db *postgres.DB, edit func(*notify.Config)) *notify.Dispatcher {
	t.Helper()
	cfg := notify.Config{
		Store:               db,
		Status:              r.status,
		PollInterval:        50 * time.Millisecond,
		BaseBackoff:         50 * time.Millisecond,
		SendTimeout:         2 * time.Second,
		AllowPrivateTargets: true, // the receivers are on 127.0.0.1
		// Retry tests count every attempt at receivers that fail on purpose: the breaker (which
		// would defer them) is tested on its own (TestDeadEndpointOfOneKeyCannotDelayAnother).
		BreakerFailures: 1 << 20,
		Logger:          stacktest.Logger(t),
	}
	if edit != nil {
		edit(&cfg)
	}
	d := notify.New(cfg)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

// register creates a webhook for rec and disables it at cleanup, so later tests' settlements
// are not sent to a receiver that is gone.
func register(t *testing.T, d *notify.Dispatcher, rec *receiver, payTo ...common.Address) facilitator.Webhook {
	t.Helper()
	ctx := context.Background()
	var addrs []string
	for _, a := range payTo {
		addrs = append(addrs, a.Hex())
	}
	w, err := d.CreateWebhook(ctx, "", rec.srv.URL+"/hooks/x402", addrs)
	if err != nil {
		t.Fatal(err)
	}
	rec.setSecret(w.Secret)
	t.Cleanup(func() {
		if err := d.DisableWebhook(context.Background(), "", w.ID); err != nil {
			t.Errorf("disabling %s: %v", w.ID, err)
		}
	})
	return w
}

// payment is a signed 1 USDC authorization from a fresh funded payer to payTo, with its body.
type payment struct {
	stacktest.Pay
	body []byte
}

func newPayment(t *testing.T, payTo common.Address) payment {
	t.Helper()
	p := env.NewPay(t, env.FundedPayer(t, 1_000_000), 1_000_000)
	p.PayTo = payTo
	return payment{Pay: p, body: p.Body(t)}
}

// waitFinal waits until every settlement of ids has its final event, so that a dispatcher started
// after finds every delivery it will make already owed.
func (r *rig) waitFinal(t *testing.T, ids ...int64) {
	t.Helper()
	eventually(t, "the settlements final", func() bool {
		for _, id := range ids {
			ev, err := r.db.SettlementEvents(context.Background(), id, 0, []string{"final"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(ev) == 0 {
				return false
			}
		}
		return true
	})
}

// settle settles p to success and returns the outcome.
func (r *rig) settle(t *testing.T, p payment) facilitator.SettleOutcome {
	t.Helper()
	pay, err := facilitator.DecodeRequest(p.body)
	if err != nil {
		t.Fatal(err)
	}
	out, err := r.engine.Settle(context.Background(), pay)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Response.Success {
		t.Fatalf("settle: %+v", out.Response)
	}
	return out
}

// receiver is a merchant's webhook endpoint done right: it checks the signature, processes each
// event id once (a retry of an event it has processed is acknowledged, not processed again), and
// answers 500 to the first failFirst requests of each event, after processing them, as a receiver
// whose answer was lost would.
type receiver struct {
	t         *testing.T
	srv       *httptest.Server
	failFirst int

	mu        sync.Mutex
	secret    string
	requests  map[string]int             // every request, by event id
	processed map[string]notify.Message  // the event ids processed, once each
	headers   map[string]http.Header     // the last request's headers, by event id
	bodies    map[string]map[string]bool // every body received, by event id
	badSig    int
	got       chan notify.Message // each processed message
}

func newReceiver(t *testing.T, failFirst int) *receiver {
	rec := &receiver{t: t, failFirst: failFirst, requests: map[string]int{}, processed: map[string]notify.Message{},
		headers: map[string]http.Header{}, bodies: map[string]map[string]bool{}, got: make(chan notify.Message, 1000)}
	rec.srv = httptest.NewServer(http.HandlerFunc(rec.serve))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *receiver) setSecret(s string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.secret = s
}

func (rec *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	id := r.Header.Get(notify.HeaderEventID)
	if r.Method != http.MethodPost || r.URL.Path != "/hooks/x402" || r.Header.Get("Content-Type") != "application/json" {
		rec.t.Errorf("webhook request %s %s, Content-Type %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	// What a merchant does: recompute HMAC-SHA256(secret, timestamp + "." + body).
	mac := hmac.New(sha256.New, []byte(rec.secret))
	mac.Write([]byte(r.Header.Get(notify.HeaderTimestamp) + "."))
	mac.Write(body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(want), []byte(r.Header.Get(notify.HeaderSignature))) {
		rec.badSig++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var msg notify.Message
	if err := json.Unmarshal(body, &msg); err != nil || msg.ID != id {
		rec.t.Errorf("webhook body %s (header event id %s): %v", body, id, err)
	}
	rec.requests[id]++
	rec.headers[id] = r.Header.Clone()
	if rec.bodies[id] == nil {
		rec.bodies[id] = map[string]bool{}
	}
	rec.bodies[id][string(body)] = true
	if _, seen := rec.processed[id]; !seen {
		rec.processed[id] = msg
		rec.got <- msg
	}
	if rec.requests[id] <= rec.failFirst {
		http.Error(w, "try again", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// await returns the messages processed for settlement id once one of each type has been (or
// fails the test after a while).
func (rec *receiver) await(t *testing.T, settlementID int64, types ...string) map[string]notify.Message {
	t.Helper()
	return rec.awaitAll(t, map[int64][]string{settlementID: types})[settlementID]
}

// awaitAll is await for several settlements at once.
func (rec *receiver) awaitAll(t *testing.T, want map[int64][]string) map[int64]map[string]notify.Message {
	t.Helper()
	got := map[int64]map[string]notify.Message{}
	for id := range want {
		got[id] = map[string]notify.Message{}
	}
	deadline := time.After(30 * time.Second)
	for {
		done := true
		for id, types := range want {
			for _, ty := range types {
				if _, ok := got[id][ty]; !ok {
					done = false
				}
			}
		}
		if done {
			return got
		}
		select {
		case m := <-rec.got:
			byType, ok := got[m.SettlementID]
			if !ok {
				continue
			}
			if _, dup := byType[m.Type]; dup {
				t.Fatalf("two events of type %s for settlement %d", m.Type, m.SettlementID)
			}
			byType[m.Type] = m
		case <-deadline:
			t.Fatalf("waited 30s for %v; got %v", want, got)
		}
	}
}

// lastRequest is the headers and the bodies received for an event id.
func (rec *receiver) lastRequest(id string) (http.Header, []string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var bodies []string
	for b := range rec.bodies[id] {
		bodies = append(bodies, b)
	}
	return rec.headers[id], bodies
}

func (rec *receiver) counts() (requests map[string]int, processed int, badSig int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	requests = map[string]int{}
	for k, v := range rec.requests {
		requests[k] = v
	}
	return requests, len(rec.processed), rec.badSig
}

// delivery is a webhook_deliveries row.
type delivery struct {
	attempts          int
	delivered, gaveUp bool
	pending           bool // next_attempt_at set
	lastStatus        *int
	lastError         *string
}

// deliveries reads a webhook's deliveries by event id, straight from the table.
func deliveries(t *testing.T, webhookID string) map[string]delivery {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT event_id, attempts, delivered_at IS NOT NULL, gave_up_at IS NOT NULL,
		next_attempt_at IS NOT NULL, last_status, last_error FROM webhook_deliveries WHERE webhook_id = $1`, webhookID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]delivery{}
	for rows.Next() {
		var id int64
		var d delivery
		if err := rows.Scan(&id, &d.attempts, &d.delivered, &d.gaveUp, &d.pending, &d.lastStatus, &d.lastError); err != nil {
			t.Fatal(err)
		}
		out[strconv.FormatInt(id, 10)] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// eventually polls cond every 20 ms for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
