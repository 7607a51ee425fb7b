package console

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/ops"
)

// Ops is the operations overview the Operations page shows (ops.Overview).
type Ops interface {
	Overview(ctx context.Context) ops.Snapshot
}

// opsPage renders /console/ops: every section as a table, complete without JavaScript; with it,
// static/ops.js draws the charts from overview.json and swaps the sections in place.
func (c *Console) opsPage(w http.ResponseWriter, r *http.Request) {
	if err := operatorOnly(r); err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	s := c.cfg.Ops.Overview(ctx)
	c.render(w, http.StatusOK, "ops", page{Title: "Operations", Nav: "ops", Ops: opsViewOf(s)})
}

// opsJSON is the snapshot the page's script polls: the API's answer, under the console's path
// (and its CSP, and its scope).
func (c *Console) opsJSON(w http.ResponseWriter, r *http.Request) {
	if err := operatorOnly(r); err != nil {
		code := c.cfg.HTTPStatus(err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": facilitator.ErrorReason(err, ""), "message": facilitator.ErrorMessage(err)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	s := c.cfg.Ops.Overview(ctx)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(s); err != nil {
		c.log.Warn("console: writing the overview", "err", err)
	}
}

// operatorOnly is the operator scope check the Operations page and its data make themselves,
// whatever the API's guard decided in front of them: the request's viewer (facilitator.WithViewer)
// must have the operator scope. Without a viewer, nobody has it.
func operatorOnly(r *http.Request) error {
	if facilitator.ViewerFrom(r.Context()).Has(facilitator.ScopeOperator) {
		return nil
	}
	return facilitator.Errorf(facilitator.EForbidden, facilitator.ReasonForbiddenScope, "the API key lacks the %s scope", facilitator.ScopeOperator)
}

// opsView is the snapshot as the template reads it: totals in rows, sorted.
type opsView struct {
	ops.Snapshot
	SettlementStates []countRow
	VerifyReasons    []countRow
	SettleReasons    []countRow
	StatusClasses    []countRow
}

type countRow struct {
	Name  string
	Count int
}

func opsViewOf(s ops.Snapshot) *opsView {
	v := &opsView{Snapshot: s}
	states := map[string]int{}
	for st, series := range s.Settlements.ByState {
		for _, n := range series {
			states[st] += n
		}
	}
	v.SettlementStates = rowsOf(states)
	v.VerifyReasons, v.SettleReasons = rowsOf(s.Answers.VerifyTotal), rowsOf(s.Answers.SettleTotal)
	v.StatusClasses = rowsOf(s.Webhooks.ByStatusClass)
	return v
}

func rowsOf(m map[string]int) []countRow {
	out := make([]countRow, 0, len(m))
	for k, n := range m {
		out = append(out, countRow{k, n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// opsFuncs are the template's formatters for the Operations page.
var opsFuncs = map[string]any{
	"ms": func(v float64) string {
		if v >= 1000 {
			return strings.TrimSuffix(strings.TrimRight(strconv.FormatFloat(v/1000, 'f', 2, 64), "0"), ".") + " s"
		}
		return strings.TrimSuffix(strings.TrimRight(strconv.FormatFloat(v, 'f', 1, 64), "0"), ".") + " ms"
	},
	"changes": func(m map[string]int) string {
		if len(m) == 0 {
			return "nothing"
		}
		var parts []string
		for _, r := range rowsOf(m) {
			parts = append(parts, r.Name+" "+strconv.Itoa(r.Count))
		}
		return strings.Join(parts, ", ")
	},
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return now.Sub(t).Round(time.Second).String() + " ago"
	},
}
