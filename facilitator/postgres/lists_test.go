package postgres_test

import (
	"crypto/rand"
	"errors"
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

// listRow is what a list test wrote: the row and what the filters select it by.
type listRow struct {
	id           int64
	key          string // "" in open mode
	payer, payTo common.Address
	state        facilitator.State
	at           time.Time
}

// listFixture writes settlements on the fixture's network and places them in time and state
// with plain SQL: the lists read what is stored, however it came to be.
type listFixture struct {
	*ledgerFixture
	conn  *pgx.Conn
	nonce uint64
}

func newListFixture(t *testing.T) *listFixture {
	t.Helper()
	l := newLedgerFixture(t, 2*time.Minute)
	conn, err := pgx.Connect(l.ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(l.ctx) })
	return &listFixture{ledgerFixture: l, conn: conn}
}

// add writes one settlement per row, with the row's key, payer and payee, then sets its
// created_at and state; it fills in the rows' ids.
func (l *listFixture) add(t *testing.T, rows []listRow) {
	t.Helper()
	news := make([]*facilitator.NewSettlement, len(rows))
	for i, r := range rows {
		var nonce [32]byte
		rand.Read(nonce[:])
		news[i] = &facilitator.NewSettlement{
			Key:   facilitator.AuthorizationKey{Network: l.network, Asset: common.HexToAddress("0xa"), Payer: r.payer, Nonce: nonce},
			PayTo: r.payTo, Value: big.NewInt(1), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1 << 40),
			X402Version: 2, Request: []byte(`{}`), Signer: l.signer, TxNonce: l.nonce, Tx: txRecord(), KeyID: r.key,
		}
		l.nonce++
	}
	ids, err := l.db.InsertSettlements(l.ctx, news)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		rows[i].id = ids[i]
		if rows[i].state == "" {
			rows[i].state = facilitator.StateSigned
		}
		if _, err := l.conn.Exec(l.ctx, `UPDATE settlements SET created_at = $2, state = $3 WHERE id = $1`,
			ids[i], rows[i].at, string(rows[i].state)); err != nil {
			t.Fatal(err)
		}
	}
}

// all reads every page of a list, pages of limit rows, calling between before each page after
// the first.
func (l *listFixture) all(t *testing.T, v facilitator.Viewer, f facilitator.SettlementFilter, limit int, between func()) []int64 {
	t.Helper()
	var (
		ids   []int64
		after *facilitator.Cursor
	)
	for pages := 0; ; pages++ {
		if pages > 10_000 {
			t.Fatal("the list does not end")
		}
		if pages > 0 && between != nil {
			between()
		}
		p, err := l.db.ListSettlements(l.ctx, v, f, facilitator.Page{Limit: limit, After: after})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Items) > limit {
			t.Fatalf("a page of %d rows for a limit of %d", len(p.Items), limit)
		}
		for _, s := range p.Items {
			ids = append(ids, s.ID)
		}
		if p.Next == nil {
			return ids
		}
		if len(p.Items) != limit {
			t.Fatalf("a short page (%d of %d) with a next cursor", len(p.Items), limit)
		}
		after = p.Next
	}
}

// newestFirst is the lists' order: created_at, then id, both descending.
func newestFirst(rows []listRow) []int64 {
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b listRow) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return int(b.id - a.id)
	})
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

func uniqueKey(name string) string { return fmt.Sprintf("key_%s_%d", name, time.Now().UnixNano()) }

