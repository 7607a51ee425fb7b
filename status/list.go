package status

import (
	"context"
	"encoding/base64"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The settlement lists as the API and the console read them: one parser of their filters, one
// cursor form, one item shape and one CSV writer, so both answer alike.

// SettlementLister reads pages of the ledger's settlements (facilitator/postgres.DB).
type SettlementLister interface {
	ListSettlements(ctx context.Context, v facilitator.Viewer, f facilitator.SettlementFilter, p facilitator.Page) (facilitator.SettlementPage, error)
}

// listParams are the parameters a list takes; anything else is refused, so that a misspelt
// filter is an error instead of a silently wider answer.
var listParams = map[string]bool{"state": true, "payee": true, "payer": true, "network": true, "since": true, "until": true, "limit": true, "cursor": true}

func invalid(format string, args ...any) error {
	return facilitator.Errorf(facilitator.EInvalid, "invalid_parameter", format, args...)
}

// ParseSettlementQuery reads a list's query: state (ledger states or pending, settled, failed;
// repeated or comma-separated), payee, payer, network, since and until (RFC 3339), limit (1 to
// 500, default 50) and cursor (a next_cursor answered before). Empty values are unset, as an
// HTML form sends them.
func ParseSettlementQuery(q url.Values) (facilitator.SettlementFilter, facilitator.Page, error) {
	var (
		f facilitator.SettlementFilter
		p = facilitator.Page{Limit: facilitator.DefaultPageLimit}
	)
	for name := range q {
		if !listParams[name] {
			return f, p, invalid("unknown parameter %q (known: state, payee, payer, network, since, until, limit, cursor)", clip(name))
		}
	}
	for _, s := range q["state"] {
		states, ok := facilitator.ParseStates(s)
		if !ok {
			return f, p, invalid("state must be pending, settled, failed or a ledger state (signed, broadcast, mined, final, reverted, expired, settled_elsewhere, canceled), got %q", clip(s))
		}
		f.States = append(f.States, states...)
	}
	var err error
	if f.PayTo, err = addressParam(q, "payee"); err != nil {
		return f, p, err
	}
	if f.Payer, err = addressParam(q, "payer"); err != nil {
		return f, p, err
	}
	if n := strings.TrimSpace(q.Get("network")); n != "" {
		if _, err := facilitator.ParseCAIP2(n); err != nil {
			return f, p, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network must be eip155:<chain id>, got %q", clip(n))
		}
		f.Network = n
	}
	if f.Since, err = timeParam(q, "since"); err != nil {
		return f, p, err
	}
	if f.Until, err = timeParam(q, "until"); err != nil {
		return f, p, err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, p, invalid("since must be before until")
	}
	if s := strings.TrimSpace(q.Get("limit")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > facilitator.MaxPageLimit {
			return f, p, invalid("limit must be a number from 1 to %d", facilitator.MaxPageLimit)
		}
		p.Limit = n
	}
	if s := strings.TrimSpace(q.Get("cursor")); s != "" {
		c, ok := ParseCursor(s)
		if !ok {
			return f, p, invalid("cursor must be a next_cursor from an earlier answer")
		}
		p.After = &c
	}
	return f, p, nil
}

// ParseCSVQuery reads a CSV export's query: the list's filters, without limit or cursor (an
// export is the whole list, up to MaxCSVRows).
func ParseCSVQuery(q url.Values) (facilitator.SettlementFilter, error) {
	if q.Has("cursor") || q.Has("limit") {
		return facilitator.SettlementFilter{}, invalid("the CSV export takes the list's filters, not limit or cursor")
	}
	f, _, err := ParseSettlementQuery(q)
	return f, err
}

func addressParam(q url.Values, name string) (*common.Address, error) {
	s := strings.TrimSpace(q.Get(name))
	if s == "" {
		return nil, nil
	}
	if !addressForm.MatchString(s) {
		return nil, invalid("%s must be a 0x-prefixed 20-byte hex address", name)
	}
	a := common.HexToAddress(s)
	return &a, nil
}

func timeParam(q url.Values, name string) (time.Time, error) {
	s := strings.TrimSpace(q.Get(name))
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, invalid("%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z, got %q", name, clip(s))
	}
	return t, nil
}

// IsAddress reports whether s is a bare 0x-prefixed 20-byte hex address (a payer search).
func IsAddress(s string) bool { return addressForm.MatchString(s) }

// cursorVersion prefixes the cursor's text, so that its form can change without old cursors
// being misread.
const cursorVersion = "c1."

// CursorText is a cursor's opaque form: the position in microseconds (what Postgres stores) and
// the row id.
func CursorText(c facilitator.Cursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorVersion + strconv.FormatInt(c.At.UnixMicro(), 10) + "." + strconv.FormatInt(c.ID, 10)))
}

// ParseCursor reads CursorText.
func ParseCursor(s string) (facilitator.Cursor, bool) {
	if len(s) > 64 {
		return facilitator.Cursor{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return facilitator.Cursor{}, false
	}
	rest, ok := strings.CutPrefix(string(b), cursorVersion)
	at, id, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return facilitator.Cursor{}, false
	}
	micros, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if err1 != nil || err2 != nil || n < 0 {
		return facilitator.Cursor{}, false
	}
	return facilitator.Cursor{At: time.UnixMicro(micros).UTC(), ID: n}, true
}

