package settle

import (
	"testing"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// TestResignGas: a batch re-signed with some of its calls gets the limit a new batch of those
// calls gets (signBatch's rule), from its members' own estimates or, for members recovered from
// the ledger, from the old limit's calls taken alike; never more than the old limit.
func TestResignGas(t *testing.T) {
	const e = 96_537
	limit := func(es ...uint64) uint64 { return eip3009.GasLimit(multicall3.NeededGas(es)) }
	oldGas := limit(e, e, e, e)
	oldData := multicall3.Aggregate3Calldata(make([]multicall3.Call, 4))
	member := func(estimate uint64) *flight {
		f := newFlight(1, facilitator.StateSigned)
		f.estimate = estimate
		return f
	}

	if got, want := resignGas([]*flight{member(e)}, oldGas, oldData), limit(e); got != want {
		t.Fatalf("one member with its estimate: %d, want %d", got, want)
	}
	if got, want := resignGas([]*flight{member(e), member(e + 20_000)}, oldGas, oldData), limit(e, e+20_000); got != want {
		t.Fatalf("two members with their estimates: %d, want %d", got, want)
	}
	// Recovered: within a few gas of the alike calls' limit, never above it.
	if got, want := resignGas([]*flight{member(0)}, oldGas, oldData), limit(e); got > want || want-got > 8 {
		t.Fatalf("one recovered member: %d, want %d (at most a few below)", got, want)
	}
	if got := resignGas([]*flight{member(2_000_000)}, oldGas, oldData); got != oldGas {
		t.Fatalf("an estimate past the old batch's: %d, want the old limit %d", got, oldGas)
	}
}
