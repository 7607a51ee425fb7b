package status_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"math/big"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/status"
)

// rowsLister is a ledger of n settlements, ids n down to 1 newest first, made up as they are
// read: the CSV writer's paging and cap are pure logic over whatever a lister answers, so a made
// up one serves (the real keyset queries are tested in facilitator/postgres). row, if set,
// shapes each settlement.
type rowsLister struct {
	n     int64
	row   func(*facilitator.ListedSettlement)
	reads int
}

var listBase = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (l *rowsLister) ListSettlements(_ context.Context, _ facilitator.Viewer, _ facilitator.SettlementFilter, p facilitator.Page) (facilitator.SettlementPage, error) {
	l.reads++
	from := l.n
	if p.After != nil {
		from = p.After.ID - 1
	}
	var out facilitator.SettlementPage
	for id := from; id >= 1 && len(out.Items) < p.Limit; id-- {
		s := facilitator.ListedSettlement{Settlement: facilitator.Settlement{ID: id, Key: facilitator.AuthorizationKey{Network: "eip155:1"},
			PayTo: common.HexToAddress("0xc"), Value: big.NewInt(id), State: facilitator.StateFinal, CreatedAt: listBase.Add(time.Duration(id) * time.Millisecond)}}
		s.UpdatedAt = s.CreatedAt
		if l.row != nil {
			l.row(&s)
		}
		out.Items = append(out.Items, s)
	}
	if last := len(out.Items); last > 0 && out.Items[last-1].ID > 1 {
		out.Next = &facilitator.Cursor{At: out.Items[last-1].CreatedAt, ID: out.Items[last-1].ID}
	}
	return out, nil
}

// TestCSVQuotingAndFormulas: the export is RFC 4180 (CRLF line ends, a field with a comma,
// quote or line break quoted, quotes doubled), and a cell a spreadsheet would run as a formula
// starts with a quote mark instead.
func TestCSVQuotingAndFormulas(t *testing.T) {
	reasons := map[int64]string{
		1: `a,"b"` + "\nc",
		2: "=HYPERLINK(\"http://evil.example\",\"x\")",
		3: "+1",
		4: "-1+2",
		5: "@SUM(A1)",
		6: "\tx",
		7: "plain_reason",
	}
	l := &rowsLister{n: 7, row: func(s *facilitator.ListedSettlement) { s.ErrorReason = reasons[s.ID] }}
	var buf bytes.Buffer
	begun := false
	truncated, err := status.WriteCSV(context.Background(), &buf, l, facilitator.Viewer{All: true}, facilitator.SettlementFilter{}, 100, time.Second, func() { begun = true })
	if err != nil || truncated || !begun {
		t.Fatalf("WriteCSV: %v truncated=%v begun=%v", err, truncated, begun)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "network,asset,payer,payee,amount,nonce,state,reason,transaction,block,created,updated\r\n") {
		t.Fatalf("the header row is not first, CRLF-ended: %q", out)
	}
	// 8 records, and the line break inside a field (which the writer also writes as CRLF).
	if strings.Count(out, "\r\n") != 9 || strings.Count(out, "\n") != 9 {
		t.Errorf("records are not CRLF-ended: %q", out)
	}
	if !strings.Contains(out, `,"a,""b""`+"\r\nc\",") {
		t.Errorf("the comma, quote and line break are not quoted as RFC 4180 says: %q", out)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) != 8 {
		t.Fatalf("the export does not read back: %v, %d records", err, len(recs))
	}
	want := map[string]string{
		"1": reasons[1], "2": "'" + reasons[2], "3": "'+1", "4": "'-1+2", "5": "'@SUM(A1)", "6": "'\tx", "7": "plain_reason",
	}
	for _, rec := range recs[1:] {
		if got := rec[7]; got != want[rec[4]] {
			t.Errorf("row of amount %s: reason cell %q, want %q", rec[4], got, want[rec[4]])
		}
	}
}

// TestCSVCap: an export stops at its cap, across pages of the lister, with every row once and
// truncated reported; a list of exactly the cap is whole; and ServeCSV's cap is MaxCSVRows, said
// in the Truncated trailer.
func TestCSVCap(t *testing.T) {
	count := func(t *testing.T, b []byte) []int64 {
		t.Helper()
		recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
		if err != nil || len(recs) == 0 {
			t.Fatalf("CSV: %v", err)
		}
		var amounts []int64
		for _, rec := range recs[1:] {
			n, _ := strconv.ParseInt(rec[4], 10, 64)
			amounts = append(amounts, n)
		}
		return amounts
	}
	for _, c := range []struct {
		rows, limit int64
		truncated   bool
	}{{1203, 1000, true}, {1000, 1000, false}, {1001, 1000, true}, {7, 5, true}, {5, 5, false}, {0, 5, false}} {
		l := &rowsLister{n: c.rows}
		var buf bytes.Buffer
		truncated, err := status.WriteCSV(context.Background(), &buf, l, facilitator.Viewer{All: true}, facilitator.SettlementFilter{}, int(c.limit), time.Second, func() {})
		if err != nil || truncated != c.truncated {
			t.Errorf("%d rows, cap %d: truncated=%v %v, want %v", c.rows, c.limit, truncated, err, c.truncated)
		}
		got := count(t, buf.Bytes())
		if want := min(c.rows, c.limit); int64(len(got)) != want {
			t.Errorf("%d rows, cap %d: %d rows written, want %d", c.rows, c.limit, len(got), want)
		}
		for i, a := range got {
			if a != c.rows-int64(i) {
				t.Fatalf("%d rows, cap %d: row %d is %d, want %d (newest first, each once)", c.rows, c.limit, i, a, c.rows-int64(i))
			}
		}
	}

	l := &rowsLister{n: status.MaxCSVRows + 1}
	w := httptest.NewRecorder()
	begun, err := status.ServeCSV(context.Background(), w, l, facilitator.Viewer{All: true}, facilitator.SettlementFilter{}, time.Second, listBase)
	if err != nil || !begun {
		t.Fatalf("ServeCSV: %v %v", begun, err)
	}
	res := w.Result()
	if got := len(count(t, w.Body.Bytes())); got != status.MaxCSVRows {
		t.Errorf("ServeCSV wrote %d rows of %d, want the cap %d", got, l.n, status.MaxCSVRows)
	}
	if res.Trailer.Get("Truncated") != "true" && w.Header().Get("Trailer:Truncated") != "true" {
		t.Errorf("no Truncated trailer: header %v trailer %v", w.Header(), res.Trailer)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/csv") || res.Header.Get("Content-Disposition") != `attachment; filename="settlements-20260102T030405Z.csv"` {
		t.Errorf("headers %v", res.Header)
	}
}
