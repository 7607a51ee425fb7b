package stacktest

import (
	"context"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Row is the ledger's settlement for k.
func (e *Env) Row(t testing.TB, k facilitator.AuthorizationKey) *facilitator.Settlement {
	t.Helper()
	s, err := e.DB.SettlementByKey(context.Background(), k)
	if err != nil {
		t.Fatalf("SettlementByKey: %v", err)
	}
	return s
}

// Event is one row of settlement_events.
type Event struct {
	State, Detail string
}

// Events is a settlement's events, oldest first.
func (e *Env) Events(t testing.TB, id int64) []Event {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT state, COALESCE(detail, '') FROM settlement_events
		WHERE settlement_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var ev Event
		if err := rows.Scan(&ev.State, &ev.Detail); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// States is the events' states, in order.
func States(es []Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.State
	}
	return out
}
