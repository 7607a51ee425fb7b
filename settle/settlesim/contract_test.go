package settlesim

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/settle/ledgertest"
)

// TestLedgerContract holds the simulator's ledger to the contract the Postgres ledger is held
// to (facilitator/postgres runs the same suite): what the simulator proves of the engine holds of
// production only while the two ledgers agree.
func TestLedgerContract(t *testing.T) {
	clocks := map[ledgertest.Ledger]*Clock{}
	leasers := map[ledgertest.Ledger]*Leaser{}
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) (ledgertest.Ledger, string) {
			c := NewClock(start)
			l := NewLedger(c, LedgerFaults{}, rand.New(rand.NewPCG(5, 6)))
			clocks[l] = c
			return l, network
		},
		Events: func(t *testing.T, l ledgertest.Ledger, id int64) []string {
			r, _ := l.(*Ledger).Row(id)
			var out []string
			for _, e := range r.Events {
				out = append(out, e.State)
			}
			return out
		},
		Now:  func(l ledgertest.Ledger) time.Time { return clocks[l].Now() },
		Pass: func(l ledgertest.Ledger, d time.Duration) { clocks[l].Advance(d) },
		Leasers: func(t *testing.T, l ledgertest.Ledger) (a, b settle.Leaser) {
			leasers[l] = NewLeaser(l.(*Ledger), clocks[l])
			return leasers[l].Process("a"), leasers[l].Process("b")
		},
		Cut: func(t *testing.T, l ledgertest.Ledger, network string, signer common.Address) {
			if leasers[l].Cut(network, signer) == "" {
				t.Fatal("Cut: nobody holds the lease")
			}
		},
	})
}

// TestIndexContract holds the simulator's index store to the contract Postgres's index is held to.
func TestIndexContract(t *testing.T) {
	ledgertest.RunIndex(t, ledgertest.IndexHarness{
		New: func(t *testing.T) (ledgertest.Index, string) {
			return NewIndexStore(IndexFaults{}, rand.New(rand.NewPCG(5, 6))), network
		},
	})
}