// SettlementItem is a listed settlement on the wire (GET /v1/settlements).
type SettlementItem struct {
	Network     string    `json:"network"`
	Asset       string    `json:"asset"`
	Payer       string    `json:"payer"`
	Payee       string    `json:"payee"`
	Amount      string    `json:"amount"` // base units, a decimal string
	Nonce       string    `json:"nonce"`
	State       string    `json:"state"` // the ledger's state
	Reason      string    `json:"reason,omitempty"`
	Transaction string    `json:"transaction,omitempty"`
	BlockNumber uint64    `json:"blockNumber,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	StatusURL   string    `json:"statusUrl"` // the authorization's status route
}

// Item is s as the list answers it.
func Item(s facilitator.ListedSettlement) SettlementItem {
	it := SettlementItem{Network: s.Key.Network, Asset: s.Key.Asset.Hex(), Payer: s.Key.Payer.Hex(), Payee: s.PayTo.Hex(),
		Nonce: hexutil.Encode(s.Key.Nonce[:]), State: string(s.State), Reason: s.ErrorReason, BlockNumber: s.BlockNumber,
		CreatedAt: s.CreatedAt.UTC(), UpdatedAt: s.UpdatedAt.UTC()}
	if s.Value != nil {
		it.Amount = s.Value.String()
	}
	if s.TxHash != (common.Hash{}) {
		it.Transaction = s.TxHash.Hex()
	}
	it.StatusURL = "/v1/authorizations/" + url.PathEscape(it.Network) + "/" + it.Asset + "/" + it.Payer + "/" + it.Nonce
	return it
}

// MaxCSVRows bounds one CSV export: newest first, the rest is had by narrowing until.
const MaxCSVRows = 100_000

// csvPage is how many rows one read of an export takes.
const csvPage = facilitator.MaxPageLimit

var csvHeader = []string{"network", "asset", "payer", "payee", "amount", "nonce", "state", "reason", "transaction", "block", "created", "updated"}

// csvCell keeps a spreadsheet from reading a cell as a formula (CSV injection). The cells are
// hex, numbers, times and the ledger's own words, none of which starts so; the guard costs
// nothing and stays right if a free-text column is ever added.
func csvCell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// WriteCSV writes the settlements v may see under f as RFC 4180 CSV with a header row, newest
// first, reading pages of csvPage rows each within timeout, up to limit rows. begin is called
// once the first page is read, before the first byte: an error before it is the caller's to
// answer, one after it leaves the file unfinished. truncated reports that rows beyond limit
// were left out.
func WriteCSV(ctx context.Context, w io.Writer, l SettlementLister, v facilitator.Viewer, f facilitator.SettlementFilter,
	limit int, timeout time.Duration, begin func()) (truncated bool, err error) {
	cw := csv.NewWriter(w)
	cw.UseCRLF = true // RFC 4180's line end, what spreadsheets expect
	p := facilitator.Page{Limit: min(csvPage, limit)}
	for n, started := 0, false; ; {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		page, err := l.ListSettlements(rctx, v, f, p)
		cancel()
		if err != nil {
			return false, err
		}
		if !started {
			begin()
			started = true
			if err := cw.Write(csvHeader); err != nil {
				return false, err
			}
		}
		for _, s := range page.Items {
			it := Item(s)
			block := ""
			if it.BlockNumber > 0 {
				block = strconv.FormatUint(it.BlockNumber, 10)
			}
			row := []string{it.Network, it.Asset, it.Payer, it.Payee, it.Amount, it.Nonce, it.State, it.Reason, it.Transaction, block,
				it.CreatedAt.Format(time.RFC3339Nano), it.UpdatedAt.Format(time.RFC3339Nano)}
			for i := range row {
				row[i] = csvCell(row[i])
			}
			if err := cw.Write(row); err != nil {
				return false, err
			}
		}
		n += len(page.Items)
		cw.Flush()
		if err := cw.Error(); err != nil {
			return false, err
		}
		if page.Next == nil {
			return false, nil
		}
		if n >= limit {
			return true, nil
		}
		p = facilitator.Page{Limit: min(csvPage, limit-n), After: page.Next}
	}
}

// ServeCSV answers a CSV export (WriteCSV, up to MaxCSVRows rows) as an attachment; a longer
// list ends there with the trailer Truncated: true. begun reports whether anything was written:
// an error before is the caller's to answer, one after means the file is unfinished, and the
// caller must abort the response (panic http.ErrAbortHandler) so that the client sees a broken
// transfer rather than a short file that looks whole.
func ServeCSV(ctx context.Context, w http.ResponseWriter, l SettlementLister, v facilitator.Viewer, f facilitator.SettlementFilter,
	timeout time.Duration, now time.Time) (begun bool, err error) {
	truncated, err := WriteCSV(ctx, w, l, v, f, MaxCSVRows, timeout, func() {
		begun = true
		h := w.Header()
		h.Set("Content-Type", "text/csv; charset=utf-8; header=present")
		h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="settlements-%s.csv"`, now.UTC().Format("20060102T150405Z")))
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
	})
	if err == nil && truncated {
		w.Header().Set(http.TrailerPrefix+"Truncated", "true")
	}
	return begun, err
}