// TestListPagination: small pages over many rows give every row exactly once, newest first,
// including rows of one created_at (the id breaks the tie, so a page may end inside a run of
// equal times), and rows written between page reads, newer than the cursor, neither show up in
// later pages nor push a row out or in twice.
func TestListPagination(t *testing.T) {
	l := newListFixture(t)
	key := uniqueKey("pages")
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var rows []listRow
	for i := range 157 {
		// Runs of five rows share a created_at: every page size below cuts some runs in two.
		rows = append(rows, listRow{key: key, payer: common.HexToAddress("0xb"), payTo: common.HexToAddress("0xc"),
			at: base.Add(time.Duration(i/5) * time.Second)})
	}
	// Ids and times disagree for some rows: the order is created_at's, not insertion's.
	rows[3].at, rows[150].at = base.Add(time.Hour/2), base.Add(-time.Minute)
	l.add(t, rows)
	want := newestFirst(rows)
	f := facilitator.SettlementFilter{Network: l.network}

	for _, limit := range []int{1, 2, 7, 50, 156, 157, 158, 500} {
		for _, v := range []facilitator.Viewer{{Key: key}, {All: true}} {
			if got := l.all(t, v, f, limit, nil); !slices.Equal(got, want) {
				t.Errorf("limit %d, viewer %+v: %d rows %v, want %d %v", limit, v, len(got), got, len(want), want)
			}
		}
	}

	// Writers keep adding rows while a reader pages through. Their rows are newer than the
	// reader's cursor from the first page on, so the reader sees exactly the rows that were there.
	stop := make(chan struct{})
	var (
		wg      sync.WaitGroup
		written []int64
		werr    error
	)
	// The writer starts once the first page is read: a row it wrote before that would be on the
	// first page, rightly, and the reader's view would not be the rows that were there.
	var startWriter sync.Once
	writer := func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			var nonce [32]byte
			rand.Read(nonce[:])
			id, err := l.db.InsertSettlement(l.ctx, &facilitator.NewSettlement{
				Key:   facilitator.AuthorizationKey{Network: l.network, Asset: common.HexToAddress("0xa"), Payer: common.HexToAddress("0xb"), Nonce: nonce},
				PayTo: common.HexToAddress("0xc"), Value: big.NewInt(1), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(1 << 40),
				X402Version: 2, Request: []byte(`{}`), Signer: l.signer, TxNonce: 1_000_000 + uint64(n), Tx: txRecord(), KeyID: key,
			})
			if err != nil {
				werr = err
				return
			}
			written = append(written, id)
		}
	}
	between := func() {
		startWriter.Do(func() { wg.Add(1); go writer() })
		// And at least one row between any two page reads, whatever the scheduler does.
		l.add(t, []listRow{{key: key, payer: common.HexToAddress("0xb"), payTo: common.HexToAddress("0xc"), at: time.Now()}})
	}
	got := l.all(t, facilitator.Viewer{Key: key}, f, 10, between)
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
	if !slices.Equal(got, want) {
		t.Errorf("paging while rows are written: %d rows %v, want %d %v", len(got), got, len(want), want)
	}
	if len(written) == 0 {
		t.Log("the concurrent writer wrote nothing before the reader finished; the rows between pages still count")
	}
	// The new rows are there for a reader starting now, first.
	first, err := l.db.ListSettlements(l.ctx, facilitator.Viewer{Key: key}, f, facilitator.Page{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Items) != 1 || slices.Contains(want, first.Items[0].ID) {
		t.Errorf("the newest row is %+v, not one written during the paging", first.Items)
	}
}

