package settlesim

import (
	"math/rand/v2"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/settle/ledgertest"
)

// TestLedgerContract holds the simulator's ledger to the contract the Postgres ledger is held
// to (facilitator/postgres runs the same suite): what the simulator proves of the engine holds of
// production only while the two ledgers agree.
func TestLedgerContract(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) (ledgertest.Ledger, string) {
			return NewLedger(NewClock(start), LedgerFaults{}, rand.New(rand.NewPCG(5, 6))), network
		},
		Events: func(t *testing.T, l ledgertest.Ledger, id int64) []string {
			r, _ := l.(*Ledger).Row(id)
			var out []string
			for _, e := range r.Events {
				out = append(out, e.State)
			}
			return out
		},
	})
}