// TestListFilters: each filter selects exactly its rows, alone and together, and a viewer sees
// only what ViewerOf gives it: a merchant key its own rows (never another key's, never open
// mode's), an operator everything, a viewer without a key nothing.
func TestListFilters(t *testing.T) {
	l := newListFixture(t)
	keyA, keyB := uniqueKey("a"), uniqueKey("b")
	payers := []common.Address{common.HexToAddress("0x1001"), common.HexToAddress("0x1002")}
	payees := []common.Address{common.HexToAddress("0x2001"), common.HexToAddress("0x2002")}
	base := time.Now().Add(-24 * time.Hour).Truncate(time.Second)
	var rows []listRow
	for i, st := range slices.Concat(facilitator.LedgerStates, facilitator.LedgerStates, facilitator.LedgerStates) {
		rows = append(rows, listRow{key: []string{keyA, keyB, ""}[i%3], payer: payers[i%2], payTo: payees[(i/2)%2], state: st,
			at: base.Add(time.Duration(i) * time.Minute)})
	}
	l.add(t, rows)

	type check struct {
		name string
		f    facilitator.SettlementFilter
		sel  func(listRow) bool
	}
	states := func(s ...facilitator.State) func(listRow) bool {
		return func(r listRow) bool { return slices.Contains(s, r.state) }
	}
	checks := []check{
		{"everything", facilitator.SettlementFilter{}, func(listRow) bool { return true }},
		{"payee", facilitator.SettlementFilter{PayTo: &payees[1]}, func(r listRow) bool { return r.payTo == payees[1] }},
		{"payer", facilitator.SettlementFilter{Payer: &payers[0]}, func(r listRow) bool { return r.payer == payers[0] }},
		{"since", facilitator.SettlementFilter{Since: rows[5].at}, func(r listRow) bool { return !r.at.Before(rows[5].at) }},
		{"until", facilitator.SettlementFilter{Until: rows[5].at}, func(r listRow) bool { return r.at.Before(rows[5].at) }},
		{"since and until", facilitator.SettlementFilter{Since: rows[3].at, Until: rows[20].at},
			func(r listRow) bool { return !r.at.Before(rows[3].at) && r.at.Before(rows[20].at) }},
		{"payer, payee and state", facilitator.SettlementFilter{Payer: &payers[1], PayTo: &payees[0], States: []facilitator.State{facilitator.StateFinal, facilitator.StateSigned}},
			func(r listRow) bool {
				return r.payer == payers[1] && r.payTo == payees[0] && (r.state == facilitator.StateFinal || r.state == facilitator.StateSigned)
			}},
	}
	for _, st := range facilitator.LedgerStates {
		checks = append(checks, check{"state " + string(st), facilitator.SettlementFilter{States: []facilitator.State{st}}, states(st)})
	}
	for coarse, members := range map[string][]facilitator.State{
		"pending":          {facilitator.StateSigned, facilitator.StateBroadcast},
		"settled":          {facilitator.StateMined, facilitator.StateFinal},
		"failed":           {facilitator.StateReverted, facilitator.StateExpired, facilitator.StateSettledElsewhere, facilitator.StateCanceled},
		"pending,reverted": {facilitator.StateSigned, facilitator.StateBroadcast, facilitator.StateReverted},
	} {
		parsed, ok := facilitator.ParseStates(coarse)
		if !ok {
			t.Fatalf("ParseStates(%q) refused", coarse)
		}
		checks = append(checks, check{"state " + coarse, facilitator.SettlementFilter{States: parsed}, states(members...)})
	}
	viewers := []struct {
		v    facilitator.Viewer
		sees func(listRow) bool
	}{
		{facilitator.Viewer{Key: keyA}, func(r listRow) bool { return r.key == keyA }},
		{facilitator.Viewer{Key: keyB}, func(r listRow) bool { return r.key == keyB }},
		{facilitator.Viewer{All: true}, func(listRow) bool { return true }},
		{facilitator.Viewer{All: true, Key: keyA}, func(listRow) bool { return true }}, // an operator key
		{facilitator.ViewerFrom(l.ctx), func(listRow) bool { return false }},           // no viewer at all
		{facilitator.Viewer{Key: uniqueKey("stranger")}, func(listRow) bool { return false }},
	}
	for _, c := range checks {
		for _, vw := range viewers {
			var selected []listRow
			for _, r := range rows {
				if c.sel(r) && vw.sees(r) {
					selected = append(selected, r)
				}
			}
			f := c.f
			f.Network = l.network
			want := newestFirst(selected)
			if got := l.all(t, vw.v, f, 4, nil); !slices.Equal(got, want) {
				t.Errorf("%s, viewer %+v: %v, want %v", c.name, vw.v, got, want)
			}
		}
	}
	// The network filter: another network's rows are not this one's.
	if got := l.all(t, facilitator.Viewer{All: true}, facilitator.SettlementFilter{Network: l.network + "x"}, 10, nil); len(got) != 0 {
		t.Errorf("a network with no rows lists %v", got)
	}
	// Without the network filter the operator's list holds these rows among every other test's.
	ids := l.all(t, facilitator.Viewer{All: true}, facilitator.SettlementFilter{Since: base, Until: base.Add(time.Hour)}, 500, nil)
	for _, r := range rows {
		if !slices.Contains(ids, r.id) {
			t.Errorf("row %d is missing from the operator's list without a network filter", r.id)
		}
	}
	// And a key's list without one holds its rows only.
	ids = l.all(t, facilitator.Viewer{Key: keyA}, facilitator.SettlementFilter{}, 500, nil)
	var wantA []listRow
	for _, r := range rows {
		if r.key == keyA {
			wantA = append(wantA, r)
		}
	}
	if !slices.Equal(ids, newestFirst(wantA)) {
		t.Errorf("key A without filters: %v, want %v", ids, newestFirst(wantA))
	}
}

// TestWebhookDeliveriesList: a webhook's deliveries are its owner's to read (and an operator's);
// another key, and a viewer without one, get ErrNotFound as for an unknown id; pages of a few
// give every delivery once, newest event first.
func TestWebhookDeliveriesList(t *testing.T) {
	l := newListFixture(t)
	keyA, keyB := uniqueKey("wha"), uniqueKey("whb")
	var hooks []facilitator.Webhook
	for _, owner := range []string{keyA, keyB, ""} {
		var id [16]byte
		rand.Read(id[:])
		w := facilitator.Webhook{ID: fmt.Sprintf("wh_%x", id), URL: "https://merchant.example/hook", Secret: "s", Owner: owner}
		if ok, err := l.db.InsertWebhook(l.ctx, &w, 1000); err != nil || !ok {
			t.Fatalf("InsertWebhook: %v %v", ok, err)
		}
		hooks = append(hooks, w)
	}
	rows := make([]listRow, 23)
	for i := range rows {
		rows[i] = listRow{key: keyA, payer: common.HexToAddress("0xb"), payTo: common.HexToAddress("0xc"), at: time.Now()}
	}
	l.add(t, rows)
	// Each settlement's signed event, delivered to A's webhook; B's and the open one get one each.
	var events []int64
	for _, r := range rows {
		evs, err := l.db.SettlementEvents(l.ctx, r.id, 0, []string{"signed"}, 10)
		if err != nil || len(evs) == 0 {
			t.Fatalf("events of %d: %v %v", r.id, evs, err)
		}
		events = append(events, evs[0].ID)
		if _, err := l.conn.Exec(l.ctx, `INSERT INTO webhook_deliveries (webhook_id, event_id, attempts, last_status) VALUES ($1, $2, 1, 500)`,
			hooks[0].ID, evs[0].ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range hooks[1:] {
		if _, err := l.conn.Exec(l.ctx, `INSERT INTO webhook_deliveries (webhook_id, event_id) VALUES ($1, $2)`, w.ID, events[0]); err != nil {
			t.Fatal(err)
		}
	}
	slices.Reverse(events)

	read := func(v facilitator.Viewer, id string, limit int) ([]int64, error) {
		var (
			out   []int64
			after *facilitator.Cursor
		)
		for {
			p, err := l.db.WebhookDeliveries(l.ctx, v, id, facilitator.Page{Limit: limit, After: after})
			if err != nil {
				return out, err
			}
			if p.Webhook.ID != id {
				t.Fatalf("page of webhook %q for %q", p.Webhook.ID, id)
			}
			for _, d := range p.Items {
				if d.Event.SettlementID == 0 || d.Key.Network != l.network {
					t.Fatalf("a delivery without its settlement: %+v", d)
				}
				out = append(out, d.Event.ID)
			}
			if p.Next == nil {
				return out, nil
			}
			after = p.Next
		}
	}
	for _, v := range []facilitator.Viewer{{Key: keyA}, {All: true}, {All: true, Key: keyB}} {
		for _, limit := range []int{1, 5, 23, 100} {
			got, err := read(v, hooks[0].ID, limit)
			if err != nil || !slices.Equal(got, events) {
				t.Errorf("viewer %+v, limit %d: %v %v, want %v", v, limit, got, err, events)
			}
		}
	}
	first, err := l.db.WebhookDeliveries(l.ctx, facilitator.Viewer{Key: keyA}, hooks[0].ID, facilitator.Page{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d := first.Items[0]; d.Attempts != 1 || d.LastStatus != 500 || d.Event.State != facilitator.StateSigned || first.Webhook.Owner != keyA {
		t.Errorf("delivery %+v of webhook %+v", d, first.Webhook)
	}
	for _, c := range []struct {
		v  facilitator.Viewer
		id string
	}{
		{facilitator.Viewer{Key: keyB}, hooks[0].ID},                     // another key's
		{facilitator.Viewer{Key: keyA}, hooks[2].ID},                     // open mode's
		{facilitator.ViewerFrom(l.ctx), hooks[0].ID},                     // no viewer
		{facilitator.ViewerFrom(l.ctx), hooks[2].ID},                     // no viewer, open mode's: "" is not a key
		{facilitator.Viewer{All: true}, "wh_" + strings.Repeat("0", 32)}, // unknown
	} {
		if got, err := read(c.v, c.id, 10); !errors.Is(err, facilitator.ErrNotFound) || len(got) != 0 {
			t.Errorf("viewer %+v reading %s: %v %v, want ErrNotFound", c.v, c.id, got, err)
		}
	}
	for i, owner := range []string{keyB, ""} {
		v := facilitator.Viewer{Key: owner, All: owner == ""}
		if got, err := read(v, hooks[i+1].ID, 10); err != nil || !slices.Equal(got, events[len(events)-1:]) {
			t.Errorf("owner %q of its webhook: %v %v", owner, got, err)
		}
	}
}

// TestListPlans: on a ledger of realistic shape the merchant's list, a payer's list and the
// operator's list each read migration 0015's index for their order, never a sequential scan of
// settlements. The planner is left to its own costs (no enable_seqscan=off): the table is big
// enough, and the statistics fresh enough, for it to choose the index honestly.
func TestListPlans(t *testing.T) {
	l := newListFixture(t)
	network := fmt.Sprintf("fill:plans:%d", time.Now().UnixNano())
	if err := l.db.FillSynthetic(l.ctx, postgres.Fill{Network: network, Rows: 20_000, Payers: 200, Payees: 20, Chunk: 10_000}); err != nil {
		t.Fatal(err)
	}
	// The fill writes open-mode rows; give them to a handful of merchant keys, as a shared
	// facilitator's would be.
	key := uniqueKey("plans")
	if _, err := l.conn.Exec(l.ctx, `UPDATE settlements SET api_key = $2 || (id % 8) WHERE network = $1`, network, key); err != nil {
		t.Fatal(err)
	}
	if _, err := l.conn.Exec(l.ctx, `ANALYZE settlements, settlement_txs`); err != nil {
		t.Fatal(err)
	}
	var payer []byte
	if err := l.conn.QueryRow(l.ctx, `SELECT payer FROM settlements WHERE network = $1 LIMIT 1`, network).Scan(&payer); err != nil {
		t.Fatal(err)
	}
	p := common.BytesToAddress(payer)
	page := facilitator.Page{Limit: facilitator.DefaultPageLimit}
	cursor := &facilitator.Cursor{At: time.Now().Add(-24 * time.Hour), ID: 1 << 40}
	for _, c := range []struct {
		name, index string
		v           facilitator.Viewer
		f           facilitator.SettlementFilter
		p           facilitator.Page
	}{
		{"merchant", "settlements_api_key_list", facilitator.Viewer{Key: key + "3"}, facilitator.SettlementFilter{}, page},
		{"merchant, next page", "settlements_api_key_list", facilitator.Viewer{Key: key + "3"}, facilitator.SettlementFilter{}, facilitator.Page{Limit: 50, After: cursor}},
		{"payer", "settlements_payer_list", facilitator.Viewer{All: true}, facilitator.SettlementFilter{Payer: &p}, page},
		{"merchant's payer", "", facilitator.Viewer{Key: key + "3"}, facilitator.SettlementFilter{Payer: &p}, page},
		{"all", "settlements_list", facilitator.Viewer{All: true}, facilitator.SettlementFilter{}, page},
		{"all, next page", "settlements_list", facilitator.Viewer{All: true}, facilitator.SettlementFilter{}, facilitator.Page{Limit: 50, After: cursor}},
	} {
		plan, err := l.db.ExplainList(l.ctx, c.v, c.f, c.p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(plan, "Seq Scan on settlements") {
			t.Errorf("%s: a sequential scan of settlements:\n%s", c.name, plan)
		}
		if c.index != "" && !strings.Contains(plan, c.index) {
			t.Errorf("%s: the plan does not use %s:\n%s", c.name, c.index, plan)
		}
		t.Logf("%s:\n%s", c.name, plan)
	}
}
